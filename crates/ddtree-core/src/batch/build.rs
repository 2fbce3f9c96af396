//! Stages 1–3 for a batch: draft logits → every verify input.

use super::Shape;
use super::STATUS_NON_FINITE;
use super::STATUS_OK;
use crate::candidates::candidates;
use crate::emit::{emit, RequestTree, VerifyInputs};
use crate::error::{ensure, Result};
use crate::logits::{Element, Logits3};
use crate::select::{select, RequestCandidates};
use rayon::prelude::*;

/// Every `Tree` output of a batch, row-major and contiguous.
pub struct TreeBuffers<'a> {
    /// SPEC stage 3's outputs, `[bs, Q]` (ancestor bits `[bs, Q, W]`).
    pub verify: VerifyInputs<'a>,
    pub num_nodes: &'a mut [i64],
    pub topk_logprobs: &'a mut [f32],
    pub topk_ids: &'a mut [i64],
    pub status: &'a mut [i32],
}

impl TreeBuffers<'_> {
    fn check(&self, s: &Shape) -> Result<()> {
        let lk = s.depth * s.k;
        let rest = [
            ("num_nodes", self.num_nodes.len(), s.bs),
            ("topk_logprobs", self.topk_logprobs.len(), s.bs * lk),
            ("topk_ids", self.topk_ids.len(), s.bs * lk),
            ("status", self.status.len(), s.bs),
        ];
        for (name, got, want) in self.verify.lens(s.bs, s.q()).into_iter().chain(rest) {
            ensure(got == want, "out", || {
                format!("{name} holds {got} elements, the shape needs {want}")
            })?;
        }
        Ok(())
    }
}

/// Checks the per-request inputs of a build.
fn check_requests(s: &Shape, root_tokens: &[i64], prefix_lens: &[i64]) -> Result<()> {
    ensure(root_tokens.len() == s.bs, "root_tokens", || {
        format!(
            "has {} entries, draft_logits has {} requests",
            root_tokens.len(),
            s.bs
        )
    })?;
    ensure(prefix_lens.len() == s.bs, "prefix_lens", || {
        format!(
            "has {} entries, draft_logits has {} requests",
            prefix_lens.len(),
            s.bs
        )
    })?;
    if let Some(t) = root_tokens
        .iter()
        .find(|&&t| t < 0 || t as usize >= s.vocab)
    {
        return Err(crate::ArgError::new(
            "root_tokens",
            format!(
                "token {t} is outside the vocabulary 0..{}",
                s.vocab.saturating_sub(1)
            ),
        ));
    }
    if let Some(p) = prefix_lens.iter().find(|&&p| p < 0) {
        return Err(crate::ArgError::new(
            "prefix_lens",
            format!("must be ≥ 0, got {p}"),
        ));
    }
    Ok(())
}

/// SPEC stages 1–3 for a batch: draft logits → every verify input.
pub fn build_tree<T: Element>(
    logits: Logits3<'_, T>,
    root_tokens: &[i64],
    prefix_lens: &[i64],
    budget: usize,
    topk: Option<usize>,
    out: TreeBuffers<'_>,
) -> Result<Shape> {
    let s = Shape::new(logits.shape(), budget, topk)?;
    out.check(&s)?;
    check_requests(&s, root_tokens, prefix_lens)?;
    let rows = stage_candidates(logits, &s, out.topk_logprobs, out.topk_ids);
    select_and_emit(&s, &rows, root_tokens, prefix_lens, out);
    Ok(s)
}

/// SPEC stages 2–3 from stage-1 results already in `out.topk_logprobs` / `out.topk_ids`:
/// `eligible[b * L + d]` finite ranks of each row, `None` for a rejected row.
pub fn build_from_candidates(
    s: &Shape,
    eligible: &[Option<usize>],
    root_tokens: &[i64],
    prefix_lens: &[i64],
    out: TreeBuffers<'_>,
) -> Result<()> {
    out.check(s)?;
    check_requests(s, root_tokens, prefix_lens)?;
    ensure(eligible.len() == s.bs * s.depth, "eligible", || {
        format!(
            "has {} rows, the shape needs {}",
            eligible.len(),
            s.bs * s.depth
        )
    })?;
    select_and_emit(s, eligible, root_tokens, prefix_lens, out);
    Ok(())
}

