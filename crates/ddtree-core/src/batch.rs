//! A whole batch through stages 1–4 on the CPU, parallel over rows and requests (rayon).

use crate::accept::{walk, AcceptOut, TreeLinks};
use crate::candidates::candidates;
use crate::emit::{emit, mask_words, RequestTree, VerifyInputs};
use crate::error::{ensure, Result};
use crate::logits::{Element, Logits3};
use crate::sample::{sample_row, uniform, SamplingParams};
use crate::select::{select, RequestCandidates, MAX_DEPTH};
use rayon::prelude::*;

/// `status` value of a request whose tree was built.
pub const STATUS_OK: i32 = 0;
/// `status` value of a request whose draft logits hold NaN or `+inf` (SPEC stage 1).
pub const STATUS_NON_FINITE: i32 = 1;
/// Largest node budget: ranks and node indices are kept in 16 bits.
pub const MAX_BUDGET: usize = 65534;

/// The shapes of one build: `bs` requests, depth limit `L`, vocabulary `V`, budget `B`, `K`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub bs: usize,
    pub depth: usize,
    pub vocab: usize,
    pub budget: usize,
    pub k: usize,
}

impl Shape {
    /// `K = min(B, V, topk)`, with every argument checked.
    pub fn new([bs, depth, vocab]: [usize; 3], budget: usize, topk: Option<usize>) -> Result<Self> {
        ensure(bs >= 1, "draft_logits", || "batch size must be ≥ 1".into())?;
        ensure((1..=MAX_DEPTH).contains(&depth), "draft_logits", || {
            format!("depth L = {depth} must be in 1..={MAX_DEPTH}")
        })?;
        ensure(vocab >= 1, "draft_logits", || {
            "vocabulary must be ≥ 1".into()
        })?;
        ensure((1..=MAX_BUDGET).contains(&budget), "budget", || {
            format!("must be in 1..={MAX_BUDGET}, got {budget}")
        })?;
        ensure(topk.is_none_or(|t| t >= 1), "topk", || {
            format!("must be ≥ 1, got {}", topk.unwrap_or(0))
        })?;
        let k = budget.min(vocab).min(topk.unwrap_or(usize::MAX));
        Ok(Self {
            bs,
            depth,
            vocab,
            budget,
            k,
        })
    }

    /// Verify width `Q = B + 1`.
    pub fn q(&self) -> usize {
        self.budget + 1
    }

    pub fn words(&self) -> usize {
        mask_words(self.q())
    }
}

/// Every `Tree` output of a batch, row-major and contiguous.
pub struct TreeBuffers<'a> {
    pub verify_ids: &'a mut [i64],
    pub positions: &'a mut [i64],
    pub depths: &'a mut [i64],
    pub parents: &'a mut [i64],
    pub first_child: &'a mut [i64],
    pub next_sibling: &'a mut [i64],
    pub ancestor_bits: &'a mut [i32],
    pub scores: &'a mut [f64],
    pub num_nodes: &'a mut [i64],
    pub topk_logprobs: &'a mut [f32],
    pub topk_ids: &'a mut [i64],
    pub status: &'a mut [i32],
}

