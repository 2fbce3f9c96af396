//! The GPU entry points of SPEC stages 4–5: accept, kept slots, KV compaction, hidden gather.

use crate::buffers::{data_ptr, AccOut, Links, SamplingOut};
use crate::cuda::logits_of;
use crate::errors;
use crate::tensor::{tensor_arg, TensorArg};
use ddtree_cuda::SlotLayout;
use pyo3::prelude::*;
use std::collections::HashMap;

/// SPEC stage 4 on the GPU; greedy when `sampling` is None. Never synchronizes.
#[pyfunction]
#[pyo3(signature = (device, stream, target_logits, tree, acc, sampling=None))]
pub fn cuda_accept(
    py: Python<'_>,
    device: usize,
    stream: usize,
    #[pyo3(from_py_with = tensor_arg)] target_logits: TensorArg,
    tree: Links,
    acc: AccOut,
    sampling: Option<SamplingOut>,
) -> PyResult<()> {
    let target = logits_of(&target_logits, "target_logits")?;
    let (path_len, tree, out) = (acc.path_len(), tree.walk(), acc.ptrs());
    let sampling = sampling.map(|s| s.ptrs());
    // SAFETY: the Python layer passes live CUDA tensors of the checked shapes.
    py.detach(|| unsafe {
        ddtree_cuda::accept_tree(device, stream as u64, target, path_len, tree, out, sampling)
    })
    .map_err(errors::cuda_to_py)
}

/// SPEC stage 4 over this rank's vocabulary shard `[bs, Q, V_r]` (token 0 = global id
/// `vocab_start`, of `vocab` in all): every node's greedy and draw keys into the uint64
/// (int64) `[bs, Q]` tensors `greedy` and `sampled`. Never synchronizes.
#[pyfunction]
#[pyo3(signature = (device, stream, shard, vocab_start, vocab, greedy, sampled, sampling=None))]
#[allow(clippy::too_many_arguments)]
pub fn cuda_shard_keys(
    py: Python<'_>,
    device: usize,
    stream: usize,
    #[pyo3(from_py_with = tensor_arg)] shard: TensorArg,
    vocab_start: usize,
    vocab: usize,
    #[pyo3(from_py_with = data_ptr)] greedy: usize,
    #[pyo3(from_py_with = data_ptr)] sampled: usize,
    sampling: Option<SamplingOut>,
) -> PyResult<()> {
    use ddtree_cuda::shard_accept::{shard_key_params, shard_keys, ShardKeys};
    let shard = logits_of(&shard, "target_logits")?;
    let keys = ShardKeys {
        greedy: greedy as u64,
        sampled: sampled as u64,
    };
    let p = shard_key_params(shard, vocab_start, vocab, keys, sampling.map(|s| s.ptrs()))
        .map_err(errors::cuda_to_py)?;
    // SAFETY: the Python layer passes live CUDA tensors of the checked shapes.
    py.detach(|| unsafe { shard_keys(device, stream as u64, shard.dtype, &p) })
        .map_err(errors::cuda_to_py)
}

/// SPEC stage 4's walk along `tp` ranks' gathered keys (int64 `[tp, bs, Q]` each) into
/// `acc`; `temperature` the sampling state's float32 `[bs]`, or None for a greedy batch.
/// Never synchronizes.
#[pyfunction]
#[pyo3(signature = (device, stream, tp, greedy, sampled, tree, acc, temperature=None))]
#[allow(clippy::too_many_arguments)]
pub fn cuda_walk_keys(
    py: Python<'_>,
    device: usize,
    stream: usize,
    tp: usize,
    #[pyo3(from_py_with = data_ptr)] greedy: usize,
    #[pyo3(from_py_with = data_ptr)] sampled: usize,
    tree: Links,
    acc: AccOut,
    temperature: Option<Bound<'_, PyAny>>,
) -> PyResult<()> {
    use ddtree_cuda::shard_accept::{key_walk_params, walk_keys, ShardKeys};
    let temperature = temperature.map(|t| data_ptr(&t)).transpose()?;
    let gathered = ShardKeys {
        greedy: greedy as u64,
        sampled: sampled as u64,
    };
    let shape = [tree.bs(), tree.q()];
    let p = key_walk_params(
        tp,
        shape,
        acc.path_len(),
        gathered,
        temperature.map(|t| t as u64),
        tree.walk(),
        acc.ptrs(),
    )
    .map_err(errors::cuda_to_py)?;
    // SAFETY: the Python layer passes live CUDA tensors of the checked shapes.
    py.detach(|| unsafe { walk_keys(device, stream as u64, &p) })
        .map_err(errors::cuda_to_py)
}

