//! Stage 1 over vocabulary shards (`ddtree._vocab_parallel`): a rank's partials, its
//! fixed-point exp-sums, and the merge of every rank's gathered partials. Outputs are
//! contiguous tensors the Python layer allocated and sized.

use crate::buffers::data_ptr;
use crate::errors;
use crate::tensor::{slice, slice_mut, tensor_arg, LogitsDtype, TensorArg};
use ddtree_core::batch::{self, Partials};
use ddtree_core::logits::{Element, Logits3};
use ddtree_core::sample::SamplingParams;
use half::{bf16, f16};
use pyo3::prelude::*;

/// Runs `f` on `logits` viewed with its own element type.
fn on_logits<R>(
    logits: &TensorArg,
    arg: &'static str,
    f: impl FnOnce(LogitsView<'_>) -> ddtree_core::Result<R>,
) -> PyResult<R> {
    // SAFETY: the Python layer passes a live, checked tensor (tensor.rs).
    let view = unsafe {
        match logits.logits_dtype(arg)? {
            LogitsDtype::F32 => LogitsView::F32(logits.logits3(arg)?),
            LogitsDtype::F16 => LogitsView::F16(logits.logits3(arg)?),
            LogitsDtype::Bf16 => LogitsView::Bf16(logits.logits3(arg)?),
        }
    };
    f(view).map_err(errors::to_py)
}

enum LogitsView<'a> {
    F32(Logits3<'a, f32>),
    F16(Logits3<'a, f16>),
    Bf16(Logits3<'a, bf16>),
}

impl LogitsView<'_> {
    fn rows(&self) -> usize {
        let [bs, depth, _] = match self {
            Self::F32(l) => l.shape(),
            Self::F16(l) => l.shape(),
            Self::Bf16(l) => l.shape(),
        };
        bs * depth
    }
}

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
    on_logits(&shard_logits, "shard_logits", |view| {
        py.detach(|| match view {
            LogitsView::F32(l) => partials_as(l, start, k, out),
            LogitsView::F16(l) => partials_as(l, start, k, out),
            LogitsView::Bf16(l) => partials_as(l, start, k, out),
        })
    })
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
    on_logits(&shard_logits, "shard_logits", |view| {
        let rows = view.rows();
        // SAFETY: contiguous tensors of these sizes (the Python layer allocates them).
        let (maxima, sums) =
            unsafe { (slice::<f32>(maxima, rows), slice_mut::<i64>(sums, 2 * rows)) };
        py.detach(|| match view {
            LogitsView::F32(l) => batch::shard_sums(l, maxima, sums),
            LogitsView::F16(l) => batch::shard_sums(l, maxima, sums),
            LogitsView::Bf16(l) => batch::shard_sums(l, maxima, sums),
        })
    })
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
    on_logits(&target_shard, "target_logits", |view| {
        py.detach(|| match view {
            LogitsView::F32(l) => batch::shard_posteriors(l, start, &params, seed, values, ids),
            LogitsView::F16(l) => batch::shard_posteriors(l, start, &params, seed, values, ids),
            LogitsView::Bf16(l) => batch::shard_posteriors(l, start, &params, seed, values, ids),
        })
    })
}
