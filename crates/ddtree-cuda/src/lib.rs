//! ddtree-cuda: the GPU path of a DDTree round (SPEC.md stages 1–5).
//!
//! The kernels (`kernels/*.cu`) are compiled ahead of time by `build.rs` into fatbins with
//! sm_90 and sm_120 machine code plus PTX, embedded here and loaded once per device into the
//! primary context PyTorch uses. Every launch goes to the raw stream the caller passes
//! (PyTorch's current stream), allocates nothing and never synchronizes, so the whole build
//! can be captured in a CUDA graph.

mod accept;
pub mod attention;
mod commit;
pub mod cubin;
mod device;
pub mod engine;
pub mod fatbin;
mod graph;
pub mod launch;
pub mod params;
pub mod partials;
pub mod readback;
pub mod shard_accept;

pub use accept::{accept_tree, AcceptPtrs, Sampling, WalkTree};
pub use commit::{compact_kv, gather_hidden, kept_slots, CommitPath};
pub use readback::{
    mapped_host_pointer, readback, ReadbackRing, ReadbackSrc, RingReader, SlotLayout,
};

/// The embedded fatbins (empty when built without the `kernels` feature).
pub mod kernels {
    include!(concat!(env!("OUT_DIR"), "/kernels.rs"));
}

use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys::{self, CUfunction, CUstream};
use device::{device, enter_device, Device};
use launch::{BuildShape, CANDIDATE_THREADS, EMIT_THREADS};
use params::{BuildParams, MaskParams};
use std::ffi::c_void;
use std::fmt;

/// Why a GPU call could not be made.
#[derive(Debug)]
pub enum CudaError {
    /// A bad argument (becomes a Python `ValueError`).
    Arg(String),
    /// A driver call failed (becomes a Python `RuntimeError` naming the call).
    Driver {
        call: &'static str,
        err: DriverError,
    },
    /// This build embeds no kernels.
    NoKernels,
    /// The CUDA driver library (libcuda) cannot be loaded: no GPU driver on this machine.
    NoDriver,
    /// The device can run none of a module's images.
    NoImage {
        module: String,
        cc: u32,
        images: Vec<fatbin::Image>,
    },
}

impl CudaError {
    pub fn arg(msg: String) -> Self {
        Self::Arg(msg)
    }
    pub fn driver(call: &'static str, err: DriverError) -> Self {
        Self::Driver { call, err }
    }
}

impl fmt::Display for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Arg(m) => write!(f, "{m}"),
            Self::Driver { call, err } => write!(f, "CUDA driver call {call} failed: {err:?}"),
            Self::NoKernels => write!(
                f,
                "this build of ddtree has no CUDA kernels (built without the `kernels` feature)"
            ),
            Self::NoDriver => write!(
                f,
                "the CUDA driver library (libcuda.so) cannot be loaded: no NVIDIA driver here"
            ),
            Self::NoImage { module, cc, images } => write!(
                f,
                "no image in the {module} kernels runs on this GPU (sm_{cc}); the wheel holds {images:?}"
            ),
        }
    }
}

impl std::error::Error for CudaError {}

/// Element type of the draft logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    F32,
    F16,
    Bf16,
}

impl Dtype {
    /// Its place in a device's per-dtype kernel tables (f32, f16, bf16).
    pub fn index(self) -> usize {
        match self {
            Dtype::F32 => 0,
            Dtype::F16 => 1,
            Dtype::Bf16 => 2,
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::F16 | Dtype::Bf16 => 2,
        }
    }
}

/// A strided `[bs, L, V]` logits tensor in device memory.
#[derive(Debug, Clone, Copy)]
pub struct Logits {
    pub ptr: u64,
    pub dtype: Dtype,
    pub shape: [usize; 3],
    pub strides: [i64; 3],
}

/// Device pointers of every `Tree` output (contiguous, sized for the shape).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TreePtrs {
    pub verify_ids: u64,
    pub positions: u64,
    pub depths: u64,
    pub parents: u64,
    pub first_child: u64,
    pub next_sibling: u64,
    pub ancestor_bits: u64,
    pub scores: u64,
    pub num_nodes: u64,
    pub topk_logprobs: u64,
    pub topk_ids: u64,
    pub status: u64,
}

