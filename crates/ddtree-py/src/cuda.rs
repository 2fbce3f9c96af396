//! The GPU entry points: tensors from the Python layer (their addresses read here),
//! launches on its stream.

use crate::buffers::{self, data_ptr, TreeOut};
use crate::errors;
use crate::tensor::{tensor_arg, LogitsDtype, TensorArg};
use ddtree_cuda::{Dtype, Logits};
use pyo3::prelude::*;
use pyo3::types::PyDict;

pub(crate) fn logits_of(t: &TensorArg, name: &str) -> PyResult<Logits> {
    let dtype = match t.logits_dtype(name)? {
        LogitsDtype::F32 => Dtype::F32,
        LogitsDtype::F16 => Dtype::F16,
        LogitsDtype::Bf16 => Dtype::Bf16,
    };
    let (shape, strides) = t.shape3(name)?;
    Ok(Logits {
        ptr: t.ptr as u64,
        dtype,
        shape,
        strides: strides.map(|s| s as i64),
    })
}

/// SPEC stages 1–3 on the GPU, launched on the raw CUDA `stream`; never synchronizes.
#[pyfunction]
#[pyo3(signature = (device, stream, draft_logits, root_tokens, prefix_lens, budget, k, out, scratch, stages=ddtree_cuda::ALL_STAGES))]
#[allow(clippy::too_many_arguments)]
pub fn cuda_build_tree(
    py: Python<'_>,
    device: usize,
    stream: usize,
    #[pyo3(from_py_with = tensor_arg)] draft_logits: TensorArg,
    #[pyo3(from_py_with = data_ptr)] root_tokens: usize,
    #[pyo3(from_py_with = data_ptr)] prefix_lens: usize,
    budget: usize,
    k: usize,
    out: TreeOut,
    scratch: &Bound<'_, PyDict>,
    stages: u32,
) -> PyResult<()> {
    let logits = logits_of(&draft_logits, "draft_logits")?;
    let (ptrs, scratch) = (out.ptrs(), buffers::scratch(scratch)?);
    // SAFETY: the Python layer passes live CUDA tensors of the checked shapes (tensor.rs).
    // The launches are asynchronous; the GIL is released around them all the same.
    py.detach(|| unsafe {
        ddtree_cuda::build_tree(
            device,
            stream as u64,
            logits,
            root_tokens as u64,
            prefix_lens as u64,
            budget,
            k,
            ptrs,
            scratch,
            stages,
        )
    })
    .map_err(errors::cuda_to_py)
}

/// SGLang's flat FULL mask on the GPU into `out` (`out_len` bools).
#[pyfunction]
#[pyo3(signature = (device, stream, ancestor_bits, seq_lens, bs, q, write_prefix, out, out_len))]
#[allow(clippy::too_many_arguments)]
pub fn cuda_full_mask(
    py: Python<'_>,
    device: usize,
    stream: usize,
    #[pyo3(from_py_with = data_ptr)] ancestor_bits: usize,
    #[pyo3(from_py_with = data_ptr)] seq_lens: usize,
    bs: usize,
    q: usize,
    write_prefix: bool,
    #[pyo3(from_py_with = data_ptr)] out: usize,
    out_len: usize,
) -> PyResult<()> {
    // SAFETY: live CUDA tensors of the checked shapes (tensor.rs).
    py.detach(|| unsafe {
        ddtree_cuda::full_mask(
            device,
            stream as u64,
            ancestor_bits as u64,
            seq_lens as u64,
            bs,
            q,
            write_prefix,
            out as u64,
            out_len,
        )
    })
    .map_err(errors::cuda_to_py)
}

/// `(module, is_ptx, arch)` for every image embedded in this build.
#[pyfunction]
pub fn cuda_images() -> Vec<(&'static str, bool, u32)> {
    ddtree_cuda::embedded_images()
        .into_iter()
        .flat_map(|(m, imgs)| imgs.into_iter().map(move |i| (m, i.ptx, i.arch)))
        .collect()
}

/// A kernel's `(name, registers, max_threads, frame_bytes, static_smem)`.
type Resources = (String, u32, u32, u32, u32);

/// `(kernel, registers, max_threads, frame_bytes, static_smem)` of every kernel in module
/// `module`'s machine code for `arch`, read from the embedded cubin; `None` when this build
/// holds no such code.
#[pyfunction]
pub fn cuda_kernel_resources(module: &str, arch: u32) -> Option<Vec<Resources>> {
    ddtree_cuda::kernel_resources(module, arch).map(|ks| {
        ks.into_iter()
            .map(|k| {
                (
                    k.name,
                    k.registers,
                    k.max_threads,
                    k.frame_bytes,
                    k.static_smem,
                )
            })
            .collect()
    })
}

