//! `ddtree._core`: the CPU path of ddtree, called by the `ddtree` Python package.
//!
//! Every function takes raw tensor pointers that the Python layer has validated (see
//! `tensor.rs` for the contract), releases the GIL, and writes into caller-owned outputs.

mod buffers;
mod checks;
mod cpu_engine;
mod cuda;
mod cuda_round;
mod engine;
mod errors;
mod shard;
mod tensor;

use buffers::{data_ptr, AccOut, Links, TreeOut};
use ddtree_core::batch::{self, Posterior};
use ddtree_core::logits::{Element, Logits3};
use ddtree_core::sample::SamplingParams;
use pyo3::prelude::*;
use tensor::{slice, slice_mut, tensor_arg, with_logits, TensorArg};

/// SPEC stages 2–3 from the stage-1 results already in `out` (`topk_logprobs`, `topk_ids`)
/// and `eligible` (int32 `[bs * L]`, -1 for a rejected row).
#[pyfunction]
#[pyo3(signature = (eligible, root_tokens, prefix_lens, shape, budget, topk, out))]
#[allow(clippy::too_many_arguments)]
fn select_emit(
    py: Python<'_>,
    #[pyo3(from_py_with = data_ptr)] eligible: usize,
    #[pyo3(from_py_with = data_ptr)] root_tokens: usize,
    #[pyo3(from_py_with = data_ptr)] prefix_lens: usize,
    shape: [usize; 3],
    budget: usize,
    topk: Option<usize>,
    out: TreeOut,
) -> PyResult<()> {
    let s = batch::Shape::new(shape, budget, topk).map_err(errors::to_py)?;
    // SAFETY: live, checked tensors sized for `s` (tensor.rs).
    let (bufs, rows, roots, prefix) = unsafe {
        (
            out.buffers(&s),
            slice::<i32>(eligible, s.bs * s.depth),
            slice::<i64>(root_tokens, s.bs),
            slice::<i64>(prefix_lens, s.bs),
        )
    };
    let rows: Vec<Option<usize>> = rows.iter().map(|&e| usize::try_from(e).ok()).collect();
    py.detach(|| batch::build_from_candidates(&s, &rows, roots, prefix, bufs))
        .map_err(errors::to_py)
}

/// SPEC stage 4 with the posterior tokens given (`[bs, Q]` int64, one per node).
#[pyfunction]
fn accept_tokens(
    py: Python<'_>,
    #[pyo3(from_py_with = data_ptr)] posterior_tokens: usize,
    tree: Links,
    acc: AccOut,
) -> PyResult<()> {
    // SAFETY: live, checked tensors (tensor.rs).
    let (links, out) = unsafe { (tree.batch(), acc.batch()) };
    let tokens = unsafe { slice::<i64>(posterior_tokens, tree.bs() * links.q) };
    py.detach(|| batch::accept_tree(links, Posterior::<f32>::Tokens(tokens), out))
        .map_err(errors::to_py)
}

/// SPEC stages 1–3 on the CPU; returns `K`.
#[pyfunction]
#[pyo3(signature = (draft_logits, root_tokens, prefix_lens, budget, topk, out))]
fn build_tree(
    py: Python<'_>,
    #[pyo3(from_py_with = tensor_arg)] draft_logits: TensorArg,
    #[pyo3(from_py_with = data_ptr)] root_tokens: usize,
    #[pyo3(from_py_with = data_ptr)] prefix_lens: usize,
    budget: usize,
    topk: Option<usize>,
    out: TreeOut,
) -> PyResult<usize> {
    with_logits!(draft_logits, "draft_logits", |l| build_as(
        py,
        l,
        root_tokens,
        prefix_lens,
        budget,
        topk,
        &out
    ))
}

pub(crate) fn build_as<T: Element>(
    py: Python<'_>,
    logits: Logits3<'_, T>,
    root_tokens: usize,
    prefix_lens: usize,
    budget: usize,
    topk: Option<usize>,
    out: &TreeOut,
) -> PyResult<usize> {
    let s = batch::Shape::new(logits.shape(), budget, topk).map_err(errors::to_py)?;
    // SAFETY: live, checked tensors sized for `s` (tensor.rs).
    let bufs = unsafe { out.buffers(&s) };
    let (roots, prefix) = unsafe {
        (
            slice::<i64>(root_tokens, s.bs),
            slice::<i64>(prefix_lens, s.bs),
        )
    };
    py.detach(|| batch::build_tree(logits, roots, prefix, budget, topk, bufs))
        .map_err(errors::to_py)?;
    Ok(s.k)
}

