//! SPEC stage 1 — candidates per depth: the rank order, the normaliser and the log-probs.

use crate::logits::{Element, Row};
use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// Stage-1 result of one depth row (`lp` and `ti` are written by [`candidates`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowCandidates {
    /// Ranks `0..eligible` hold finite logits; the rest are `-inf` tokens (or nothing).
    pub eligible: usize,
    /// The normaliser `Z` (logsumexp, rounded to fp32); `-inf` for a row with no finite value.
    pub z: f32,
}

/// A row holds NaN or `+inf`: SPEC stage 1 rejects its request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NonFinite;

/// A token ranked by (value descending, id ascending); "greater" means "ranked earlier".
#[derive(Clone, Copy)]
pub(crate) struct Ranked {
    pub(crate) value: f32,
    pub(crate) id: usize,
}

impl Ord for Ranked {
    fn cmp(&self, other: &Self) -> Ordering {
        // Values are finite here, so partial_cmp never fails; it also ties -0.0 with 0.0,
        // which is what "equal values by token id" means for IEEE comparisons.
        let by_value = self
            .value
            .partial_cmp(&other.value)
            .unwrap_or(Ordering::Equal);
        by_value.then_with(|| other.id.cmp(&self.id))
    }
}
impl PartialOrd for Ranked {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl PartialEq for Ranked {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Ranked {}

/// Stage 1 for one row: writes the top `lp.len()` log-probs and token ids in rank order.
///
/// Ranks past the finite values hold the `-inf` tokens in id order (log-prob `-inf`); ranks
/// past the vocabulary hold id `-1`.
pub fn candidates<T: Element>(
    row: Row<'_, T>,
    lp: &mut [f32],
    ti: &mut [i64],
) -> Result<RowCandidates, NonFinite> {
    let k = lp.len();
    let (top, max) = top_k_finite(row, k)?;
    let z = if top.is_empty() {
        f32::NEG_INFINITY
    } else {
        logsumexp(row, max)
    };
    for (r, cand) in top.iter().enumerate() {
        lp[r] = cand.value - z;
        ti[r] = cand.id as i64;
    }
    fill_ineligible(row, &mut lp[top.len()..], &mut ti[top.len()..]);
    Ok(RowCandidates {
        eligible: top.len(),
        z,
    })
}

/// The best `k` finite values in rank order, and the row maximum.
///
/// A bounded min-heap of the current best: ids arrive in ascending order, so a later equal
/// value never outranks a kept one and only a strictly greater value replaces the worst.
pub(crate) fn top_k_finite<T: Element>(
    row: Row<'_, T>,
    k: usize,
) -> Result<(Vec<Ranked>, f32), NonFinite> {
    let mut heap: BinaryHeap<std::cmp::Reverse<Ranked>> = BinaryHeap::with_capacity(k + 1);
    let mut bad = false;
    let mut max = f32::NEG_INFINITY;
    row.for_each(|id, value| {
        if value.is_nan() || value == f32::INFINITY {
            bad = true;
        } else if value != f32::NEG_INFINITY {
            max = max.max(value);
            if heap.len() < k {
                heap.push(std::cmp::Reverse(Ranked { value, id }));
            } else if let Some(mut worst) = heap.peek_mut() {
                if value > worst.0.value {
                    *worst = std::cmp::Reverse(Ranked { value, id });
                }
            }
        }
    });
    if bad {
        return Err(NonFinite);
    }
    // into_sorted_vec on Reverse gives best first.
    let top = heap.into_sorted_vec().into_iter().map(|r| r.0).collect();
    Ok((top, max))
}

/// `Z = fp32(m + ln(sum(exp(x - m))))` over the finite values (`-inf` adds 0).
fn logsumexp<T: Element>(row: Row<'_, T>, max: f32) -> f32 {
    normaliser(max, exp_sum(row, max))
}

/// The fixed-point unit of the normaliser's sum: 2^-80.
///
/// Each term `exp(x - m)` (float64, at most 1) is rounded to a multiple of 2^-80 and the
/// terms are added as integers. Integer addition is exact, so the sum does not depend on
/// the order of the terms or on how a row is split: vocabulary shards that each sum their
/// slice (against the row's global maximum) add up to the single-process sum bit for bit.
/// The rounding costs at most 2^-81 per term, about 2^-63 of the sum (which is at least 1)
/// for a 262144-token row: far below one fp32 ulp of `Z`.
pub const SUM_UNIT: f64 = (1u128 << 80) as f64;

/// The fixed-point sum of `exp(x - max)` over the finite values of a row (or a shard of
/// one), in units of [`SUM_UNIT`]`^-1`. NaN and `+inf` add nothing: a row holding them is
/// rejected anyway, and a shard's sums run before the ranks know that.
pub fn exp_sum<T: Element>(row: Row<'_, T>, max: f32) -> i128 {
    let m = max as f64;
    let mut sum = 0u128; // at most V * 2^80 < 2^127
    row.for_each(|_, x| {
        if x.is_finite() {
            sum += fixed_units((x as f64 - m).exp() * SUM_UNIT);
        }
    });
    sum as i128
}

/// `v.round()` as an integer, for `0 <= v < 2^81` (a term in units of `SUM_UNIT`^-1),
/// without the two library calls `round` and the float-to-i128 conversion take: from
/// 2^53 up `v` is an integer, read off its bits; below, truncation and the fraction
/// (round half away from zero, like `f64::round`). A third of stage 1's time on the CPU.
#[inline(always)]
fn fixed_units(v: f64) -> u128 {
    const INTEGRAL: f64 = (1u64 << 53) as f64;
    if v >= INTEGRAL {
        let bits = v.to_bits();
        let mantissa = (bits & ((1u64 << 52) - 1)) | (1u64 << 52);
        let shift = ((bits >> 52) as u32) - 1075; // the exponent minus the mantissa's 52
        (mantissa as u128) << shift
    } else {
        let t = v as u64; // exact truncation: 0 <= v < 2^53
        (t + u64::from(v - t as f64 >= 0.5)) as u128
    }
}

/// `Z = fp32(max + ln(sum / 2^80))` for a fixed-point [`exp_sum`].
pub fn normaliser(max: f32, sum: i128) -> f32 {
    (max as f64 + (sum as f64 / SUM_UNIT).ln()) as f32
}

/// Ranks after the finite ones: the `-inf` tokens in ascending id order, then id `-1`.
pub(crate) fn fill_ineligible<T: Element>(row: Row<'_, T>, lp: &mut [f32], ti: &mut [i64]) {
    if lp.is_empty() {
        return;
    }
    lp.fill(f32::NEG_INFINITY);
    ti.fill(-1);
    let mut next = 0;
    row.for_each(|id, value| {
        if value == f32::NEG_INFINITY && next < ti.len() {
            ti[next] = id as i64;
            next += 1;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_units_rounds_like_f64_round_over_the_whole_range() {
        let edges = [
            0.0,
            0.49999999999999994,
            0.5,
            1.5,
            2.5,
            123_456.5,
            4_503_599_627_370_495.5, // 2^52 - 0.5
            9_007_199_254_740_991.0, // 2^53 - 1
            9_007_199_254_740_992.0, // 2^53
            9_007_199_254_740_994.0,
            SUM_UNIT, // exp(0): the largest term
        ];
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let spread = (0..20_000).map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            // exp(d) * 2^80 for d in [-60, 0]: every magnitude a term takes
            (-60.0 * (state >> 11) as f64 / (1u64 << 53) as f64).exp() * SUM_UNIT
        });
        for v in edges.into_iter().chain(spread) {
            assert_eq!(fixed_units(v), v.round() as u128, "{v:e}");
        }
    }
}
