//! SPEC stage 4 on the GPU: the walk along the target's posterior tokens, one cluster of
//! blocks per request (`kernels/accept.cu`).

use crate::device::{enter_device, Device};
use crate::params::AcceptParams;
use crate::{CudaError, Dtype, Kernel, Logits, Params};

/// Threads per block of the accept kernel (`kAcceptThreads`).
pub const ACCEPT_THREADS: u32 = 256;
/// Blocks per request, one thread-block cluster (`kAcceptCluster`, fixed in the kernel).
pub const ACCEPT_CLUSTER: u32 = 8;
/// Dynamic shared memory for a block's cached row slice, at most (`kSliceCacheCap`).
pub const SLICE_CACHE_CAP: usize = 76 * 1024;
/// Trees up to this Q keep their links (3 int32 per node) in shared memory (`kLinkCap`).
pub const LINK_CAP: usize = 1024;
/// Dynamic shared memory an accept block may ask for: a slice and the links.
pub const ACCEPT_SMEM_CAP: usize = SLICE_CACHE_CAP + 12 * LINK_CAP;
/// `AcceptParams::flags`: each block keeps its row slice in dynamic shared memory
/// (`kAcceptCacheSlice`); a draw takes sample_row's passes, not the shortlist's
/// (`kAcceptExhaustive`).
pub const ACCEPT_CACHE_SLICE: i32 = 1;
pub const ACCEPT_EXHAUSTIVE: i32 = 2;
/// Largest vocabulary the accept kernel's order keys hold (`kIdBits`).
pub const ACCEPT_MAX_VOCAB: usize = 1 << 24;

/// The tree links the walk reads (int64 `[bs, Q]` each).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WalkTree {
    pub verify_ids: u64,
    pub first_child: u64,
    pub next_sibling: u64,
}

/// The walk's outputs: int64 `[bs, L+1]` paths, int64 `[bs]` scalars and the int32 `[bs]`
/// status (corrupt tree links).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AcceptPtrs {
    pub accepted_nodes: u64,
    pub accepted_tokens: u64,
    pub accept_index: u64,
    pub accept_len: u64,
    pub bonus: u64,
    pub status: u64,
}

/// Per-request sampling parameters (float32 / int32 / float32 `[bs]`) and the generator's
/// device state (int64 `[2]`: seed, offset; the offset advances after every call).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sampling {
    pub temperature: u64,
    pub top_k: u64,
    pub top_p: u64,
    pub rng: u64,
}

/// The walk for every request of `target` (`[bs, Q, V]`); greedy when `sampling` is None.
///
/// # Safety
/// Every pointer must address live device memory of the stated shape on device `ordinal`.
pub unsafe fn accept_tree(
    ordinal: usize,
    stream: u64,
    target: Logits,
    path_len: usize,
    tree: WalkTree,
    out: AcceptPtrs,
    sampling: Option<Sampling>,
) -> Result<(), CudaError> {
    let (dev, _ctx) = enter_device(ordinal)?;
    let (p, kernels) = accept_launches(&dev, target, path_len, tree, out, sampling)?;
    for k in kernels {
        k.launch(stream, &mut Params::one(&p))?;
    }
    Ok(())
}

/// The walk's parameter struct and its launches: the walk, then (sampling) the
/// generator's advance, both taking the struct.
pub(crate) fn accept_launches(
    dev: &Device,
    target: Logits,
    path_len: usize,
    tree: WalkTree,
    out: AcceptPtrs,
    sampling: Option<Sampling>,
) -> Result<(AcceptParams, Vec<Kernel>), CudaError> {
    let [bs, q, vocab] = target.shape;
    if bs == 0 || q == 0 || vocab == 0 || vocab > ACCEPT_MAX_VOCAB || path_len == 0 {
        return Err(CudaError::arg(format!(
            "target_logits: shape {:?} outside the accept kernel's limits (V <= {ACCEPT_MAX_VOCAB})",
            target.shape
        )));
    }
    let f = match sampling {
        Some(_) => dev.accept_sampled[target.dtype.index()],
        None => dev.accept[target.dtype.index()],
    };
    let [s0, s1, s2] = target.strides;
    let cache = sampling.map_or(0, |_| slice_cache_bytes(vocab, target.dtype));
    let links = if q <= LINK_CAP { 12 * q } else { 0 };
    let p = AcceptParams {
        logits: target.ptr,
        s0,
        s1,
        s2,
        tree,
        out,
        sampling: sampling.unwrap_or_default(),
        v: vocab as i32,
        q: q as i32,
        path_len: path_len as i32,
        flags: accept_flags(cache > 0, dev.sampling_exhaustive),
    };
    let mut kernels = vec![Kernel {
        call: "cuLaunchKernel(accept)",
        f,
        grid: (bs as u32 * ACCEPT_CLUSTER, 1, 1),
        block: ACCEPT_THREADS,
        smem: cache + links,
    }];
    if sampling.is_some() {
        kernels.push(Kernel {
            call: "cuLaunchKernel(advance_rng)",
            f: dev.advance_rng,
            grid: (1, 1, 1),
            block: 1,
            smem: 0,
        });
    }
    Ok((p, kernels))
}

/// `AcceptParams::flags` for a launch.
fn accept_flags(cache_slice: bool, exhaustive: bool) -> i32 {
    let mut flags = 0;
    if cache_slice {
        flags |= ACCEPT_CACHE_SLICE;
    }
    if exhaustive {
        flags |= ACCEPT_EXHAUSTIVE;
    }
    flags
}

/// Bytes of one block's row slice (`accept_slice_len`), or 0 when it exceeds the cache cap
/// and the sampling passes re-read global memory.
pub fn slice_cache_bytes(vocab: usize, dtype: Dtype) -> usize {
    let unit = ACCEPT_CLUSTER as usize * 8;
    let bytes = vocab.div_ceil(unit) * 8 * dtype.size();
    if bytes <= SLICE_CACHE_CAP {
        bytes
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slice_cache_fits_the_vocabularies_we_serve() {
        // Qwen/Kimi vocabularies: cached in every dtype.
        assert_eq!(slice_cache_bytes(151_936, Dtype::Bf16), 18_992 * 2);
        assert_eq!(slice_cache_bytes(151_936, Dtype::F32), 18_992 * 4);
        assert_eq!(slice_cache_bytes(163_840, Dtype::F16), 20_480 * 2);
        // A 256k vocabulary in fp32 exceeds the cap: read from global memory instead.
        assert_eq!(slice_cache_bytes(262_144, Dtype::F32), 0);
        assert_eq!(slice_cache_bytes(5, Dtype::Bf16), 16);
    }

    #[test]
    fn flags_are_the_headers_bits() {
        // params.h: kAcceptCacheSlice = 1, kAcceptExhaustive = 2.
        let header = include_str!("../../../kernels/include/ddtree/params.h");
        assert!(header.contains("constexpr int kAcceptCacheSlice = 1;"));
        assert!(header.contains("constexpr int kAcceptExhaustive = 2;"));
        assert_eq!(accept_flags(false, false), 0);
        assert_eq!(accept_flags(true, false), 1);
        assert_eq!(accept_flags(false, true), 2);
        assert_eq!(accept_flags(true, true), 3);
    }
}
