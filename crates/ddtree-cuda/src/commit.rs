//! SPEC stage 5 on the GPU (`kernels/commit.cu`): kept KV slots, in-place compaction of
//! paged caches, and the gather of the accepted nodes' hidden states.

use crate::device::enter_device;
use crate::{launch, CudaError, Params};
use cudarc::driver::sys::CUstream;

/// The accepted paths and the verify window they index.
#[derive(Debug, Clone, Copy)]
pub struct CommitPath {
    pub bs: usize,
    pub q: usize,
    pub path_len: usize,
    /// int64 `[bs, L+1]`, −1 padded.
    pub accepted_nodes: u64,
}

const COMMIT_THREADS: u32 = 256;
/// Bytes of each row one compaction block moves (`kCompactChunk`).
const COMPACT_CHUNK: usize = 1024;

/// Kept slots `[bs, L+1]` (int64, −1 padded) and the release mask `[bs, Q]` (bool) from the
/// window's slots `[bs, Q]` (int64, SGLang's `out_cache_loc`).
///
/// # Safety
/// Live device pointers of the stated shapes on device `ordinal`.
pub unsafe fn kept_slots(
    ordinal: usize,
    stream: u64,
    path: CommitPath,
    window: u64,
    kept: u64,
    release: u64,
) -> Result<(), CudaError> {
    let (dev, _ctx) = enter_device(ordinal)?;
    let (q, pl) = (path.q as i32, path.path_len as i32);
    let mut p = Params::new();
    p.arg(&window)
        .arg(&path.accepted_nodes)
        .arg(&q)
        .arg(&pl)
        .arg(&kept)
        .arg(&release);
    let grid = (path.bs as u32, 1, 1);
    launch(
        "cuLaunchKernel(kept_slots)",
        dev.kept_slots,
        grid,
        COMMIT_THREADS,
        0,
        stream as CUstream,
        &mut p,
    )
}

/// Moves, in every buffer of the device table `buffers` (`count` base addresses of
/// `[slots, row_bytes]` caches), each request's accepted rows to the first `accept_len`
/// slots of its window, reading every source before writing any destination.
///
/// # Safety
/// Live device pointers; `buffers` holds `count` device addresses.
#[allow(clippy::too_many_arguments)]
pub unsafe fn compact_kv(
    ordinal: usize,
    stream: u64,
    path: CommitPath,
    window: u64,
    buffers: u64,
    count: usize,
    row_bytes: usize,
) -> Result<(), CudaError> {
    if count == 0 || row_bytes == 0 {
        return Ok(());
    }
    let (dev, _ctx) = enter_device(ordinal)?;
    let (rb, q, pl) = (row_bytes as i64, path.q as i32, path.path_len as i32);
    let mut p = Params::new();
    p.arg(&buffers)
        .arg(&rb)
        .arg(&window)
        .arg(&path.accepted_nodes)
        .arg(&q)
        .arg(&pl);
    let chunks = row_bytes.div_ceil(COMPACT_CHUNK);
    let grid = (path.bs as u32, count as u32, chunks as u32);
    launch(
        "cuLaunchKernel(compact_kv)",
        dev.compact_kv,
        grid,
        COMMIT_THREADS,
        0,
        stream as CUstream,
        &mut p,
    )
}

/// Gathers hidden rows `[bs*Q, row_bytes]` of the accepted nodes into `[bs, L+1, row_bytes]`
/// in path order (zeros past each path).
///
/// # Safety
/// Live device pointers of the stated shapes.
pub unsafe fn gather_hidden(
    ordinal: usize,
    stream: u64,
    path: CommitPath,
    hidden: u64,
    row_bytes: usize,
    out: u64,
) -> Result<(), CudaError> {
    let (dev, _ctx) = enter_device(ordinal)?;
    let (rb, q, pl) = (row_bytes as i64, path.q as i32, path.path_len as i32);
    let mut p = Params::new();
    p.arg(&hidden)
        .arg(&rb)
        .arg(&path.accepted_nodes)
        .arg(&q)
        .arg(&pl)
        .arg(&out);
    let grid = (path.bs as u32, path.path_len as u32, 1);
    launch(
        "cuLaunchKernel(gather_hidden)",
        dev.gather_hidden,
        grid,
        COMMIT_THREADS,
        0,
        stream as CUstream,
        &mut p,
    )
}

/// The device address of pinned host memory at `host`, when the driver maps it into the
/// device's address space (pinned allocations are mapped under unified addressing), so
/// kernels can store into it.
pub fn mapped_host_pointer(ordinal: usize, host: u64) -> Result<u64, CudaError> {
    let (_dev, _ctx) = enter_device(ordinal)?;
    let mut out: u64 = 0;
    // SAFETY: the attribute query writes one CUdeviceptr into `out`.
    let rc = unsafe {
        cudarc::driver::sys::cuPointerGetAttribute(
            (&mut out as *mut u64).cast(),
            cudarc::driver::sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_POINTER,
            host,
        )
    };
    rc.result()
        .map_err(|e| CudaError::driver("cuPointerGetAttribute(DEVICE_POINTER)", e))?;
    Ok(out)
}

/// Copies `n` int64 words from device memory `src` to the mapped pinned memory at device
/// address `dst` with a kernel (no copy engine).
///
/// # Safety
/// `src` holds `n` words on device `ordinal`; `dst` comes from [`mapped_host_pointer`].
pub unsafe fn readback(
    ordinal: usize,
    stream: u64,
    src: u64,
    dst: u64,
    n: usize,
) -> Result<(), CudaError> {
    let (dev, _ctx) = enter_device(ordinal)?;
    let n = n as i32;
    let mut p = Params::new();
    p.arg(&src).arg(&dst).arg(&n);
    let blocks = (n as u32).div_ceil(COMMIT_THREADS).clamp(1, 8);
    launch(
        "cuLaunchKernel(readback)",
        dev.readback,
        (blocks, 1, 1),
        COMMIT_THREADS,
        0,
        stream as CUstream,
        &mut p,
    )
}
