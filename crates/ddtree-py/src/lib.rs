//! `ddtree._core`: the CPU path of ddtree, called by the `ddtree` Python package.
//!
//! Every function takes raw tensor pointers that the Python layer has validated (see
//! `tensor.rs` for the contract), releases the GIL, and writes into caller-owned outputs.

mod cuda;
mod cuda_round;
mod engine;
mod errors;
mod tensor;

use ddtree_core::batch::{self, AcceptBuffers, BatchLinks, Posterior, TreeBuffers};
use ddtree_core::emit::VerifyInputs;
use ddtree_core::logits::{Element, Logits3};
use ddtree_core::sample::SamplingParams;
use half::{bf16, f16};
use pyo3::prelude::*;
use tensor::{slice, slice_mut, LogitsDtype, TensorArg};

/// Output pointers of a build (contiguous tensors sized for the build's shape).
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub struct TreeOut {
    pub(crate) verify_ids: usize,
    pub(crate) positions: usize,
    pub(crate) depths: usize,
    pub(crate) parents: usize,
    pub(crate) first_child: usize,
    pub(crate) next_sibling: usize,
    pub(crate) ancestor_bits: usize,
    pub(crate) scores: usize,
    pub(crate) num_nodes: usize,
    pub(crate) topk_logprobs: usize,
    pub(crate) topk_ids: usize,
    pub(crate) status: usize,
}

impl TreeOut {
    /// # Safety
    /// The pointers must address live, non-overlapping tensors sized for `s`.
    unsafe fn buffers(&self, s: &batch::Shape) -> TreeBuffers<'static> {
        let (bs, q, lk) = (s.bs, s.q(), s.depth * s.k);
        TreeBuffers {
            verify: VerifyInputs {
                verify_ids: slice_mut(self.verify_ids, bs * q),
                positions: slice_mut(self.positions, bs * q),
                depths: slice_mut(self.depths, bs * q),
                parents: slice_mut(self.parents, bs * q),
                first_child: slice_mut(self.first_child, bs * q),
                next_sibling: slice_mut(self.next_sibling, bs * q),
                ancestor_bits: slice_mut(self.ancestor_bits, bs * q * s.words()),
                scores: slice_mut(self.scores, bs * q),
            },
            num_nodes: slice_mut(self.num_nodes, bs),
            topk_logprobs: slice_mut(self.topk_logprobs, bs * lk),
            topk_ids: slice_mut(self.topk_ids, bs * lk),
            status: slice_mut(self.status, bs),
        }
    }
}