impl TreeBuffers<'_> {
    fn check(&self, s: &Shape) -> Result<()> {
        let (q, lk) = (s.q(), s.depth * s.k);
        let lens = [
            ("verify_ids", self.verify_ids.len(), s.bs * q),
            ("positions", self.positions.len(), s.bs * q),
            ("depths", self.depths.len(), s.bs * q),
            ("parents", self.parents.len(), s.bs * q),
            ("first_child", self.first_child.len(), s.bs * q),
            ("next_sibling", self.next_sibling.len(), s.bs * q),
            (
                "ancestor_bits",
                self.ancestor_bits.len(),
                s.bs * q * s.words(),
            ),
            ("scores", self.scores.len(), s.bs * q),
            ("num_nodes", self.num_nodes.len(), s.bs),
            ("topk_logprobs", self.topk_logprobs.len(), s.bs * lk),
            ("topk_ids", self.topk_ids.len(), s.bs * lk),
            ("status", self.status.len(), s.bs),
        ];
        for (name, got, want) in lens {
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
            format!("token {t} is outside the vocabulary 0..{}", s.vocab),
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
    let (q, w, lk) = (s.q(), s.words(), s.depth * s.k);
    let mut verify_ids = out.verify_ids.chunks_mut(q);
    let mut positions = out.positions.chunks_mut(q);
    let mut depths = out.depths.chunks_mut(q);
    let mut parents = out.parents.chunks_mut(q);
    let mut first_child = out.first_child.chunks_mut(q);
    let mut next_sibling = out.next_sibling.chunks_mut(q);
    let mut bits = out.ancestor_bits.chunks_mut(q * w);
    let mut scores = out.scores.chunks_mut(q);
    let mut lps = out.topk_logprobs.chunks_mut(lk);
    let mut tis = out.topk_ids.chunks_mut(lk);
    let mut nums = out.num_nodes.iter_mut();
    let mut statuses = out.status.iter_mut();
    (0..s.bs)
        .map(|_| RequestOut {
            verify: VerifyInputs {
                verify_ids: verify_ids.next().unwrap(),
                positions: positions.next().unwrap(),
                depths: depths.next().unwrap(),
                parents: parents.next().unwrap(),
                first_child: first_child.next().unwrap(),
                next_sibling: next_sibling.next().unwrap(),
                ancestor_bits: bits.next().unwrap(),
                scores: scores.next().unwrap(),
            },
            num_nodes: nums.next().unwrap(),
            status: statuses.next().unwrap(),
            topk_logprobs: lps.next().unwrap(),
            topk_ids: tis.next().unwrap(),
        })
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

/// Every `Acceptance` output of a batch, row-major and contiguous (`[bs, L+1]` and `[bs]`).
pub struct AcceptBuffers<'a> {
    pub accepted_nodes: &'a mut [i64],
    pub accepted_tokens: &'a mut [i64],
    pub accept_index: &'a mut [i64],
    pub accept_len: &'a mut [i64],
    pub bonus: &'a mut [i64],
}

/// The tree side of an accept: the `[bs, Q]` link tensors of a built tree.
#[derive(Clone, Copy)]
pub struct BatchLinks<'a> {
    pub verify_ids: &'a [i64],
    pub first_child: &'a [i64],
    pub next_sibling: &'a [i64],
    pub q: usize,
}

impl<'a> BatchLinks<'a> {
    fn request(&self, b: usize) -> TreeLinks<'a> {
        let r = b * self.q..(b + 1) * self.q;
        TreeLinks {
            verify_ids: &self.verify_ids[r.clone()],
            first_child: &self.first_child[r.clone()],
            next_sibling: &self.next_sibling[r],
        }
    }
}