/// Device scratch of a build: per-row eligible counts and NaN/+inf flags (int32 `[bs*L]`),
/// and optionally (0 = none) the selection's diagnostics, int64 `[bs, SELECT_STATS]`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Scratch {
    pub eligible: u64,
    pub bad: u64,
    pub stats: u64,
}

/// Diagnostic slots per request written when [`Scratch::stats`] is set (`kStatSlots`).
pub const SELECT_STATS: usize = 16;

/// Kernel parameters: each entry points at one argument value (cuLaunchKernel's format).
pub(crate) struct Params(Vec<*mut c_void>);

impl Params {
    pub(crate) fn new() -> Self {
        Self(Vec::with_capacity(20))
    }
    pub(crate) fn arg<T>(&mut self, value: &T) -> &mut Self {
        self.0.push(value as *const T as *mut c_void);
        self
    }
    /// One argument: a kernel that takes one parameter struct.
    pub(crate) fn one<T>(value: &T) -> Self {
        let mut p = Self::new();
        p.arg(value);
        p
    }
    pub(crate) fn as_mut_ptr(&mut self) -> *mut *mut c_void {
        self.0.as_mut_ptr()
    }
}

/// # Safety
/// `f` must take exactly the arguments in `params`, whose pointees must be alive.
pub(crate) unsafe fn launch(
    call: &'static str,
    f: CUfunction,
    grid: (u32, u32, u32),
    block: u32,
    smem: usize,
    stream: CUstream,
    params: &mut Params,
) -> Result<(), CudaError> {
    result::launch_kernel(f, grid, (block, 1, 1), smem as u32, stream, &mut params.0)
        .map_err(|e| CudaError::driver(call, e))
}

/// [`launch`] as a programmatic dependent launch: the grid may start while the grid before
/// it in the stream still runs, so that the gap between two launches is hidden (its kernel
/// waits for that grid's results with `griddepcontrol.wait`, and that grid lets it start
/// with `griddepcontrol.launch_dependents`). Stream capture records it as a programmatic
/// edge of the graph.
///
/// # Safety
/// As [`launch`]; `f` must wait (`griddepcontrol.wait`) before it reads anything the grid
/// before it writes.
pub(crate) unsafe fn launch_dependent(
    call: &'static str,
    f: CUfunction,
    grid: (u32, u32, u32),
    block: u32,
    smem: usize,
    stream: CUstream,
    params: &mut Params,
) -> Result<(), CudaError> {
    let mut attr: sys::CUlaunchAttribute = std::mem::zeroed();
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    let config = sys::CUlaunchConfig {
        gridDimX: grid.0,
        gridDimY: grid.1,
        gridDimZ: grid.2,
        blockDimX: block,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: smem as u32,
        hStream: stream,
        attrs: &mut attr,
        numAttrs: 1,
    };
    sys::cuLaunchKernelEx(&config, f, params.as_mut_ptr(), std::ptr::null_mut())
        .result()
        .map_err(|e| CudaError::driver(call, e))
}

/// Stage bits of [`build_tree`]'s `stages`: which kernels to launch (all for a real build;
/// one at a time to time the stages separately).
pub const STAGE_CANDIDATES: u32 = 1;
pub const STAGE_SELECT: u32 = 2;
pub const STAGE_EMIT: u32 = 4;
pub const ALL_STAGES: u32 = 7;
/// With [`STAGE_SELECT`]: select by the best-first warp instead of the parallel threshold
/// search (the same tree; for benchmarks and tests).
pub const SELECT_BEST_FIRST: u32 = 8;
/// With [`STAGE_SELECT`]: the parallel threshold search even at budgets where the launcher
/// takes the best-first warp (`launch::select_best_first`; the same tree; for benchmarks
/// and tests).
pub const SELECT_PARALLEL: u32 = 32;
/// With [`STAGE_CANDIDATES`]: one block of [`CANDIDATE_THREADS`] a row even where the
/// launcher would spread each row over a cluster or launch half blocks (the same output;
/// for benchmarks and tests).
pub const CANDIDATES_ONE_BLOCK: u32 = 16;