/// SPEC stage 5: kept slots `[bs, L+1]` and the release mask `[bs, Q]` on the GPU.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn cuda_kept_slots(
    py: Python<'_>,
    device: usize,
    stream: usize,
    acc: AccOut,
    q: usize,
    #[pyo3(from_py_with = data_ptr)] window: usize,
    slots: Option<usize>,
    #[pyo3(from_py_with = data_ptr)] kept: usize,
    #[pyo3(from_py_with = data_ptr)] release: usize,
) -> PyResult<()> {
    let p = acc.path(q);
    // SAFETY: live CUDA tensors of the checked shapes.
    py.detach(|| unsafe {
        ddtree_cuda::kept_slots(
            device,
            stream as u64,
            p,
            window as u64,
            slots,
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
    acc: AccOut,
    q: usize,
    #[pyo3(from_py_with = data_ptr)] window: usize,
    #[pyo3(from_py_with = data_ptr)] buffers: usize,
    count: usize,
    row_bytes: usize,
    slots: usize,
) -> PyResult<()> {
    let p = acc.path(q);
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
            slots,
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
    acc: AccOut,
    q: usize,
    #[pyo3(from_py_with = data_ptr)] hidden: usize,
    row_bytes: usize,
    #[pyo3(from_py_with = data_ptr)] out: usize,
) -> PyResult<()> {
    let p = acc.path(q);
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

/// Whether the driver maps pinned host tensor `host` into device `device`'s address space
/// (the readback ring needs it).
#[pyfunction]
pub fn cuda_maps_host(device: usize, #[pyo3(from_py_with = data_ptr)] host: usize) -> bool {
    ddtree_cuda::mapped_host_pointer(device, host as u64).is_ok()
}

/// The readback ring's host reader (`RingReader`): copies the newest whole slot with a
/// stamp above `after` into `out` and returns its stamp, or None. `host` is the pinned
/// ring (`nslots * slot_words` int64), `out` a host buffer of `slot_words` int64.
#[pyfunction]
pub fn readback_newest(
    #[pyo3(from_py_with = data_ptr)] host: usize,
    nslots: usize,
    slot_words: usize,
    after: i64,
    #[pyo3(from_py_with = data_ptr)] out: usize,
) -> Option<i64> {
    // SAFETY: the Python ring passes its live pinned tensor of nslots * slot_words int64
    // words and a buffer of slot_words.
    let (reader, out) = unsafe {
        (
            ddtree_cuda::RingReader::new(host as *const i64, nslots, slot_words),
            crate::tensor::slice_mut::<i64>(out, slot_words),
        )
    };
    reader.newest(after, out)
}

/// Word offsets of a readback slot's fields for `bs` requests (`SlotLayout`), and the words
/// a slot for `max_batch` needs: {"accept_len", "bonus", "accepted_tokens", "status",
/// "end", "slot_words"}.
#[pyfunction]
pub fn readback_layout(
    bs: usize,
    path_len: usize,
    max_batch: usize,
) -> HashMap<&'static str, usize> {
    let l = SlotLayout::of(bs, path_len);
    HashMap::from([
        ("accept_len", l.accept_len),
        ("bonus", l.bonus),
        ("accepted_tokens", l.accepted_tokens),
        ("status", l.status),
        ("end", l.end),
        ("slot_words", SlotLayout::slot_words(max_batch, path_len)),
    ])
}

/// The attention kernels' `AttentionParams` but the launch geometry (which the launcher
/// fills): the tensors (their addresses and row strides read here), shapes and scalars.
/// `part` and `status` are the workspace's: absent when an engine supplies its own
/// (`CudaEngine.tree_attention`); a given `status` replaces the workspace's there. The key
/// splits come from the workspace's `AttentionPlan` (Rust), never from Python.
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub struct AttentionArg<'py> {
    q: Bound<'py, PyAny>,
    k_new: Bound<'py, PyAny>,
    v_new: Bound<'py, PyAny>,
    k_cache: Bound<'py, PyAny>,
    v_cache: Bound<'py, PyAny>,
    out: Bound<'py, PyAny>,
    #[pyo3(from_py_with = data_ptr)]
    kv_indptr: usize,
    #[pyo3(from_py_with = data_ptr)]
    kv_indices: usize,
    #[pyo3(from_py_with = data_ptr)]
    prefix_lens: usize,
    #[pyo3(from_py_with = data_ptr)]
    ancestor_bits: usize,
    lse: Option<Bound<'py, PyAny>>,
    #[pyo3(default)]
    part: Option<Bound<'py, PyAny>>,
    #[pyo3(default)]
    status: Option<Bound<'py, PyAny>>,
    num_indices: i64,
    num_slots: i64,
    sm_scale_log2: f32,
    index64: bool,
    f16: bool,
    shape: [i32; 8],
}

/// The scratch a launch writes: the partial results, the per-request status, the splits.
#[derive(Debug, Clone, Copy)]
pub struct Scratch {
    pub part: u64,
    pub status: u64,
    pub splits: i32,
}

impl AttentionArg<'_> {
    /// The `[bs, Q, Hq, Hkv, Dqk, Dv, page_shift, words]` of the call.
    pub fn shape(&self) -> [i32; 8] {
        self.shape
    }

    /// The workspace scratch the call carries (the functional API), split by `plan`, or an
    /// error naming `workspace`.
    fn own_scratch(&self, plan: &AttentionPlan) -> PyResult<Scratch> {
        let (Some(part), Some(status)) = (&self.part, &self.status) else {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "workspace: the call carries no attention workspace",
            ));
        };
        Ok(Scratch {
            part: data_ptr(part)? as u64,
            status: data_ptr(status)? as u64,
            splits: plan.splits(self.shape[0] as usize)? as i32,
        })
    }

    /// The caller's `status` tensor, if it gave one.
    pub fn status(&self) -> PyResult<Option<u64>> {
        self.status
            .as_ref()
            .map(|s| data_ptr(s).map(|p| p as u64))
            .transpose()
    }

    /// Launches the call on `stream` of `device` with `scratch`, the GIL released.
    pub fn launch(&self, py: Python<'_>, device: usize, stream: u64, w: Scratch) -> PyResult<()> {
        let (q, q_s0, q_s1) = rows(&self.q, "q")?;
        let (k_new, kn_s0, kn_s1) = rows(&self.k_new, "k_new")?;
        let (v_new, vn_s0, vn_s1) = rows(&self.v_new, "v_new")?;
        let (k_cache, kc_s0, kc_s1) = rows(&self.k_cache, "k_cache")?;
        let (v_cache, vc_s0, vc_s1) = rows(&self.v_cache, "v_cache")?;
        let (out, o_s0, o_s1) = rows(&self.out, "out")?;
        let lse = self.lse.as_ref().map_or(Ok(0), data_ptr)? as u64;
        let [bs, q_nodes, hq, hkv, dqk, dv, page_shift, words] = self.shape;
        let p = ddtree_cuda::attention::AttentionParams {
            q,
            k_new,
            v_new,
            k_cache,
            v_cache,
            kv_indptr: self.kv_indptr as u64,
            kv_indices: self.kv_indices as u64,
            prefix_lens: self.prefix_lens as u64,
            ancestor_bits: self.ancestor_bits as u64,
            out,
            lse,
            part: w.part,
            status: w.status,
            q_s0,
            q_s1,
            kn_s0,
            kn_s1,
            vn_s0,
            vn_s1,
            kc_s0,
            kc_s1,
            vc_s0,
            vc_s1,
            o_s0,
            o_s1,
            num_indices: self.num_indices,
            num_slots: self.num_slots,
            sm_scale_log2: self.sm_scale_log2,
            index64: i32::from(self.index64),
            bs,
            q_nodes,
            hq,
            hkv,
            dqk,
            dv,
            page_shift,
            words,
            splits: w.splits,
            ..Default::default()
        };
        // V a view of K (MLA's absorbed form): the kernel may read the values from its K
        // tiles.
        let v_in_k = v_cache == k_cache
            && (vc_s0, vc_s1) == (kc_s0, kc_s1)
            && v_new == k_new
            && (vn_s0, vn_s1) == (kn_s0, kn_s1);
        let f16 = self.f16;
        // SAFETY: the Python layer checked every tensor's shape, dtype, device and strides;
        // the scratch is the workspace's, sized for these shapes.
        py.detach(|| unsafe {
            ddtree_cuda::attention::tree_attention(device, stream, p, f16, v_in_k)
        })
        .map_err(errors::cuda_to_py)
    }
}