/// SPEC stage 4, greedy: walk along the argmax of `target_logits` `[bs, Q, V]`.
#[pyfunction]
fn accept_greedy(
    py: Python<'_>,
    #[pyo3(from_py_with = tensor_arg)] target_logits: TensorArg,
    tree: Links,
    acc: AccOut,
) -> PyResult<()> {
    let args = (&tree, &acc);
    with_logits!(target_logits, "target_logits", |l| accept_greedy_as(
        py, l, args
    ))
}

pub(crate) fn accept_greedy_as<T: Element>(
    py: Python<'_>,
    target: Logits3<'_, T>,
    (tree, acc): (&Links, &AccOut),
) -> PyResult<()> {
    // SAFETY: live, checked tensors (tensor.rs).
    let (links, out) = unsafe { (tree.batch(), acc.batch()) };
    py.detach(|| batch::accept_tree(links, Posterior::Greedy(target), out))
        .map_err(errors::to_py)
}

/// SPEC stage 4, sampling: per-request `temperature` / `top_k` / `top_p` (`[bs]` float64,
/// int64, float64; temperature 0 is greedy, top_k ≤ 0 no cap), random numbers keyed by `seed`.
#[pyfunction]
#[pyo3(signature = (target_logits, tree, acc, temperature, top_k, top_p, seed))]
#[allow(clippy::too_many_arguments)]
fn accept_sampled(
    py: Python<'_>,
    #[pyo3(from_py_with = tensor_arg)] target_logits: TensorArg,
    tree: Links,
    acc: AccOut,
    #[pyo3(from_py_with = data_ptr)] temperature: usize,
    #[pyo3(from_py_with = data_ptr)] top_k: usize,
    #[pyo3(from_py_with = data_ptr)] top_p: usize,
    seed: u64,
) -> PyResult<()> {
    // SAFETY: live, checked tensors (tensor.rs).
    let params = unsafe { sampling_params((temperature, top_k, top_p), tree.bs()) };
    let args = (&tree, &acc);
    with_logits!(target_logits, "target_logits", |l| accept_sampled_as(
        py, l, args, &params, seed
    ))
}

/// Per-request sampling parameters from `[bs]` float64 temperature, int64 top_k and
/// float64 top_p (top_k ≤ 0: no cap).
///
/// # Safety
/// The addresses must be live CPU tensors of those dtypes and `bs` elements.
pub(crate) unsafe fn sampling_params(
    (temperature, top_k, top_p): (usize, usize, usize),
    bs: usize,
) -> Vec<SamplingParams> {
    let (t, k, p) = (
        slice::<f64>(temperature, bs),
        slice::<i64>(top_k, bs),
        slice::<f64>(top_p, bs),
    );
    (0..bs)
        .map(|b| SamplingParams {
            temperature: t[b],
            top_k: k[b].max(0) as usize,
            top_p: p[b],
        })
        .collect()
}

pub(crate) fn accept_sampled_as<T: Element>(
    py: Python<'_>,
    target: Logits3<'_, T>,
    (tree, acc): (&Links, &AccOut),
    params: &[SamplingParams],
    seed: u64,
) -> PyResult<()> {
    // SAFETY: live, checked tensors (tensor.rs).
    let (links, out) = unsafe { (tree.batch(), acc.batch()) };
    let posterior = Posterior::Sampled {
        target,
        params,
        seed,
    };
    py.detach(|| batch::accept_tree(links, posterior, out))
        .map_err(errors::to_py)
}

/// SGLang's flat FULL mask into `out` (bool, `out_len` elements); returns elements written.
#[pyfunction]
#[pyo3(signature = (ancestor_bits, bs, q, seq_lens, write_prefix, out, out_len))]
#[allow(clippy::too_many_arguments)]
fn sglang_custom_mask(
    py: Python<'_>,
    #[pyo3(from_py_with = data_ptr)] ancestor_bits: usize,
    bs: usize,
    q: usize,
    #[pyo3(from_py_with = data_ptr)] seq_lens: usize,
    write_prefix: bool,
    #[pyo3(from_py_with = data_ptr)] out: usize,
    out_len: usize,
) -> PyResult<usize> {
    let words = q.div_ceil(32);
    // SAFETY: live, checked tensors (tensor.rs); torch.bool is one byte holding 0 or 1.
    let (bits, lens, out) = unsafe {
        (
            slice::<i32>(ancestor_bits, bs * q * words),
            slice::<i64>(seq_lens, bs),
            slice_mut::<bool>(out, out_len),
        )
    };
    py.detach(|| batch::full_masks(bits, q, lens, write_prefix, out))
        .map_err(errors::to_py)
}

