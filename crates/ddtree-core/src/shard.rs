//! SPEC stage 1 across vocabulary shards (tensor parallelism, where each rank holds the
//! logits of a contiguous slice of the vocabulary).
//!
//! A rank reduces each of its rows to a partial: its best K tokens in rank order (global
//! ids), its maximum, and — once the ranks have agreed on the row's maximum — its
//! fixed-point exp-sum ([`crate::candidates::exp_sum`]). The partials are a few hundred
//! bytes a row instead of the row itself, and [`merge_row`] turns the gathered partials into
//! exactly the candidates the single-process [`crate::candidates::candidates`] gives the
//! concatenated row: the rank order is comparisons only, and the fixed-point sum is exact.

use crate::candidates::{
    fill_ineligible, normaliser, top_k_finite, NonFinite, Ranked, RowCandidates,
};
use crate::logits::{Element, Row};
use std::cmp::Ordering;

/// A shard row's best `values.len()` tokens in rank order, with ids offset by `start`:
/// the finite values first (value descending, id ascending), then the `-inf` tokens in id
/// order, then id `-1` (value `-inf`). Returns the shard's maximum (`-inf` if it has no
/// finite value), or `NonFinite` if the shard holds NaN or `+inf`.
pub fn shard_top<T: Element>(
    row: Row<'_, T>,
    start: usize,
    values: &mut [f32],
    ids: &mut [i64],
) -> Result<f32, NonFinite> {
    let (top, max) = top_k_finite(row, values.len())?;
    for (r, cand) in top.iter().enumerate() {
        values[r] = cand.value;
        ids[r] = (cand.id + start) as i64;
    }
    let rest = top.len();
    fill_ineligible(row, &mut values[rest..], &mut ids[rest..]);
    for id in ids[rest..].iter_mut().filter(|id| **id >= 0) {
        *id += start as i64;
    }
    Ok(max)
}

/// Rank order of the entries of gathered partials: finite values in [`Ranked`] order, then
/// `-inf` tokens (id ascending), then the `-1` padding.
fn rank_order(a: (f32, i64), b: (f32, i64)) -> Ordering {
    let class = |(v, id): (f32, i64)| match (v.is_finite(), id >= 0) {
        (true, _) => 0,
        (false, true) => 1,
        (false, false) => 2,
    };
    // A finite entry has a token id (>= 0). Ranked's "greater" is "ranked earlier".
    let ranked = |(value, id): (f32, i64)| Ranked {
        value,
        id: id as usize,
    };
    class(a).cmp(&class(b)).then_with(|| match class(a) {
        0 => ranked(b).cmp(&ranked(a)),
        _ => a.1.cmp(&b.1),
    })
}

/// One row's stage-1 result from the partials of every shard: `values` and `ids` are the
/// shards' [`shard_top`] lists (each `lp.len()` long, any shard order), `max` the row's
/// maximum over the shards and `sum` the shards' fixed-point exp-sums against it, added.
/// Writes `lp` and `ti` exactly as `candidates` does for the whole row.
pub fn merge_row(
    values: &[f32],
    ids: &[i64],
    max: f32,
    sum: i128,
    lp: &mut [f32],
    ti: &mut [i64],
) -> RowCandidates {
    let mut all: Vec<(f32, i64)> = values.iter().copied().zip(ids.iter().copied()).collect();
    all.sort_by(|a, b| rank_order(*a, *b));
    let eligible = all[..lp.len()].iter().filter(|e| e.0.is_finite()).count();
    let z = if eligible == 0 {
        f32::NEG_INFINITY
    } else {
        normaliser(max, sum)
    };
    for (r, &(v, id)) in all[..lp.len()].iter().enumerate() {
        lp[r] = if r < eligible {
            v - z
        } else {
            f32::NEG_INFINITY
        };
        ti[r] = id;
    }
    RowCandidates { eligible, z }
}

/// Rows and their splits for the shard tests (here and in `sample`).
#[cfg(test)]
pub(crate) mod split {
    use crate::logits::Logits3;

    /// `data` as a one-row logits tensor.
    pub fn row_of(data: &[f32]) -> Logits3<'_, f32> {
        Logits3::new("x", data, [1, 1, data.len()], [0, 0, 1]).unwrap()
    }

    /// The shard bounds `[0, cuts.., len]` of a row cut at `cuts`.
    pub fn bounds(cuts: &[usize], len: usize) -> Vec<usize> {
        [0].iter()
            .chain(cuts)
            .chain([len].iter())
            .copied()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::split::{bounds, row_of};
    use super::*;
    use crate::candidates::{candidates, exp_sum};

    /// Splits `data` at `cuts`, merges the shards' partials, and compares with the whole.
    fn merged_equals_whole(data: &[f32], cuts: &[usize], k: usize) {
        let whole = row_of(data);
        let (mut lp, mut ti) = (vec![0f32; k], vec![0i64; k]);
        let want = candidates(whole.row(0, 0), &mut lp, &mut ti).unwrap();
        let (mut values, mut ids, mut max) = (vec![], vec![], f32::NEG_INFINITY);
        let mut shards = vec![];
        for w in bounds(cuts, data.len()).windows(2) {
            let shard = row_of(&data[w[0]..w[1]]);
            let (mut v, mut i) = (vec![0f32; k], vec![0i64; k]);
            max = max.max(shard_top(shard.row(0, 0), w[0], &mut v, &mut i).unwrap());
            values.extend(v);
            ids.extend(i);
            shards.push(w[0]..w[1]);
        }
        let sum: i128 = shards
            .iter()
            .map(|r| exp_sum(row_of(&data[r.clone()]).row(0, 0), max))
            .sum();
        let (mut lp2, mut ti2) = (vec![0f32; k], vec![0i64; k]);
        let got = merge_row(&values, &ids, max, sum, &mut lp2, &mut ti2);
        assert_eq!(got.eligible, want.eligible);
        assert_eq!(got.z.to_bits(), want.z.to_bits());
        assert_eq!(ti2, ti);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&lp2), bits(&lp));
    }

    #[test]
    fn merged_shards_give_the_whole_rows_candidates_bit_for_bit() {
        let ninf = f32::NEG_INFINITY;
        // Ties across the cut, -inf tokens on both sides, a shard of -inf only.
        let data = [1.5, 0.25, ninf, 2.0, 1.5, ninf, 2.0, 0.0, -0.0, 1.5];
        for cuts in [&[][..], &[3], &[4, 7], &[1, 2, 9], &[5, 6]] {
            for k in [1, 3, 8, 10, 12] {
                merged_equals_whole(&data, cuts, k);
            }
        }
        merged_equals_whole(&[ninf, ninf, ninf, ninf], &[1, 3], 5);
    }

    #[test]
    fn a_shards_sum_skips_nan_and_inf_rather_than_overflow() {
        // Its row is rejected after the gather, but the sum runs first (debug builds would
        // panic on the saturated +inf term).
        let data = [f32::INFINITY, 0.0, f32::NAN, 0.0];
        assert_eq!(exp_sum(row_of(&data).row(0, 0), 0.0), 2 * (1i128 << 80));
    }

    #[test]
    fn a_shard_with_nan_is_refused() {
        let data = [0.0, f32::NAN, 1.0];
        let (mut v, mut i) = (vec![0f32; 2], vec![0i64; 2]);
        assert_eq!(
            shard_top(row_of(&data).row(0, 0), 5, &mut v, &mut i),
            Err(NonFinite)
        );
    }
}
