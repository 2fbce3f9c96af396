//! Stage 1 over vocabulary shards for a batch: every `(request, depth)` row in parallel.
//! The Python layer gathers what these return across the ranks (`ddtree._vocab_parallel`).

use crate::error::{ensure, Result};
use crate::logits::{Element, Logits3};
use crate::sample::{shard_posterior, DrawKey, SamplingParams};
use crate::shard::{merge_row, shard_top};
use rayon::prelude::*;

/// Gathered partials of `tp` shards for `rows` rows of `k` ranks, shard-major:
/// `values`/`ids` `[tp, rows, k]`, `bad` `[tp, rows]` (nonzero: NaN or `+inf` there) and
/// `sums` `[tp, rows, 2]` (each fixed-point exp-sum as its high and low 64-bit halves).
pub struct Partials<'a> {
    pub tp: usize,
    pub k: usize,
    pub values: &'a [f32],
    pub ids: &'a [i64],
    pub bad: &'a [u8],
    pub sums: &'a [i64],
}

/// Each row's [`shard_top`] into `values`/`ids` (`[rows, k]`), its maximum into `maxima`
/// and 1 into `bad` where it holds NaN or `+inf`; ids offset by `start`.
pub fn shard_partials<T: Element>(
    logits: Logits3<'_, T>,
    start: usize,
    values: &mut [f32],
    ids: &mut [i64],
    maxima: &mut [f32],
    bad: &mut [u8],
) -> Result<()> {
    let [bs, depth, _] = logits.shape();
    let rows = bs * depth;
    ensure(maxima.len() == rows && bad.len() == rows, "out", || {
        format!("maxima and bad must hold {rows} rows")
    })?;
    ensure(
        rows > 0 && values.len() % rows == 0 && ids.len() == values.len(),
        "out",
        || format!("values and ids must hold {rows} rows of k ranks"),
    )?;
    let k = values.len() / rows;
    values
        .par_chunks_mut(k)
        .zip(ids.par_chunks_mut(k))
        .zip(maxima.par_iter_mut().zip(bad.par_iter_mut()))
        .enumerate()
        .for_each(|(r, ((v, i), (m, b)))| {
            match shard_top(logits.row(r / depth, r % depth), start, v, i) {
                Ok(max) => (*m, *b) = (max, 0),
                Err(_) => (*m, *b) = (f32::NEG_INFINITY, 1),
            }
        });
    Ok(())
}

/// Each row's fixed-point exp-sum against the row's global maximum (`maxima`, `[rows]`),
/// into `sums` `[rows, 2]` as high and low 64-bit halves.
pub fn shard_sums<T: Element>(
    logits: Logits3<'_, T>,
    maxima: &[f32],
    sums: &mut [i64],
) -> Result<()> {
    let [bs, depth, _] = logits.shape();
    ensure(
        maxima.len() == bs * depth && sums.len() == 2 * bs * depth,
        "out",
        || format!("maxima must hold {} rows and sums twice that", bs * depth),
    )?;
    sums.par_chunks_mut(2).enumerate().for_each(|(r, out)| {
        let sum = crate::candidates::exp_sum(logits.row(r / depth, r % depth), maxima[r]);
        out[0] = (sum >> 64) as i64;
        out[1] = sum as u64 as i64;
    });
    Ok(())
}

/// Merges gathered `p` into stage-1 results `lp`/`ti` (`[rows, k]`) and `eligible`
/// (`[rows]`: finite ranks, -1 where some shard held NaN or `+inf`), given the rows'
/// global `maxima`.
pub fn merge_partials(
    p: &Partials<'_>,
    maxima: &[f32],
    lp: &mut [f32],
    ti: &mut [i64],
    eligible: &mut [i32],
) -> Result<()> {
    let rows = maxima.len();
    let lens = [
        (p.values.len(), p.tp * rows * p.k),
        (p.ids.len(), p.tp * rows * p.k),
        (p.bad.len(), p.tp * rows),
        (p.sums.len(), p.tp * rows * 2),
        (lp.len(), rows * p.k),
        (ti.len(), rows * p.k),
        (eligible.len(), rows),
    ];
    ensure(
        lens.iter().all(|(got, want)| got == want),
        "partials",
        || {
            format!(
                "lengths {lens:?} (got, want) do not match {} shards of {rows} rows",
                p.tp
            )
        },
    )?;
    lp.par_chunks_mut(p.k)
        .zip(ti.par_chunks_mut(p.k))
        .zip(eligible.par_iter_mut())
        .enumerate()
        .for_each(|(r, ((lp, ti), e))| *e = merge_one(p, r, rows, maxima[r], lp, ti));
    Ok(())
}

fn merge_one(
    p: &Partials<'_>,
    r: usize,
    rows: usize,
    max: f32,
    lp: &mut [f32],
    ti: &mut [i64],
) -> i32 {
    if (0..p.tp).any(|s| p.bad[s * rows + r] != 0) {
        lp.fill(f32::NEG_INFINITY);
        ti.fill(-1);
        return -1;
    }
    let (mut values, mut ids, mut sum) = (Vec::with_capacity(p.tp * p.k), Vec::new(), 0i128);
    for s in 0..p.tp {
        let at = (s * rows + r) * p.k;
        values.extend_from_slice(&p.values[at..at + p.k]);
        ids.extend_from_slice(&p.ids[at..at + p.k]);
        let h = &p.sums[(s * rows + r) * 2..][..2];
        sum += ((h[0] as i128) << 64) | (h[1] as u64 as i128);
    }
    merge_row(&values, &ids, max, sum, lp, ti).eligible as i32
}

/// Each node's [`shard_posterior`] of a target shard `[bs, Q, V_r]` (global ids from
/// `start`) into `values` / `ids` `[bs, Q]`, draws keyed by `seed`. Requests with `top_k`
/// or `top_p` are refused: those filters need the whole row.
pub fn shard_posteriors<T: Element>(
    target: Logits3<'_, T>,
    start: usize,
    params: &[SamplingParams],
    seed: u64,
    values: &mut [f64],
    ids: &mut [i64],
) -> Result<()> {
    let [bs, q, _] = target.shape();
    super::accept::check_params(params, bs)?;
    ensure(
        params.iter().all(|p| p.top_k == 0 && p.top_p >= 1.0),
        "top_k",
        || "a vocab-parallel sampled accept takes temperature alone".into(),
    )?;
    ensure(values.len() == bs * q && ids.len() == bs * q, "out", || {
        format!("values and ids must hold {bs} x {q} nodes")
    })?;
    values
        .par_iter_mut()
        .zip(ids.par_iter_mut())
        .enumerate()
        .for_each(|(n, (v, id))| {
            let (b, i) = (n / q, n % q);
            let key = DrawKey {
                seed,
                request: b as u64,
                node: i as u64,
            };
            (*v, *id) = shard_posterior(target.row(b, i), start, &params[b], key);
        });
    Ok(())
}
