//! SPEC stage 5 on the GPU (`kernels/commit.cu`): kept KV slots, in-place compaction of
//! paged caches, and the gather of the accepted nodes' hidden states.

use crate::device::enter_device;
use crate::launch::MAX_DEPTH;
use crate::params::CommitParams;
use crate::{launch_params, CudaError};
use cudarc::driver::sys::CUstream;

/// The accepted paths and the verify window they index.
#[derive(Debug, Clone, Copy)]
pub struct CommitPath {
    pub bs: usize,
    pub q: usize,
    pub path_len: usize,
    /// int64 `[bs, L+1]`, −1 padded.
    pub accepted_nodes: u64,
    /// int32 `[bs]`: the acceptance's status, where a bad index's code is recorded.
    pub status: u64,
}

impl CommitPath {
    /// The fields every commit launch shares: the paths and the status.
    fn params(&self) -> CommitParams {
        CommitParams {
            nodes: self.accepted_nodes,
            status: self.status,
            q: self.q as i32,
            path_len: self.path_len as i32,
            ..Default::default()
        }
    }
}

const COMMIT_THREADS: u32 = 256;
/// Bytes of each row one compaction block moves (`kCompactChunk`).
const COMPACT_CHUNK: usize = 1024;

/// Kept slots `[bs, L+1]` (int64, −1 padded) and the release mask `[bs, Q]` (bool) from the
/// window's slots `[bs, Q]` (int64, SGLang's `out_cache_loc`). With `slots` ≥ 0 each window
/// slot is checked against `[0, slots)`; a request with a bad node or slot gets kept −1,
/// nothing released, and a status code.
///
/// # Safety
/// Live device pointers of the stated shapes on device `ordinal`.
pub unsafe fn kept_slots(
    ordinal: usize,
    stream: u64,
    path: CommitPath,
    window: u64,
    slots: Option<usize>,
    kept: u64,
    release: u64,
) -> Result<(), CudaError> {
    let (dev, _ctx) = enter_device(ordinal)?;
    let p = CommitParams {
        window,
        slots: slots.map_or(-1, |s| s as i64),
        kept,
        release,
        ..path.params()
    };
    let grid = (path.bs as u32, 1, 1);
    launch_params(
        "cuLaunchKernel(kept_slots)",
        dev.kept_slots,
        grid,
        COMMIT_THREADS,
        0,
        stream as CUstream,
        &p,
    )
}

/// Moves, in every buffer of the device table `buffers` (`count` base addresses of
/// `[slots, row_bytes]` caches, `slots` the smallest row count), each request's accepted
/// rows to the first `accept_len` slots of its window, reading every source before writing
/// any destination. A request with a node or slot out of range moves nothing.
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
    slots: usize,
) -> Result<(), CudaError> {
    if count == 0 || row_bytes == 0 {
        return Ok(());
    }
    // The kernel stages one chunk per path entry in shared memory (`kMaxPath` of them).
    if path.path_len > MAX_DEPTH + 1 {
        return Err(CudaError::arg(format!(
            "acc: paths of {} entries exceed the GPU limit L + 1 = {}",
            path.path_len,
            MAX_DEPTH + 1
        )));
    }
    let (dev, _ctx) = enter_device(ordinal)?;
    let p = CommitParams {
        buffers,
        row_bytes: row_bytes as i64,
        slots: slots as i64,
        window,
        ..path.params()
    };
    let chunks = row_bytes.div_ceil(COMPACT_CHUNK);
    let grid = (path.bs as u32, count as u32, chunks as u32);
    launch_params(
        "cuLaunchKernel(compact_kv)",
        dev.compact_kv,
        grid,
        COMMIT_THREADS,
        0,
        stream as CUstream,
        &p,
    )
}

/// Gathers hidden rows `[bs*Q, row_bytes]` of the accepted nodes into `[bs, L+1, row_bytes]`
/// in path order (zeros past each path); a request with a node outside `[0, Q)` keeps its
/// output rows and gets a status code.
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
    let p = CommitParams {
        hidden,
        row_bytes: row_bytes as i64,
        out,
        ..path.params()
    };
    let grid = (path.bs as u32, path.path_len as u32, 1);
    launch_params(
        "cuLaunchKernel(gather_hidden)",
        dev.gather_hidden,
        grid,
        COMMIT_THREADS,
        0,
        stream as CUstream,
        &p,
    )
}