/// Stages 2–3 of every request in parallel.
fn select_and_emit(
    s: &Shape,
    rows: &[Option<usize>],
    root_tokens: &[i64],
    prefix_lens: &[i64],
    out: TreeBuffers<'_>,
) {
    split_requests(out, s)
        .into_par_iter()
        .enumerate()
        .for_each(|(b, mut req)| {
            let row_results = &rows[b * s.depth..(b + 1) * s.depth];
            build_request(s, row_results, root_tokens[b], prefix_lens[b], &mut req);
        });
}

/// Stage 1 for every (request, depth) row in parallel: each row's eligible count, or
/// `None` where the row holds NaN / `+inf`.
fn stage_candidates<T: Element>(
    logits: Logits3<'_, T>,
    s: &Shape,
    lp: &mut [f32],
    ti: &mut [i64],
) -> Vec<Option<usize>> {
    lp.par_chunks_mut(s.k)
        .zip(ti.par_chunks_mut(s.k))
        .enumerate()
        .map(|(row, (lp, ti))| {
            candidates(logits.row(row / s.depth, row % s.depth), lp, ti)
                .ok()
                .map(|c| c.eligible)
        })
        .collect()
}

/// One request's slices of the batch outputs.
struct RequestOut<'a> {
    verify: VerifyInputs<'a>,
    num_nodes: &'a mut i64,
    status: &'a mut i32,
    topk_logprobs: &'a mut [f32],
    topk_ids: &'a mut [i64],
}

fn split_requests<'a>(out: TreeBuffers<'a>, s: &Shape) -> Vec<RequestOut<'a>> {
    let lk = s.depth * s.k;
    let per_request = out
        .verify
        .split(s.q())
        .into_iter()
        .zip(out.topk_logprobs.chunks_mut(lk))
        .zip(out.topk_ids.chunks_mut(lk))
        .zip(out.num_nodes.iter_mut().zip(out.status.iter_mut()));
    per_request
        .map(
            |(((verify, topk_logprobs), topk_ids), (num_nodes, status))| RequestOut {
                verify,
                num_nodes,
                status,
                topk_logprobs,
                topk_ids,
            },
        )
        .collect()
}

/// Stages 2–3 of one request, or its empty tree if stage 1 rejected a row.
fn build_request(
    s: &Shape,
    rows: &[Option<usize>],
    root_token: i64,
    prefix_len: i64,
    out: &mut RequestOut<'_>,
) {
    let eligible: Option<Vec<usize>> = rows.iter().copied().collect();
    let nodes = match &eligible {
        Some(eligible) => {
            *out.status = STATUS_OK;
            let cands = RequestCandidates {
                lp: out.topk_logprobs,
                eligible,
                k: s.k,
            };
            select(cands, s.budget)
        }
        None => {
            // Rejected: the root alone still verifies losslessly; hide the partial stage 1.
            *out.status = STATUS_NON_FINITE;
            out.topk_logprobs.fill(f32::NEG_INFINITY);
            out.topk_ids.fill(-1);
            Vec::new()
        }
    };
    *out.num_nodes = nodes.len() as i64;
    let tree = RequestTree {
        nodes: &nodes,
        ti: out.topk_ids,
        k: s.k,
        root_token,
        prefix_len,
    };
    emit(&tree, &mut out.verify);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_root_outside_the_vocabulary_is_named_with_the_last_id() {
        let s = Shape::new([2, 3, 100], 8, None).unwrap();
        for bad in [100, 200, -1] {
            let err = check_requests(&s, &[5, bad], &[0, 0]).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!("root_tokens: token {bad} is outside the vocabulary 0..99")
            );
        }
        assert!(check_requests(&s, &[0, 99], &[0, 0]).is_ok());
    }
}