/// SPEC stages 1–3 on device `ordinal`, launched on `stream` (PyTorch's current stream).
///
/// # Safety
/// Every pointer must address live device memory of the stated shape on that device, and
/// `roots` / `prefix` int64 `[bs]`; outputs must not overlap.
#[allow(clippy::too_many_arguments)]
pub unsafe fn build_tree(
    ordinal: usize,
    stream: u64,
    logits: Logits,
    roots: u64,
    prefix: u64,
    budget: usize,
    k: usize,
    out: TreePtrs,
    scratch: Scratch,
    stages: u32,
) -> Result<(), CudaError> {
    let [bs, depth, vocab] = logits.shape;
    let shape = BuildShape {
        bs,
        depth,
        vocab,
        budget,
        k,
    };
    shape.check()?;
    let p = build_params(&shape, &logits, roots, prefix, &out, &scratch, stages);
    let (dev, _ctx) = enter_device(ordinal)?;
    for k in build_kernels(&dev, &shape, logits.dtype, stages) {
        k.launch(stream, &mut Params::one(&p))?;
    }
    Ok(())
}

/// One kernel launch of a stage group, but its parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Kernel {
    pub call: &'static str,
    pub f: CUfunction,
    pub grid: (u32, u32, u32),
    pub block: u32,
    pub smem: usize,
}

impl Kernel {
    /// Launches the kernel on `stream` with `args` (pointers to its arguments).
    ///
    /// # Safety
    /// `args` must match the kernel's parameters and address live values.
    pub(crate) unsafe fn launch(&self, stream: u64, args: &mut Params) -> Result<(), CudaError> {
        let (grid, block, smem) = (self.grid, self.block, self.smem);
        launch(
            self.call,
            self.f,
            grid,
            block,
            smem,
            stream as CUstream,
            args,
        )
    }
}

/// The launches of the stages in `stages` (bits 1 | 2 | 4), in order: stage 1 one block per
/// (request, depth) row (of `launch::candidate_threads` threads), or a cluster of blocks per
/// row where every row's cluster fits on the GPU at once (`launch::cluster_rows`), stages 2
/// and 3 one block per request.
pub(crate) fn build_kernels(
    dev: &Device,
    shape: &BuildShape,
    dtype: Dtype,
    stages: u32,
) -> Vec<Kernel> {
    let (bs, rows) = (shape.bs as u32, (shape.bs * shape.depth) as u32);
    let index = dtype.index();
    let one_block = stages & CANDIDATES_ONE_BLOCK != 0;
    let clustered = !one_block && launch::cluster_rows(shape, dev.clusters[index]);
    let (candidates, blocks_a_row, threads) = if clustered {
        (
            dev.candidates_cluster[index],
            launch::CANDIDATE_CLUSTER,
            CANDIDATE_THREADS,
        )
    } else {
        let one_block_fn = match launch::one_block_candidates(shape) {
            launch::OneBlockKernel::MayReadOnce => dev.candidates[index],
            launch::OneBlockKernel::TwoReads => dev.candidates_wide[index],
        };
        let threads = if one_block {
            CANDIDATE_THREADS
        } else {
            launch::candidate_threads(shape, dev.resident[index])
        };
        (one_block_fn, 1, threads)
    };
    let all = [
        (
            STAGE_CANDIDATES,
            "cuLaunchKernel(candidates)",
            candidates,
            rows * blocks_a_row,
            threads,
            launch::CANDIDATE_SMEM,
        ),
        (
            STAGE_SELECT,
            "cuLaunchKernel(select)",
            dev.select,
            bs,
            launch::SELECT_THREADS,
            shape.select_smem().0,
        ),
        (
            STAGE_EMIT,
            "cuLaunchKernel(emit)",
            dev.emit,
            bs * launch::emit_parts(shape.budget + 1),
            EMIT_THREADS,
            0,
        ),
    ];
    all.into_iter()
        .filter(|k| stages & k.0 != 0)
        .map(|(_, call, f, blocks, block, smem)| Kernel {
            call,
            f,
            grid: (blocks, 1, 1),
            block,
            smem,
        })
        .collect()
}

