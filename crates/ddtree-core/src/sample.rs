//! SPEC stage 4, sampling: one draw from the target's filtered distribution at a node.
//!
//! Filters run in SGLang's order: `softmax(logits / temperature)`, keep the `top_k` most
//! probable tokens (ties by lower id), then the smallest most-probable prefix of those whose
//! renormalised mass reaches `top_p`, renormalise, draw. The draw is Gumbel-max: the kept
//! token with the largest `x / temperature + g`, where `g` is Gumbel noise from a
//! counter-based hash of `(seed, request, node, token id)`. So a draw depends only on its
//! coordinates (reproducible for a seed, independent of thread scheduling), and a token's
//! chance does not depend on where the vocabulary is split: ranks holding shards of a row
//! find their own best and the best of those is the whole row's draw (`shard_posterior`).

use crate::logits::{Element, Row};

/// The coordinates of one draw: a node of a request, under a seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrawKey {
    pub seed: u64,
    pub request: u64,
    pub node: u64,
}

/// Per-request sampling parameters (`temperature == 0` means greedy; a positive one must
/// have a finite inverse).
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

/// A bound on what [`gumbel`] can return: `u ≤ 1 − 2^-53` gives `−ln(−ln u) ≤ 53 ln 2 ≈
/// 36.74`. A token more than this below the best value so far cannot win, so its noise is
/// never computed.
const GUMBEL_MAX: f64 = 37.5;

/// Gumbel(0, 1) noise of token `id` at `key`: `−ln(−ln u)`, `u = (n + 0.5) / 2^52` for 52
/// bits `n` of the hash — exact in float64, so never 0 or 1 and the noise is finite.
pub fn gumbel(key: DrawKey, id: u64) -> f64 {
    let h = mix(mix(
        mix(mix(key.seed ^ 0x9e37_79b9_7f4a_7c15) ^ key.request) ^ key.node.wrapping_add(1)
    ) ^ id.wrapping_add(1));
    let u = ((h >> 12) as f64 + 0.5) * (1.0 / (1u64 << 52) as f64);
    -(-u.ln()).ln()
}

/// One token from the filtered distribution of `row`, drawn at `key`.
pub fn sample_row<T: Element>(row: Row<'_, T>, p: &SamplingParams, key: DrawKey) -> usize {
    if p.temperature <= 0.0 {
        return row.argmax();
    }
    let scaled = scaled_finite(row, p.temperature, 0);
    if scaled.is_empty() {
        return row.argmax();
    }
    if p.top_k == 0 && p.top_p >= 1.0 {
        // Nothing filtered: every finite token competes.
        return gumbel_max(scaled.iter().copied(), key).map_or(0, |(_, id)| id);
    }
    // Unnormalised probabilities; softmax's denominator cancels in every filter below.
    let max = scaled.iter().fold(f64::NEG_INFINITY, |m, &(s, _)| m.max(s));
    let mut weights: Vec<(f64, usize)> = scaled
        .iter()
        .map(|&(s, id)| ((s - max).exp(), id))
        .collect();
    let kept = filter_top_k_top_p(&mut weights, p);
    // The scaled values of the kept tokens, back from the weights' ids (scaled is id-ordered
    // over the finite tokens only, so look each up by binary search).
    let kept_scaled = weights[..kept].iter().map(|&(_, id)| {
        let at = scaled.partition_point(|&(_, i)| i < id);
        (scaled[at].0, id)
    });
    gumbel_max(kept_scaled, key).map_or(0, |(_, id)| id)
}

/// The candidate with the largest `s + gumbel(key, id)` (ties to the lower id), as (that
/// value, id); `None` for no candidate.
pub fn gumbel_max(
    cands: impl Iterator<Item = (f64, usize)> + Clone,
    key: DrawKey,
) -> Option<(f64, usize)> {
    // Start from a token with the largest s, so the bound below prunes from the first step.
    let (s0, id0) = cands.clone().reduce(|a, b| if b.0 > a.0 { b } else { a })?;
    let mut best = (s0 + gumbel(key, id0 as u64), id0);
    for (s, id) in cands {
        if s + GUMBEL_MAX < best.0 || id == id0 {
            continue;
        }
        let v = s + gumbel(key, id as u64);
        if v > best.0 || (v == best.0 && id < best.1) {
            best = (v, id);
        }
    }
    Some(best)
}