/// A row-major tensor the attention kernels read with 16-byte vector loads: its address
/// and first two strides (elements), or the `ValueError` naming it.
fn rows(t: &Bound<'_, PyAny>, name: &str) -> PyResult<(u64, i64, i64)> {
    let ptr = data_ptr(t)? as u64;
    let (s0, s1): (i64, i64) = (
        t.call_method1("stride", (0,))?.extract()?,
        t.call_method1("stride", (1,))?.extract()?,
    );
    if ptr % 16 != 0 || s0 % 8 != 0 || s1 % 8 != 0 {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "{name}: rows must be 16-byte aligned (strides multiples of 8)"
        )));
    }
    Ok((ptr, s0, s1))
}

/// Tree verify attention on the GPU with the call's own workspace and its `plan`: the
/// index check, the attention blocks and the merge.
#[pyfunction]
pub fn cuda_tree_attention(
    py: Python<'_>,
    device: usize,
    stream: usize,
    a: AttentionArg<'_>,
    plan: PyRef<'_, AttentionPlan>,
) -> PyResult<()> {
    let w = a.own_scratch(&plan)?;
    a.launch(py, device, stream as u64, w)
}

/// An attention workspace's launch plan (`SplitPlan`): the key splits per batch size and
/// the size of the partial results, for the blocks its device holds at once. Opaque to
/// Python but for what a workspace allocates and reports.
#[pyclass(module = "ddtree._core", name = "AttentionPlan", frozen)]
pub struct AttentionPlan(pub ddtree_cuda::attention::SplitPlan);

