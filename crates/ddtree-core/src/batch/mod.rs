//! A whole batch through SPEC stages 1–4 on the CPU, parallel over rows and requests (rayon):
//! `build` (stages 1–3), `accept` (stage 4), `mask` (SGLang's FULL mask) and `shard` (stage 1
//! over vocabulary shards).

mod accept;
mod build;
mod fields;
mod mask;
mod shard;

pub use accept::{accept_tree, AcceptBuffers, BatchLinks, Posterior};
pub use build::{build_from_candidates, build_tree, TreeBuffers};
pub use fields::{acceptance_fields, tree_fields, Elem, Field};
pub use mask::full_masks;
pub use shard::{merge_partials, shard_partials, shard_posteriors, shard_sums, Partials};

use crate::emit::mask_words;
use crate::error::{ensure, Result};
use crate::select::MAX_DEPTH;

pub use crate::status::{NON_FINITE as STATUS_NON_FINITE, OK as STATUS_OK};
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