/// A shard's part of a node's posterior: the shard `row` holds global ids `start..`; returns
/// (value, global id) of its best token — for a greedy request (temperature 0) its first
/// maximum (NaN counting as `−inf`), for a sampled one its Gumbel-max winner — or
/// `(−inf, −1)` if it has none. The best over the shards (value, then the lower id) is the
/// single-process posterior; where every shard answers `−1`, that posterior is token 0.
/// Only for requests without `top_k` / `top_p` (those filters need the whole row).
pub fn shard_posterior<T: Element>(
    row: Row<'_, T>,
    start: usize,
    p: &SamplingParams,
    key: DrawKey,
) -> (f64, i64) {
    let mut best = (f64::NEG_INFINITY, -1i64);
    if p.temperature <= 0.0 {
        row.for_each(|id, x| {
            if x as f64 > best.0 {
                best = (x as f64, (start + id) as i64);
            }
        });
        return best;
    }
    let scaled = scaled_finite(row, p.temperature, start);
    gumbel_max(scaled.iter().copied(), key).map_or(best, |(v, id)| (v, id as i64))
}

/// `(x / temperature, start + id)` of the row's tokens above `−inf` (NaN skipped), in id
/// order: the values a draw compares, the same for a whole row and for a shard of it.
fn scaled_finite<T: Element>(row: Row<'_, T>, temperature: f64, start: usize) -> Vec<(f64, usize)> {
    let inv_t = 1.0 / temperature;
    let mut scaled = Vec::with_capacity(row.len());
    row.for_each(|id, x| {
        if x > f32::NEG_INFINITY {
            scaled.push((x as f64 * inv_t, start + id));
        }
    });
    scaled
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::split::{bounds, row_of};

    /// The best of the shards' posteriors (value, then lower id; none: token 0).
    fn over_shards(data: &[f32], cuts: &[usize], p: &SamplingParams, key: DrawKey) -> usize {
        let mut best = (f64::NEG_INFINITY, -1i64);
        for w in bounds(cuts, data.len()).windows(2) {
            let (v, id) = shard_posterior(row_of(&data[w[0]..w[1]]).row(0, 0), w[0], p, key);
            if id >= 0 && (best.1 < 0 || v > best.0 || (v == best.0 && id < best.1)) {
                best = (v, id);
            }
        }
        best.1.max(0) as usize
    }

    #[test]
    fn the_best_of_the_shards_is_the_whole_rows_draw() {
        let ninf = f32::NEG_INFINITY;
        let rows: [&[f32]; 4] = [
            &[1.0, 0.5, 1.0, ninf, 0.25, 1.0, -2.0, 0.0, 1.0, 0.5],
            &[ninf, ninf, 3.0, ninf, f32::NAN, 3.0, ninf, ninf, ninf, 0.0],
            &[ninf; 10],
            &[f32::NAN, 0.0, 0.0, f32::NAN, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        ];
        for data in rows {
            for temperature in [0.0, 0.5, 1.0, 3.0] {
                let p = SamplingParams {
                    temperature,
                    top_k: 0,
                    top_p: 1.0,
                };
                for node in 0..50 {
                    let key = DrawKey {
                        seed: 7,
                        request: 1,
                        node,
                    };
                    let whole = sample_row(row_of(data).row(0, 0), &p, key);
                    for cuts in [&[][..], &[5], &[1, 2, 9], &[3, 4, 8]] {
                        assert_eq!(over_shards(data, cuts, &p, key), whole, "{data:?} {cuts:?}");
                    }
                }
            }
        }
    }
}