/// `(name, threads, dynamic shared memory bytes at 2 bytes an element)` of every portable
/// attention tile (kernel `ddtree_attention_{bf16,f16}_{name}`), as the launcher launches it.
#[pyfunction]
pub fn cuda_attention_tiles() -> Vec<(&'static str, usize, usize)> {
    ddtree_cuda::attention::VARIANTS
        .iter()
        .map(|v| (v.name, 32 * v.warps, v.smem_bytes(2)))
        .collect()
}

/// Loads the kernels on device `device` now (module loading is not allowed inside a graph
/// capture, so the Stepper does it at construction).
#[pyfunction]
pub fn cuda_prepare(device: usize) -> PyResult<()> {
    ddtree_cuda::prepare(device).map_err(errors::cuda_to_py)
}

/// A batch's part arrays from a dict of CUDA tensors: `values` float32 `[rows, parts, k]`
/// (its shape gives the three sizes), `ids` int64 and `maxima`, `bad`, `sums` (float32,
/// int32 `[rows, parts]`, int64 `[rows, parts, 2]`), allocated by the Python layer.
fn part_arrays(d: &Bound<'_, PyDict>) -> PyResult<ddtree_cuda::partials::PartArrays> {
    let get = |name: &str| -> PyResult<Bound<'_, PyAny>> {
        d.get_item(name)?
            .ok_or_else(|| pyo3::exceptions::PyKeyError::new_err(name.to_string()))
    };
    let values = tensor_arg(&get("values")?)?;
    let &[rows, parts, k] = values.shape.as_slice() else {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "values: must be [rows, parts, k]",
        ));
    };
    let ptr = |name: &str| -> PyResult<u64> { Ok(data_ptr(&get(name)?)? as u64) };
    Ok(ddtree_cuda::partials::PartArrays {
        rows,
        parts,
        k,
        values: values.ptr as u64,
        ids: ptr("ids")?,
        maxima: ptr("maxima")?,
        bad: ptr("bad")?,
        sums: ptr("sums")?,
    })
}

/// SPEC stage 1 as partials, on the GPU: `which` is "parts" (each part's top K, maximum
/// and flag) or "sums" (each part's fixed-point exp-sum, once every part's maximum is in
/// `arrays`), for `logits` `[bs, L, V]` cut into `chunk`-token parts placed from
/// `part_base`, token 0 being global id `id0`. Never synchronizes.
#[pyfunction]
#[pyo3(signature = (device, stream, which, logits, chunk, part_base, id0, arrays))]
#[allow(clippy::too_many_arguments)]
pub fn cuda_stage1_parts(
    py: Python<'_>,
    device: usize,
    stream: usize,
    which: &str,
    #[pyo3(from_py_with = tensor_arg)] logits: TensorArg,
    chunk: usize,
    part_base: usize,
    id0: usize,
    arrays: &Bound<'_, PyDict>,
) -> PyResult<()> {
    use ddtree_cuda::partials::{stage1_parts, PartSlice, PartStage};
    let logits = logits_of(&logits, "logits")?;
    let arrays = part_arrays(arrays)?;
    let slice = PartSlice {
        chunk,
        part_base,
        id0,
    };
    let stage = match which {
        "parts" => PartStage::Parts,
        "sums" => PartStage::Sums,
        _ => {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "which: \"parts\" or \"sums\", got {which:?}"
            )))
        }
    };
    // SAFETY: the Python layer passes live CUDA tensors of the stated shapes (tensor.rs).
    py.detach(|| unsafe { stage1_parts(stage, device, stream as u64, logits, slice, arrays) })
        .map_err(errors::cuda_to_py)
}

/// Stage 1's outputs from the part arrays: `lp` float32 / `ti` int64 `[rows, k]`,
/// `eligible` / `row_bad` int32 `[rows]`. Never synchronizes.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn cuda_stage1_merge(
    py: Python<'_>,
    device: usize,
    stream: usize,
    arrays: &Bound<'_, PyDict>,
    #[pyo3(from_py_with = data_ptr)] lp: usize,
    #[pyo3(from_py_with = data_ptr)] ti: usize,
    #[pyo3(from_py_with = data_ptr)] eligible: usize,
    #[pyo3(from_py_with = data_ptr)] row_bad: usize,
) -> PyResult<()> {
    let arrays = part_arrays(arrays)?;
    // SAFETY: as cuda_stage1_parts.
    py.detach(|| unsafe {
        ddtree_cuda::partials::stage1_merge(
            device,
            stream as u64,
            arrays,
            lp as u64,
            ti as u64,
            eligible as u64,
            row_bad as u64,
        )
    })
    .map_err(errors::cuda_to_py)
}

/// The part size that gives `rows` rows of `vocab` tokens about `blocks` part blocks in
/// all, within the merge's room for `k`-long lists (`ddtree_cuda::partials::chunk_for`).
#[pyfunction]
pub fn cuda_part_chunk(vocab: usize, k: usize, rows: usize, blocks: usize) -> usize {
    ddtree_cuda::partials::chunk_for(vocab, k, rows, blocks)
}
