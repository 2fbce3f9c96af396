//! SPEC stage 4, sampling: one draw from the target's filtered distribution at a node.
//!
//! Filters run in SGLang's order: `softmax(logits / temperature)`, keep the `top_k` most
//! probable tokens (ties by lower id), then the smallest most-probable prefix of those whose
//! renormalised mass reaches `top_p`, renormalise, draw. Random numbers come from a
//! counter-based hash of `(seed, request, node)`, so a draw depends only on its coordinates:
//! results are reproducible for a seed, and independent of thread scheduling.

use crate::logits::{Element, Row};

/// Per-request sampling parameters (`temperature == 0` means greedy).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    pub temperature: f64,
    /// Keep at most this many tokens; 0 means no cap.
    pub top_k: usize,
    /// Keep the smallest prefix whose mass reaches this; 1.0 means no cut.
    pub top_p: f64,
}

/// SplitMix64's finaliser: a bijective mix with full avalanche.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A uniform draw in `[0, 1)` for coordinates `(seed, request, node)`.
pub fn uniform(seed: u64, request: u64, node: u64) -> f64 {
    let h = mix(mix(mix(seed ^ 0x9e37_79b9_7f4a_7c15) ^ request) ^ node.wrapping_add(1));
    (h >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// One token from the filtered distribution of `row`, using the uniform draw `u`.
pub fn sample_row<T: Element>(row: Row<'_, T>, p: &SamplingParams, u: f64) -> usize {
    if p.temperature <= 0.0 {
        return row.argmax();
    }
    let inv_t = 1.0 / p.temperature;
    let mut scaled = Vec::with_capacity(row.len());
    let mut max = f64::NEG_INFINITY;
    row.for_each(|id, x| {
        if x > f32::NEG_INFINITY {
            let s = x as f64 * inv_t;
            max = max.max(s);
            scaled.push((s, id));
        }
    });
    if scaled.is_empty() {
        return row.argmax();
    }
    // Unnormalised probabilities; softmax's denominator cancels in every filter below.
    let mut weights: Vec<(f64, usize)> = scaled
        .into_iter()
        .map(|(s, id)| ((s - max).exp(), id))
        .collect();
    let kept = filter_top_k_top_p(&mut weights, p);
    draw(&weights[..kept], u)
}

/// Orders the most probable first where a filter needs it and returns how many survive.
fn filter_top_k_top_p(weights: &mut [(f64, usize)], p: &SamplingParams) -> usize {
    let by_rank = |a: &(f64, usize), b: &(f64, usize)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
    let mut kept = weights.len();
    if p.top_k > 0 && p.top_k < kept {
        weights.select_nth_unstable_by(p.top_k - 1, by_rank);
        kept = p.top_k;
    }
    if p.top_p < 1.0 {
        let head = &mut weights[..kept];
        head.sort_unstable_by(by_rank);
        let total: f64 = head.iter().map(|w| w.0).sum();
        let target = p.top_p * total;
        let mut mass = 0.0;
        let mut n = 0;
        // Smallest prefix whose mass reaches top_p: take a token while the mass before it
        // is still short of the target.
        while n < head.len() && mass < target {
            mass += head[n].0;
            n += 1;
        }
        kept = n.max(1);
    }
    kept
}

/// Inverse-CDF draw over `weights` (any order; the distribution does not depend on it).
fn draw(weights: &[(f64, usize)], u: f64) -> usize {
    let total: f64 = weights.iter().map(|w| w.0).sum();
    let target = u * total;
    let mut acc = 0.0;
    for &(w, id) in weights {
        acc += w;
        if acc > target {
            return id;
        }
    }
    // Rounding left the target at the very top: the last token with weight takes it.
    weights
        .iter()
        .rev()
        .find(|w| w.0 > 0.0)
        .map_or(weights[0].1, |w| w.1)
}