/// A result's fields as the Python package allocates them: (name, torch dtype name, shape).
type FieldRow = (&'static str, &'static str, Vec<usize>);

fn field_rows(fields: Vec<batch::Field>) -> Vec<FieldRow> {
    fields
        .into_iter()
        .map(|(n, e, s)| (n, e.name(), s))
        .collect()
}

/// A `Tree`'s fields for (bs, L, K, B), in declaration order.
#[pyfunction]
fn tree_fields(bs: usize, depth: usize, k: usize, budget: usize) -> Vec<FieldRow> {
    field_rows(batch::tree_fields(bs, depth, k, budget))
}

/// An `Acceptance`'s fields for (bs, L), the readback's fields first.
#[pyfunction]
fn acceptance_fields(bs: usize, depth: usize) -> Vec<FieldRow> {
    field_rows(batch::acceptance_fields(bs, depth))
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(build_tree, m)?)?;
    m.add_function(wrap_pyfunction!(accept_greedy, m)?)?;
    m.add_function(wrap_pyfunction!(select_emit, m)?)?;
    m.add_function(wrap_pyfunction!(accept_tokens, m)?)?;
    m.add_function(wrap_pyfunction!(accept_sampled, m)?)?;
    m.add_function(wrap_pyfunction!(shard::shard_partials, m)?)?;
    m.add_function(wrap_pyfunction!(shard::shard_sums, m)?)?;
    m.add_function(wrap_pyfunction!(shard::merge_partials, m)?)?;
    m.add_function(wrap_pyfunction!(shard::shard_posteriors, m)?)?;
    m.add_function(wrap_pyfunction!(sglang_custom_mask, m)?)?;
    m.add_function(wrap_pyfunction!(tree_fields, m)?)?;
    m.add_function(wrap_pyfunction!(acceptance_fields, m)?)?;
    m.add_class::<engine::CudaEngine>()?;
    m.add_class::<cpu_engine::CpuEngine>()?;
    m.add_function(wrap_pyfunction!(cuda::cuda_build_tree, m)?)?;
    m.add_function(wrap_pyfunction!(cuda::cuda_stage1_parts, m)?)?;
    m.add_function(wrap_pyfunction!(cuda::cuda_stage1_merge, m)?)?;
    m.add_function(wrap_pyfunction!(cuda::cuda_part_chunk, m)?)?;
    m.add_function(wrap_pyfunction!(cuda::cuda_full_mask, m)?)?;
    m.add_function(wrap_pyfunction!(cuda::cuda_images, m)?)?;
    m.add_function(wrap_pyfunction!(cuda::cuda_kernel_resources, m)?)?;
    m.add_function(wrap_pyfunction!(cuda::cuda_attention_tiles, m)?)?;
    m.add_function(wrap_pyfunction!(cuda::cuda_prepare, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_round::cuda_accept, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_round::cuda_shard_keys, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_round::cuda_walk_keys, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_round::cuda_kept_slots, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_round::cuda_compact_kv, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_round::cuda_gather_hidden, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_round::cuda_maps_host, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_round::cuda_cache_table, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_round::readback_layout, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_round::readback_newest, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_round::cuda_tree_attention, m)?)?;
    m.add_class::<cuda_round::AttentionPlan>()?;
    m.add("CUDA_MAX_BUDGET", ddtree_cuda::launch::MAX_BUDGET)?;
    m.add("CUDA_MAX_K", ddtree_cuda::launch::MAX_K)?;
    m.add("CUDA_MAX_DEPTH", ddtree_cuda::launch::MAX_DEPTH)?;
    m.add(
        "CUDA_MAX_PART_ENTRIES",
        ddtree_cuda::partials::MAX_PART_ENTRIES,
    )?;
    m.add("MAX_DEPTH", ddtree_core::select::MAX_DEPTH)?;
    m.add("MAX_BUDGET", batch::MAX_BUDGET)?;
    for (name, code) in ddtree_core::status::ALL {
        m.add(format!("STATUS_{name}").as_str(), code)?;
    }
    Ok(())
}