#[pymethods]
impl AttentionPlan {
    /// The plan for calls of up to `max_batch` requests of `q_nodes` nodes with `hq` query
    /// heads over `hkv` KV heads, head dims `dqk`/`dv`, on CUDA device `device`; a
    /// `ValueError` naming `dqk` when no compiled tile holds it (or the heads do not divide).
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(
        device: usize,
        max_batch: usize,
        q_nodes: usize,
        hq: usize,
        hkv: usize,
        dqk: usize,
        dv: usize,
    ) -> PyResult<Self> {
        split_plan(device, max_batch, q_nodes, (hq, hkv), (dqk, dv))?
            .map(Self)
            .ok_or_else(|| {
                pyo3::exceptions::PyValueError::new_err(format!(
                    "dqk: no compiled tile for {hq} query heads over {hkv} KV heads of head \
                     dim {dqk}"
                ))
            })
    }

    /// Key splits per request in a call of `bs` requests (1 ≤ bs ≤ max_batch).
    fn splits(&self, bs: usize) -> PyResult<usize> {
        if bs == 0 || bs > self.0.splits.len() {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "bs: must be in 1..={}, got {bs}",
                self.0.splits.len()
            )));
        }
        Ok(self.0.splits_for(bs))
    }

    /// fp32 elements of the partial results a workspace holds (0: no batch splits).
    #[getter]
    fn part_floats(&self) -> usize {
        self.0.part_floats
    }

    /// The kernel tile the plan's calls take ("sm90a_d576vk": the Hopper kernel).
    #[getter]
    fn tile(&self) -> &str {
        &self.0.tile
    }
}

/// `SplitPlan::new` for the blocks device `device` holds at once.
pub fn split_plan(
    device: usize,
    max_batch: usize,
    q_nodes: usize,
    heads: (usize, usize),
    dims: (usize, usize),
) -> PyResult<Option<ddtree_cuda::attention::SplitPlan>> {
    let resident = ddtree_cuda::attention::resident_blocks(device, dims.0, dims.1)
        .map_err(errors::cuda_to_py)?;
    Ok(resident.and_then(|(v, r)| {
        ddtree_cuda::attention::SplitPlan::new(max_batch, q_nodes, heads, dims, (&v, r))
    }))
}

/// The device table of the caches' base addresses (int64 `[n]` on `device`), which
/// `cuda_compact_kv` reads; built once per registration.
#[pyfunction]
pub fn cuda_cache_table<'py>(
    py: Python<'py>,
    caches: Vec<Bound<'py, PyAny>>,
    device: Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let ptrs = caches
        .iter()
        .map(|c| data_ptr(c).map(|p| p as i64))
        .collect::<PyResult<Vec<i64>>>()?;
    let torch = py.import("torch")?;
    let kwargs = pyo3::types::PyDict::new(py);
    kwargs.set_item("dtype", torch.getattr("int64")?)?;
    torch
        .call_method("tensor", (ptrs,), Some(&kwargs))?
        .call_method1("to", (device,))
}
