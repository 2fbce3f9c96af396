//! The GPU entry points of SPEC stages 4–5: accept, kept slots, KV compaction, hidden gather.

use crate::cuda::logits_of;
use crate::errors;
use crate::tensor::TensorArg;
use ddtree_cuda::{AcceptPtrs, CommitPath, Sampling, WalkTree};
use pyo3::prelude::*;

/// Tree links the walk reads (device pointers of int64 `[bs, Q]`).
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub struct WalkTreeArg {
    verify_ids: usize,
    first_child: usize,
    next_sibling: usize,
}

/// The walk's outputs (device pointers).
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub struct AcceptOutArg {
    accepted_nodes: usize,
    accepted_tokens: usize,
    accept_index: usize,
    accept_len: usize,
    bonus: usize,
}

/// Per-request sampling parameters and the generator's device state (device pointers).
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub struct SamplingArg {
    temperature: usize,
    top_k: usize,
    top_p: usize,
    rng: usize,
}

/// SPEC stage 4 on the GPU; greedy when `sampling` is None. Never synchronizes.
#[pyfunction]
#[pyo3(signature = (device, stream, target_logits, path_len, tree, out, sampling=None))]
#[allow(clippy::too_many_arguments)]
pub fn cuda_accept(
    py: Python<'_>,
    device: usize,
    stream: usize,
    target_logits: TensorArg,
    path_len: usize,
    tree: WalkTreeArg,
    out: AcceptOutArg,
    sampling: Option<SamplingArg>,
) -> PyResult<()> {
    let target = logits_of(&target_logits, "target_logits")?;
    let tree = WalkTree {
        verify_ids: tree.verify_ids as u64,
        first_child: tree.first_child as u64,
        next_sibling: tree.next_sibling as u64,
    };
    let out = AcceptPtrs {
        accepted_nodes: out.accepted_nodes as u64,
        accepted_tokens: out.accepted_tokens as u64,
        accept_index: out.accept_index as u64,
        accept_len: out.accept_len as u64,
        bonus: out.bonus as u64,
    };
    let sampling = sampling.map(|s| Sampling {
        temperature: s.temperature as u64,
        top_k: s.top_k as u64,
        top_p: s.top_p as u64,
        rng: s.rng as u64,
    });
    // SAFETY: the Python layer passes live CUDA tensors of the checked shapes.
    py.detach(|| unsafe {
        ddtree_cuda::accept_tree(device, stream as u64, target, path_len, tree, out, sampling)
    })
    .map_err(errors::cuda_to_py)
}

fn path(bs: usize, q: usize, path_len: usize, accepted_nodes: usize) -> CommitPath {
    CommitPath {
        bs,
        q,
        path_len,
        accepted_nodes: accepted_nodes as u64,
    }
}

/// SPEC stage 5: kept slots `[bs, L+1]` and the release mask `[bs, Q]` on the GPU.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn cuda_kept_slots(
    py: Python<'_>,
    device: usize,
    stream: usize,
    bs: usize,
    q: usize,
    path_len: usize,
    accepted_nodes: usize,
    window: usize,
    kept: usize,
    release: usize,
) -> PyResult<()> {
    let p = path(bs, q, path_len, accepted_nodes);
    // SAFETY: live CUDA tensors of the checked shapes.
    py.detach(|| unsafe {
        ddtree_cuda::kept_slots(
            device,
            stream as u64,
            p,
            window as u64,
            kept as u64,
            release as u64,
        )
    })
    .map_err(errors::cuda_to_py)
}

/// SPEC stage 5: in-place compaction of `count` caches (a device table of base addresses).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn cuda_compact_kv(
    py: Python<'_>,
    device: usize,
    stream: usize,
    bs: usize,
    q: usize,
    path_len: usize,
    accepted_nodes: usize,
    window: usize,
    buffers: usize,
    count: usize,
    row_bytes: usize,
) -> PyResult<()> {
    let p = path(bs, q, path_len, accepted_nodes);
    // SAFETY: live CUDA tensors; `buffers` holds `count` device addresses.
    py.detach(|| unsafe {
        ddtree_cuda::compact_kv(
            device,
            stream as u64,
            p,
            window as u64,
            buffers as u64,
            count,
            row_bytes,
        )
    })
    .map_err(errors::cuda_to_py)
}

/// SPEC stage 5: the accepted nodes' hidden rows, in path order, into `out`.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn cuda_gather_hidden(
    py: Python<'_>,
    device: usize,
    stream: usize,
    bs: usize,
    q: usize,
    path_len: usize,
    accepted_nodes: usize,
    hidden: usize,
    row_bytes: usize,
    out: usize,
) -> PyResult<()> {
    let p = path(bs, q, path_len, accepted_nodes);
    // SAFETY: live CUDA tensors of the checked shapes.
    py.detach(|| unsafe {
        ddtree_cuda::gather_hidden(
            device,
            stream as u64,
            p,
            hidden as u64,
            row_bytes,
            out as u64,
        )
    })
    .map_err(errors::cuda_to_py)
}

/// The device address of pinned host memory (`host`, a pinned tensor's data pointer).
#[pyfunction]
pub fn cuda_mapped_pointer(device: usize, host: usize) -> PyResult<usize> {
    ddtree_cuda::mapped_host_pointer(device, host as u64)
        .map(|p| p as usize)
        .map_err(errors::cuda_to_py)
}

/// Kernel copy of `n` int64 words from device memory into mapped pinned host memory.
#[pyfunction]
pub fn cuda_readback(
    py: Python<'_>,
    device: usize,
    stream: usize,
    src: usize,
    dst: usize,
    n: usize,
) -> PyResult<()> {
    // SAFETY: `src` is a live CUDA tensor of n int64; `dst` came from cuda_mapped_pointer.
    py.detach(|| unsafe { ddtree_cuda::readback(device, stream as u64, src as u64, dst as u64, n) })
        .map_err(errors::cuda_to_py)
}
