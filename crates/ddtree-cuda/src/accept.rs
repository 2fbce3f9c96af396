//! SPEC stage 4 on the GPU: the walk along the target's posterior tokens, one block per
//! request (`kernels/accept.cu`).

use crate::device::{device, ContextGuard};
use crate::{launch, CudaError, Dtype, Logits, Params};
use cudarc::driver::sys::CUstream;

/// Threads per block of the accept kernel (`kAcceptThreads`).
pub const ACCEPT_THREADS: u32 = 1024;
/// Largest vocabulary the accept kernel's order keys hold (`kIdBits`).
pub const ACCEPT_MAX_VOCAB: usize = 1 << 24;

/// The tree links the walk reads (int64 `[bs, Q]` each).
#[derive(Debug, Clone, Copy)]
pub struct WalkTree {
    pub verify_ids: u64,
    pub first_child: u64,
    pub next_sibling: u64,
}

/// The walk's outputs: int64 `[bs, L+1]` paths and int64 `[bs]` scalars.
#[derive(Debug, Clone, Copy)]
pub struct AcceptPtrs {
    pub accepted_nodes: u64,
    pub accepted_tokens: u64,
    pub accept_index: u64,
    pub accept_len: u64,
    pub bonus: u64,
}

/// Per-request sampling parameters (float32 / int32 / float32 `[bs]`) and the generator's
/// device state (int64 `[2]`: seed, offset; the offset advances after every call).
#[derive(Debug, Clone, Copy)]
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
    let [bs, q, vocab] = target.shape;
    if bs == 0 || q == 0 || vocab == 0 || vocab > ACCEPT_MAX_VOCAB || path_len == 0 {
        return Err(CudaError::arg(format!(
            "target_logits: shape {:?} outside the accept kernel's limits (V <= {ACCEPT_MAX_VOCAB})",
            target.shape
        )));
    }
    let dev = device(ordinal)?;
    let _ctx = ContextGuard::enter(dev.ctx.cu_ctx())?;
    let f = dev.accept[match target.dtype {
        Dtype::F32 => 0,
        Dtype::F16 => 1,
        Dtype::Bf16 => 2,
    }];
    let [s0, s1, s2] = target.strides;
    let (v, qq, pl) = (vocab as i32, q as i32, path_len as i32);
    let s = sampling.unwrap_or(Sampling {
        temperature: 0,
        top_k: 0,
        top_p: 0,
        rng: 0,
    });
    let mut p = Params::new();
    p.arg(&target.ptr)
        .arg(&s0)
        .arg(&s1)
        .arg(&s2)
        .arg(&v)
        .arg(&qq)
        .arg(&pl);
    p.arg(&tree.verify_ids)
        .arg(&tree.first_child)
        .arg(&tree.next_sibling);
    p.arg(&out.accepted_nodes)
        .arg(&out.accepted_tokens)
        .arg(&out.accept_index)
        .arg(&out.accept_len)
        .arg(&out.bonus);
    p.arg(&s.temperature)
        .arg(&s.top_k)
        .arg(&s.top_p)
        .arg(&s.rng);
    let stream = stream as CUstream;
    let grid = (bs as u32, 1, 1);
    launch(
        "cuLaunchKernel(accept)",
        f,
        grid,
        ACCEPT_THREADS,
        0,
        stream,
        &mut p,
    )?;
    if let Some(s) = sampling {
        let mut p = Params::new();
        p.arg(&s.rng);
        launch(
            "cuLaunchKernel(advance_rng)",
            dev.advance_rng,
            (1, 1, 1),
            1,
            0,
            stream,
            &mut p,
        )?;
    }
    Ok(())
}