/// Where the posterior token of a visited node comes from.
pub enum Posterior<'a, T> {
    /// Greedy: argmax of the target logits `[bs, Q, V]`, computed only at visited nodes.
    Greedy(Logits3<'a, T>),
    /// Posterior tokens computed beforehand, `[bs, Q]` (e.g. by the target's own sampler).
    Tokens(&'a [i64]),
    /// A draw from the filtered target distribution at each visited node, per-request
    /// parameters (`temperature == 0` is greedy), random numbers keyed by `seed`.
    Sampled {
        target: Logits3<'a, T>,
        params: &'a [SamplingParams],
        seed: u64,
    },
}

/// SPEC stage 4 for a batch.
pub fn accept_tree<T: Element>(
    links: BatchLinks<'_>,
    posterior: Posterior<'_, T>,
    out: AcceptBuffers<'_>,
) -> Result<()> {
    let width = check_accept(&links, &posterior, &out)?;
    let per_request = out
        .accepted_nodes
        .par_chunks_mut(width)
        .zip(out.accepted_tokens.par_chunks_mut(width))
        .zip(out.accept_index.par_chunks_mut(width))
        .zip(out.accept_len.par_iter_mut().zip(out.bonus.par_iter_mut()));
    per_request
        .enumerate()
        .for_each(|(b, (((nodes, tokens), index), (len, bonus)))| {
            let row_out = AcceptOut {
                accepted_nodes: nodes,
                accepted_tokens: tokens,
                accept_index: index,
            };
            let base = (b * links.q) as i64;
            let walked = match &posterior {
                Posterior::Greedy(t) => walk(
                    links.request(b),
                    |i| t.row(b, i).argmax() as i64,
                    base,
                    row_out,
                ),
                Posterior::Tokens(t) => {
                    walk(links.request(b), |i| t[b * links.q + i], base, row_out)
                }
                Posterior::Sampled {
                    target,
                    params,
                    seed,
                } => walk(
                    links.request(b),
                    |i| {
                        let u = uniform(*seed, b as u64, i as u64);
                        sample_row(target.row(b, i), &params[b], u) as i64
                    },
                    base,
                    row_out,
                ),
            };
            *len = walked.accept_len as i64;
            *bonus = walked.bonus;
        });
    Ok(())
}

/// Checks an accept's shapes; returns the path width `L + 1`.
fn check_accept<T: Element>(
    links: &BatchLinks<'_>,
    posterior: &Posterior<'_, T>,
    out: &AcceptBuffers<'_>,
) -> Result<usize> {
    let bs = out.accept_len.len();
    ensure(bs >= 1 && links.q >= 1, "tree", || "empty batch".into())?;
    ensure(links.verify_ids.len() == bs * links.q, "tree", || {
        format!(
            "verify_ids holds {} elements, expected {bs} x {}",
            links.verify_ids.len(),
            links.q
        )
    })?;
    let width = out.accepted_nodes.len() / bs;
    ensure(
        width >= 1 && out.accepted_nodes.len() == bs * width,
        "out",
        || "accepted_nodes must be [bs, L+1]".into(),
    )?;
    match posterior {
        Posterior::Greedy(t) | Posterior::Sampled { target: t, .. } => {
            let [tb, tq, _] = t.shape();
            ensure(tb == bs && tq == links.q, "target_logits", || {
                format!("shape must be [{bs}, {}, V], got {:?}", links.q, t.shape())
            })?;
        }
        Posterior::Tokens(t) => ensure(t.len() == bs * links.q, "posterior_tokens", || {
            format!("must hold bs x Q = {} tokens", bs * links.q)
        })?,
    }
    if let Posterior::Sampled { params, .. } = posterior {
        check_params(params, bs)?;
    }
    Ok(width)
}

/// SGLang's flat FULL mask for a batch: request b's `[Q, P_b + Q]` block follows request
/// b-1's; prefix columns are written only when `write_prefix`. Returns the mask's length
/// (the rest of `out` is left untouched).
pub fn full_masks(
    ancestor_bits: &[i32],
    q: usize,
    prefix_lens: &[i64],
    write_prefix: bool,
    out: &mut [bool],
) -> Result<usize> {
    let words = mask_words(q);
    let bs = prefix_lens.len();
    ensure(ancestor_bits.len() == bs * q * words, "seq_lens", || {
        format!(
            "has {bs} entries, the tree has {} requests",
            ancestor_bits.len() / (q * words).max(1)
        )
    })?;
    ensure(prefix_lens.iter().all(|&p| p >= 0), "seq_lens", || {
        "must be ≥ 0".into()
    })?;
    let total: usize = prefix_lens.iter().map(|&p| q * (p as usize + q)).sum();
    ensure(out.len() >= total, "out", || {
        format!("holds {} elements, the mask needs {total}", out.len())
    })?;
    let mut blocks = Vec::with_capacity(bs);
    let mut rest = &mut out[..total];
    for &p in prefix_lens {
        let (block, tail) = rest.split_at_mut(q * (p as usize + q));
        blocks.push((p as usize, block));
        rest = tail;
    }
    blocks
        .into_par_iter()
        .enumerate()
        .for_each(|(b, (p, block))| {
            let bits = &ancestor_bits[b * q * words..(b + 1) * q * words];
            crate::emit::full_mask(bits, q, p, write_prefix, block);
        });
    Ok(total)
}

/// Checks per-request sampling parameters.
fn check_params(params: &[SamplingParams], bs: usize) -> Result<()> {
    ensure(params.len() == bs, "temperature", || {
        format!("has {} entries, the batch has {bs}", params.len())
    })?;
    for p in params {
        ensure(
            p.temperature.is_finite() && p.temperature >= 0.0,
            "temperature",
            || format!("must be finite and ≥ 0, got {}", p.temperature),
        )?;
        ensure(p.top_p > 0.0 && p.top_p <= 1.0, "top_p", || {
            format!("must be in (0, 1], got {}", p.top_p)
        })?;
    }
    Ok(())
}