/// SPEC stages 2–3 from the stage-1 results already in `out` (`topk_logprobs`, `topk_ids`)
/// and `eligible` (int32 `[bs * L]`, -1 for a rejected row).
#[pyfunction]
#[pyo3(signature = (eligible, root_tokens, prefix_lens, shape, budget, topk, out))]
#[allow(clippy::too_many_arguments)]
fn select_emit(
    py: Python<'_>,
    eligible: usize,
    root_tokens: usize,
    prefix_lens: usize,
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
fn accept_tokens(py: Python<'_>, posterior_tokens: usize, args: AcceptArgs) -> PyResult<()> {
    // SAFETY: live, checked tensors (tensor.rs).
    let tokens = unsafe { slice::<i64>(posterior_tokens, args.bs * args.q) };
    let (links, out) = unsafe { args.split() };
    py.detach(|| batch::accept_tree(links, Posterior::<f32>::Tokens(tokens), out))
        .map_err(errors::to_py)
}

/// SPEC stages 1–3 on the CPU; returns `K`.
#[pyfunction]
#[pyo3(signature = (draft_logits, root_tokens, prefix_lens, budget, topk, out))]
fn build_tree(
    py: Python<'_>,
    draft_logits: TensorArg,
    root_tokens: usize,
    prefix_lens: usize,
    budget: usize,
    topk: Option<usize>,
    out: TreeOut,
) -> PyResult<usize> {
    match draft_logits.logits_dtype("draft_logits")? {
        LogitsDtype::F32 => build_as::<f32>(
            py,
            &draft_logits,
            root_tokens,
            prefix_lens,
            budget,
            topk,
            &out,
        ),
        LogitsDtype::F16 => build_as::<f16>(
            py,
            &draft_logits,
            root_tokens,
            prefix_lens,
            budget,
            topk,
            &out,
        ),
        LogitsDtype::Bf16 => build_as::<bf16>(
            py,
            &draft_logits,
            root_tokens,
            prefix_lens,
            budget,
            topk,
            &out,
        ),
    }
}

fn build_as<T: Element>(
    py: Python<'_>,
    logits: &TensorArg,
    root_tokens: usize,
    prefix_lens: usize,
    budget: usize,
    topk: Option<usize>,
    out: &TreeOut,
) -> PyResult<usize> {
    // SAFETY: the Python layer passes live, checked tensors (tensor.rs).
    let logits: Logits3<'_, T> = unsafe { logits.logits3("draft_logits")? };
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

/// The `[bs, Q]` tree links an accept reads, and the accept outputs.
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
struct AcceptArgs {
    bs: usize,
    q: usize,
    width: usize,
    verify_ids: usize,
    first_child: usize,
    next_sibling: usize,
    accepted_nodes: usize,
    accepted_tokens: usize,
    accept_index: usize,
    accept_len: usize,
    bonus: usize,
    status: usize,
}

impl AcceptArgs {
    /// # Safety
    /// The pointers must address live, non-overlapping tensors of the stated sizes.
    unsafe fn split(&self) -> (BatchLinks<'static>, AcceptBuffers<'static>) {
        let (bs, q, w) = (self.bs, self.q, self.width);
        let links = BatchLinks {
            verify_ids: slice(self.verify_ids, bs * q),
            first_child: slice(self.first_child, bs * q),
            next_sibling: slice(self.next_sibling, bs * q),
            q,
        };
        let out = AcceptBuffers {
            accepted_nodes: slice_mut(self.accepted_nodes, bs * w),
            accepted_tokens: slice_mut(self.accepted_tokens, bs * w),
            accept_index: slice_mut(self.accept_index, bs * w),
            accept_len: slice_mut(self.accept_len, bs),
            bonus: slice_mut(self.bonus, bs),
            status: slice_mut(self.status, bs),
        };
        (links, out)
    }
}

/// SPEC stage 4, greedy: walk along the argmax of `target_logits` `[bs, Q, V]`.
#[pyfunction]
fn accept_greedy(py: Python<'_>, target_logits: TensorArg, args: AcceptArgs) -> PyResult<()> {
    match target_logits.logits_dtype("target_logits")? {
        LogitsDtype::F32 => accept_greedy_as::<f32>(py, &target_logits, &args),
        LogitsDtype::F16 => accept_greedy_as::<f16>(py, &target_logits, &args),
        LogitsDtype::Bf16 => accept_greedy_as::<bf16>(py, &target_logits, &args),
    }
}

fn accept_greedy_as<T: Element>(
    py: Python<'_>,
    target: &TensorArg,
    args: &AcceptArgs,
) -> PyResult<()> {
    // SAFETY: live, checked tensors (tensor.rs).
    let target: Logits3<'_, T> = unsafe { target.logits3("target_logits")? };
    let (links, out) = unsafe { args.split() };
    py.detach(|| batch::accept_tree(links, Posterior::Greedy(target), out))
        .map_err(errors::to_py)
}

/// SPEC stage 4, sampling: per-request `temperature` / `top_k` / `top_p` (`[bs]` float64,
/// int64, float64; temperature 0 is greedy, top_k ≤ 0 no cap), random numbers keyed by `seed`.
#[pyfunction]
#[pyo3(signature = (target_logits, args, temperature, top_k, top_p, seed))]
fn accept_sampled(
    py: Python<'_>,
    target_logits: TensorArg,
    args: AcceptArgs,
    temperature: usize,
    top_k: usize,
    top_p: usize,
    seed: u64,
) -> PyResult<()> {
    // SAFETY: live, checked tensors (tensor.rs).
    let params: Vec<SamplingParams> = unsafe {
        let (t, k, p) = (
            slice::<f64>(temperature, args.bs),
            slice::<i64>(top_k, args.bs),
            slice::<f64>(top_p, args.bs),
        );
        (0..args.bs)
            .map(|b| SamplingParams {
                temperature: t[b],
                top_k: k[b].max(0) as usize,
                top_p: p[b],
            })
            .collect()
    };
    match target_logits.logits_dtype("target_logits")? {
        LogitsDtype::F32 => accept_sampled_as::<f32>(py, &target_logits, &args, &params, seed),
        LogitsDtype::F16 => accept_sampled_as::<f16>(py, &target_logits, &args, &params, seed),
        LogitsDtype::Bf16 => accept_sampled_as::<bf16>(py, &target_logits, &args, &params, seed),
    }
}

fn accept_sampled_as<T: Element>(
    py: Python<'_>,
    target: &TensorArg,
    args: &AcceptArgs,
    params: &[SamplingParams],
    seed: u64,
) -> PyResult<()> {
    // SAFETY: live, checked tensors (tensor.rs).
    let target: Logits3<'_, T> = unsafe { target.logits3("target_logits")? };
    let (links, out) = unsafe { args.split() };
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
    ancestor_bits: usize,
    bs: usize,
    q: usize,
    seq_lens: usize,
    write_prefix: bool,
    out: usize,
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

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(build_tree, m)?)?;
    m.add_function(wrap_pyfunction!(accept_greedy, m)?)?;
    m.add_function(wrap_pyfunction!(select_emit, m)?)?;
    m.add_function(wrap_pyfunction!(accept_tokens, m)?)?;
    m.add_function(wrap_pyfunction!(accept_sampled, m)?)?;
    m.add_function(wrap_pyfunction!(sglang_custom_mask, m)?)?;
    m.add_class::<engine::CudaEngine>()?;
    m.add_function(wrap_pyfunction!(cuda::cuda_build_tree, m)?)?;
    m.add_function(wrap_pyfunction!(cuda::cuda_full_mask, m)?)?;
    m.add_function(wrap_pyfunction!(cuda::cuda_images, m)?)?;
    m.add_function(wrap_pyfunction!(cuda::cuda_prepare, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_round::cuda_accept, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_round::cuda_kept_slots, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_round::cuda_compact_kv, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_round::cuda_gather_hidden, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_round::cuda_mapped_pointer, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_round::readback_layout, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_round::cuda_tree_attention, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_round::attention_tile, m)?)?;
    m.add("CUDA_MAX_BUDGET", ddtree_cuda::launch::MAX_BUDGET)?;
    m.add("CUDA_MAX_K", ddtree_cuda::launch::MAX_K)?;
    m.add("CUDA_MAX_DEPTH", ddtree_cuda::launch::MAX_DEPTH)?;
    m.add("MAX_DEPTH", ddtree_core::select::MAX_DEPTH)?;
    m.add("MAX_BUDGET", batch::MAX_BUDGET)?;
    for (name, code) in ddtree_core::status::ALL {
        m.add(format!("STATUS_{name}").as_str(), code)?;
    }
    Ok(())
}
