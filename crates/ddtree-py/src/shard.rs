//! Stage 1 over vocabulary shards (`ddtree._vocab_parallel`): a rank's partials, its
//! fixed-point exp-sums, and the merge of every rank's gathered partials. Outputs are
//! contiguous tensors the Python layer allocated and sized.

use crate::buffers::data_ptr;
use crate::errors;
use crate::tensor::{slice, slice_mut, tensor_arg, with_logits, TensorArg};
use ddtree_core::batch::{self, Partials};
use ddtree_core::logits::{Element, Logits3};
use ddtree_core::sample::SamplingParams;
use pyo3::prelude::*;

fn partials_as<T: Element>(
    l: Logits3<'_, T>,
    start: usize,
    k: usize,
    out: [usize; 4],
) -> ddtree_core::Result<()> {
    let [bs, depth, _] = l.shape();
    let rows = bs * depth;
    // SAFETY: contiguous outputs of these sizes (the Python layer allocates them).
    let (values, ids, maxima, bad) = unsafe {
        (
            slice_mut::<f32>(out[0], rows * k),
            slice_mut::<i64>(out[1], rows * k),
            slice_mut::<f32>(out[2], rows),
            slice_mut::<u8>(out[3], rows),
        )
    };
    batch::shard_partials(l, start, values, ids, maxima, bad)
}

/// A shard's partials: `values`/`ids` `[rows, k]`, `maxima` `[rows]`, `bad` uint8 `[rows]`.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn shard_partials(
    py: Python<'_>,
    #[pyo3(from_py_with = tensor_arg)] shard_logits: TensorArg,
    start: usize,
    k: usize,
    #[pyo3(from_py_with = data_ptr)] values: usize,
    #[pyo3(from_py_with = data_ptr)] ids: usize,
    #[pyo3(from_py_with = data_ptr)] maxima: usize,
    #[pyo3(from_py_with = data_ptr)] bad: usize,
) -> PyResult<()> {
    let out = [values, ids, maxima, bad];
    with_logits!(shard_logits, "shard_logits", |l| py
        .detach(|| partials_as(l, start, k, out))
        .map_err(errors::to_py))
}

/// A shard's fixed-point exp-sums against the rows' global `maxima` `[rows]`, into `sums`
/// int64 `[rows, 2]`.
#[pyfunction]
pub fn shard_sums(
    py: Python<'_>,
    #[pyo3(from_py_with = tensor_arg)] shard_logits: TensorArg,
    #[pyo3(from_py_with = data_ptr)] maxima: usize,
    #[pyo3(from_py_with = data_ptr)] sums: usize,
) -> PyResult<()> {
    let (shape, _) = shard_logits.shape3("shard_logits")?;
    let rows = shape[0] * shape[1];
    // SAFETY: contiguous tensors of these sizes (the Python layer allocates them).
    let (maxima, sums) = unsafe { (slice::<f32>(maxima, rows), slice_mut::<i64>(sums, 2 * rows)) };
    with_logits!(shard_logits, "shard_logits", |l| py
        .detach(|| batch::shard_sums(l, maxima, sums))
        .map_err(errors::to_py))
}

/// Merges `tp` shards' gathered partials of `rows` rows into `lp`/`ti` `[rows, k]` and
/// `eligible` int32 `[rows]` (-1: a shard held NaN or `+inf`).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn merge_partials(
    py: Python<'_>,
    tp: usize,
    rows: usize,
    k: usize,
    #[pyo3(from_py_with = data_ptr)] values: usize,
    #[pyo3(from_py_with = data_ptr)] ids: usize,
    #[pyo3(from_py_with = data_ptr)] bad: usize,
    #[pyo3(from_py_with = data_ptr)] sums: usize,
    #[pyo3(from_py_with = data_ptr)] maxima: usize,
    #[pyo3(from_py_with = data_ptr)] lp: usize,
    #[pyo3(from_py_with = data_ptr)] ti: usize,
    #[pyo3(from_py_with = data_ptr)] eligible: usize,
) -> PyResult<()> {
    // SAFETY: contiguous tensors of these sizes (the Python layer allocates and gathers them).
    let (p, maxima, lp, ti, eligible) = unsafe {
        (
            Partials {
                tp,
                k,
                values: slice::<f32>(values, tp * rows * k),
                ids: slice::<i64>(ids, tp * rows * k),
                bad: slice::<u8>(bad, tp * rows),
                sums: slice::<i64>(sums, tp * rows * 2),
            },
            slice::<f32>(maxima, rows),
            slice_mut::<f32>(lp, rows * k),
            slice_mut::<i64>(ti, rows * k),
            slice_mut::<i32>(eligible, rows),
        )
    };
    py.detach(|| batch::merge_partials(&p, maxima, lp, ti, eligible))
        .map_err(errors::to_py)
}

/// Each node's posterior part on a target shard `[bs, Q, V_r]`: `values` float64 and `ids`
/// int64 `[bs, Q]` (id -1: nothing in this shard), per-request `temperature` (float64 `[bs]`,
/// 0 greedy), draws keyed by `seed`.
#[pyfunction]
pub fn shard_posteriors(
    py: Python<'_>,
    #[pyo3(from_py_with = tensor_arg)] target_shard: TensorArg,
    start: usize,
    #[pyo3(from_py_with = data_ptr)] temperature: usize,
    seed: u64,
    #[pyo3(from_py_with = data_ptr)] values: usize,
    #[pyo3(from_py_with = data_ptr)] ids: usize,
) -> PyResult<()> {
    let (shape, _) = target_shard.shape3("target_logits")?;
    let (bs, nodes) = (shape[0], shape[0] * shape[1]);
    // SAFETY: contiguous tensors of these sizes (the Python layer allocates them).
    let (t, values, ids) = unsafe {
        (
            slice::<f64>(temperature, bs),
            slice_mut::<f64>(values, nodes),
            slice_mut::<i64>(ids, nodes),
        )
    };
    let params: Vec<SamplingParams> = t
        .iter()
        .map(|&temperature| SamplingParams {
            temperature,
            top_k: 0,
            top_p: 1.0,
        })
        .collect();
    with_logits!(target_shard, "target_logits", |l| py
        .detach(|| batch::shard_posteriors(l, start, &params, seed, values, ids))
        .map_err(errors::to_py))
}