/// The one parameter struct of a build's three launches.
fn build_params(
    shape: &BuildShape,
    logits: &Logits,
    roots: u64,
    prefix: u64,
    out: &TreePtrs,
    scratch: &Scratch,
    stages: u32,
) -> BuildParams {
    let [s0, s1, s2] = logits.strides;
    BuildParams {
        logits: logits.ptr,
        s0,
        s1,
        s2,
        roots,
        prefix,
        out: *out,
        scratch: *scratch,
        l: shape.depth as i32,
        v: shape.vocab as i32,
        k: shape.k as i32,
        budget: shape.budget as i32,
        cache_lp: i32::from(shape.select_smem().1),
        best_first: i32::from(
            stages & SELECT_BEST_FIRST != 0
                || launch::select_best_first(shape.budget, stages & SELECT_PARALLEL != 0),
        ),
    }
}

/// Launches `f` with one parameter struct passed by value.
pub(crate) unsafe fn launch_params<P>(
    call: &'static str,
    f: CUfunction,
    grid: (u32, u32, u32),
    block: u32,
    smem: usize,
    stream: CUstream,
    params: &P,
) -> Result<(), CudaError> {
    let mut p = Params::new();
    p.arg(params);
    launch(call, f, grid, block, smem, stream, &mut p)
}

/// SGLang's flat FULL mask into `out` (bool, `out_len` elements), prefix columns only when
/// `write_prefix`; per-request offsets are computed on the device from `seq_lens`.
///
/// # Safety
/// As [`build_tree`]: live device pointers of the stated sizes.
#[allow(clippy::too_many_arguments)]
pub unsafe fn full_mask(
    ordinal: usize,
    stream: u64,
    ancestor_bits: u64,
    seq_lens: u64,
    bs: usize,
    q: usize,
    write_prefix: bool,
    out: u64,
    out_len: usize,
) -> Result<(), CudaError> {
    let (dev, _ctx) = enter_device(ordinal)?;
    let p = MaskParams {
        ancestor_bits,
        seq_lens,
        out,
        out_len: out_len as i64,
        q: q as i32,
        write_prefix: i32::from(write_prefix),
    };
    let grid = (bs as u32, q as u32, 1);
    launch_params(
        "cuLaunchKernel(full_mask)",
        dev.full_mask,
        grid,
        EMIT_THREADS,
        0,
        stream as CUstream,
        &p,
    )
}

/// Loads device `ordinal`'s kernels (idempotent).
pub fn prepare(ordinal: usize) -> Result<(), CudaError> {
    device(ordinal).map(|_| ())
}

/// What each kernel of module `module`'s machine code for `arch` asks of an SM (registers,
/// threads, frame, static shared memory), read from the embedded cubin; `None` when the
/// build holds no such code (built without kernels, or another module name or arch).
pub fn kernel_resources(module: &str, arch: u32) -> Option<Vec<cubin::KernelResources>> {
    let data = embedded_modules()
        .into_iter()
        .find(|(m, _)| *m == module)?
        .1;
    cubin::kernel_resources(fatbin::machine_code(data, arch)?)
}

fn embedded_modules() -> [(&'static str, &'static [u8]); 7] {
    [
        ("candidates", kernels::CANDIDATES),
        ("select", kernels::SELECT),
        ("emit", kernels::EMIT),
        ("accept", kernels::ACCEPT),
        ("commit", kernels::COMMIT),
        ("attention", kernels::ATTENTION),
        ("attention_sm90a", kernels::ATTENTION_SM90A),
    ]
}

/// The images embedded for each kernel module (for tests and diagnostics).
pub fn embedded_images() -> Vec<(&'static str, Vec<fatbin::Image>)> {
    embedded_modules()
        .into_iter()
        .map(|(name, data)| (name, fatbin::images(data).unwrap_or_default()))
        .collect()
}

#[cfg(all(test, feature = "kernels"))]
mod tests {
    #[test]
    fn every_module_holds_sm90_and_sm120_code_and_ptx() {
        for (name, imgs) in super::embedded_images() {
            if name.ends_with("_sm90a") {
                // Hopper-only instructions: sm_90a machine code (listed as 90), nothing else.
                let only = vec![super::fatbin::Image {
                    ptx: false,
                    arch: 90,
                }];
                assert_eq!(imgs, only, "{name}");
                continue;
            }
            for arch in [90, 120] {
                for ptx in [false, true] {
                    assert!(
                        imgs.contains(&super::fatbin::Image { ptx, arch }),
                        "{name}: missing {} for {arch}: {imgs:?}",
                        if ptx { "PTX" } else { "machine code" }
                    );
                }
            }
        }
    }
}
