//! Stage 4 for a batch: the walk along greedy, given or sampled posterior tokens.

use crate::accept::{walk, AcceptOut, TreeLinks};
use crate::error::{ensure, Result};
use crate::logits::{Element, Logits3};
use crate::sample::{sample_row, DrawKey, SamplingParams};
use rayon::prelude::*;

/// Every `Acceptance` output of a batch, row-major and contiguous (`[bs, L+1]` and `[bs]`).
pub struct AcceptBuffers<'a> {
    pub accepted_nodes: &'a mut [i64],
    pub accepted_tokens: &'a mut [i64],
    pub accept_index: &'a mut [i64],
    pub accept_len: &'a mut [i64],
    pub bonus: &'a mut [i64],
    /// `[bs]`: [`crate::status`] code of each request's walk.
    pub status: &'a mut [i32],
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
        .zip(out.accept_len.par_iter_mut().zip(out.bonus.par_iter_mut()))
        .zip(out.status.par_iter_mut());
    per_request
        .enumerate()
        .for_each(|(b, ((((nodes, tokens), index), (len, bonus)), status))| {
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
                        let key = DrawKey {
                            seed: *seed,
                            request: b as u64,
                            node: i as u64,
                        };
                        sample_row(target.row(b, i), &params[b], key) as i64
                    },
                    base,
                    row_out,
                ),
            };
            *len = walked.accept_len as i64;
            *bonus = walked.bonus;
            *status = walked.status;
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
    ensure(out.status.len() == bs, "out", || {
        "status must be [bs]".into()
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

/// Checks per-request sampling parameters.
pub(crate) fn check_params(params: &[SamplingParams], bs: usize) -> Result<()> {
    ensure(params.len() == bs, "temperature", || {
        format!("has {} entries, the batch has {bs}", params.len())
    })?;
    for p in params {
        ensure(
            p.temperature.is_finite() && p.temperature >= 0.0,
            "temperature",
            || format!("must be finite and ≥ 0, got {}", p.temperature),
        )?;
        // 1 / temperature scales the logits: it must stay finite (a subnormal does not).
        ensure(
            p.temperature == 0.0 || (1.0 / p.temperature).is_finite(),
            "temperature",
            || format!("{} is too small to divide by", p.temperature),
        )?;
        ensure(p.top_p > 0.0 && p.top_p <= 1.0, "top_p", || {
            format!("must be in (0, 1], got {}", p.top_p)
        })?;
    }
    Ok(())
}
