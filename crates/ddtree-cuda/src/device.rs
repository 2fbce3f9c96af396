//! One loaded device: the primary context PyTorch uses, and the kernels' functions.
//!
//! Loaded once per device ordinal and kept for the process (the fatbins are small), so a
//! step only looks up a cached `Arc<Device>` and launches.

use crate::fatbin;
use crate::kernels;
use crate::launch;
use crate::CudaError;
use cudarc::driver::result;
use cudarc::driver::sys::{self, CUfunction, CUmodule};
use cudarc::driver::CudaContext;
use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::{Arc, Mutex, OnceLock};

/// Makes `ctx` current for the guard's lifetime, then restores the caller's context.
/// Usually PyTorch has made the same primary context current already: then nothing changes.
pub struct ContextGuard {
    restore: Option<sys::CUcontext>,
}

impl ContextGuard {
    pub fn enter(ctx: sys::CUcontext) -> Result<Self, CudaError> {
        let previous =
            result::ctx::get_current().map_err(|e| CudaError::driver("cuCtxGetCurrent", e))?;
        if previous == Some(ctx) {
            return Ok(Self { restore: None });
        }
        unsafe { result::ctx::set_current(ctx) }
            .map_err(|e| CudaError::driver("cuCtxSetCurrent", e))?;
        Ok(Self {
            restore: Some(previous.unwrap_or(std::ptr::null_mut())),
        })
    }
}

impl Drop for ContextGuard {
    fn drop(&mut self) {
        if let Some(previous) = self.restore {
            // Nothing sensible to do if restoring fails; the next driver call reports it.
            let _ = unsafe { result::ctx::set_current(previous) };
        }
    }
}

/// The kernels of one device.
pub struct Device {
    pub ctx: Arc<CudaContext>,
    /// Stage 1 (f32, f16, bf16 each): one block a row (`candidates_wide` where K is past
    /// [`crate::launch::ONE_READ_MAX_K`]: the two reads alone, `launch::one_block_candidates`
    /// says why), and a cluster of blocks a row.
    pub candidates: [CUfunction; 3],
    pub candidates_wide: [CUfunction; 3],
    pub candidates_cluster: [CUfunction; 3],
    /// Clusters of `candidates_cluster` (per dtype) the GPU runs at once: the rows whose
    /// clusters all fit in one wave (0 where none fits or the driver cannot tell).
    pub clusters: [u32; 3],
    /// Blocks of `candidates` (per dtype; `candidates_wide` has the same shared memory and
    /// launch bounds, and fewer registers) the GPU holds at once at
    /// [`crate::launch::CANDIDATE_THREADS`] threads and at half that
    /// (`launch::candidate_threads` picks between them).
    pub resident: [launch::Resident; 3],
    /// Stage 1 as partials (f32, f16, bf16 each): the parts, their sums, and the merge.
    pub partials: [CUfunction; 3],
    pub partial_sums: [CUfunction; 3],
    pub merge_partials: CUfunction,
    pub select: CUfunction,
    pub emit: CUfunction,
    pub full_mask: CUfunction,
    /// Stage 4, per target dtype (f32, f16, bf16): a greedy batch's walk, a sampled
    /// batch's (with the draw), and the generator's advance.
    pub accept: [CUfunction; 3],
    pub accept_sampled: [CUfunction; 3],
    pub advance_rng: CUfunction,
    /// Stage 4 over a vocabulary shard: the keys per target dtype (f32, f16, bf16), and
    /// the walk along every rank's keys.
    pub shard_keys: [CUfunction; 3],
    pub walk_keys: CUfunction,
    /// Scalar sampling parameters and the seed, one launch (`SamplingLoad`).
    pub load_sampling: CUfunction,
    /// Stage 5.
    pub kept_slots: CUfunction,
    pub readback: CUfunction,
    pub compact_kv: CUfunction,
    pub gather_hidden: CUfunction,
    /// Tree verify attention: the index check, the blocks per [`crate::attention::VARIANTS`]
    /// entry (bf16 then f16), and the split merge per dtype (bf16, f16).
    pub attention_check: CUfunction,
    pub attention: Vec<CUfunction>,
    pub attention_merge: [CUfunction; 2],
    /// The sm_90a blocks per [`crate::attention::HOPPER_VARIANTS`] entry (bf16 then f16):
    /// loaded on compute capability 9.0 unless `DDTREE_ATTENTION=portable` was set when the
    /// device was first used (then every call takes the portable tiles, as on sm_120).
    pub attention_hopper: Option<Vec<CUfunction>>,
    /// `DDTREE_ATTENTION=sm120`: the portable tiles as above, each launched with enough
    /// shared memory that an SM holds as many blocks of it as sm_120's 100 KB would hold
    /// (`sm120_launch_smem`), so this GPU runs them at the production GPU's occupancy.
    pub sm120_occupancy: bool,
    /// `DDTREE_SAMPLING=exhaustive` (read when the device is first used): every sampled
    /// posterior takes sample_row's passes instead of the shortlist, for tests that compare
    /// the two and for timing them.
    pub sampling_exhaustive: bool,
    _modules: Vec<CUmodule>,
}

// SAFETY: CUfunction / CUmodule handles are plain driver handles, valid from any thread
// once the owning (primary) context is current; they are never mutated after loading.
unsafe impl Send for Device {}
unsafe impl Sync for Device {}

static DEVICES: OnceLock<Mutex<HashMap<usize, Arc<Device>>>> = OnceLock::new();

/// The loaded kernels of device `ordinal` (loaded on first use).
/// The loaded device `ordinal`, with its context current until the guard drops: what every
/// launch does first.
pub fn enter_device(ordinal: usize) -> Result<(Arc<Device>, ContextGuard), CudaError> {
    let dev = device(ordinal)?;
    let guard = ContextGuard::enter(dev.ctx.cu_ctx())?;
    Ok((dev, guard))
}

pub fn device(ordinal: usize) -> Result<Arc<Device>, CudaError> {
    // cudarc panics when it cannot load libcuda; ask first so Python gets an exception.
    if !unsafe { sys::is_culib_present() } {
        return Err(CudaError::NoDriver);
    }
    let mut map = DEVICES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(d) = map.get(&ordinal) {
        return Ok(d.clone());
    }
    let d = Arc::new(Device::load(ordinal)?);
    map.insert(ordinal, d.clone());
    Ok(d)
}

impl Device {
    fn load(ordinal: usize) -> Result<Self, CudaError> {
        if kernels::CANDIDATES.is_empty() {
            return Err(CudaError::NoKernels);
        }
        let caller =
            result::ctx::get_current().map_err(|e| CudaError::driver("cuCtxGetCurrent", e))?;
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| CudaError::driver("cuDevicePrimaryCtxRetain", e))?;
        // We allocate nothing through cudarc, but keep it from recording events if we ever do.
        unsafe { ctx.disable_event_tracking() };
        let _restore = ContextGuard {
            restore: Some(caller.unwrap_or(std::ptr::null_mut())),
        };
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| CudaError::driver("cuDeviceGetAttribute", e))?;
        let cc = (major * 10 + minor) as u32;
        let mut modules = Vec::new();
        let mut load = |image: &'static [u8], name: &'static str| -> Result<CUmodule, CudaError> {
            let m = load_module(image, name, cc)?;
            modules.push(m);
            Ok(m)
        };
        let cand_module = load(kernels::CANDIDATES, "candidates")?;
        let select = load(kernels::SELECT, "select")?;
        let emit = load(kernels::EMIT, "emit")?;
        let accept = load(kernels::ACCEPT, "accept")?;
        let commit = load(kernels::COMMIT, "commit")?;
        let attention = load(kernels::ATTENTION, "attention")?;
        let f = |m, name: &str| function(m, name);
        let select_fn = f(select, "ddtree_select")?;
        let cand = [
            f(cand_module, "ddtree_candidates_f32")?,
            f(cand_module, "ddtree_candidates_f16")?,
            f(cand_module, "ddtree_candidates_bf16")?,
        ];
        let cand_wide = [
            f(cand_module, "ddtree_candidates_wide_f32")?,
            f(cand_module, "ddtree_candidates_wide_f16")?,
            f(cand_module, "ddtree_candidates_wide_bf16")?,
        ];
        let cand_cluster = [
            f(cand_module, "ddtree_candidates_cluster_f32")?,
            f(cand_module, "ddtree_candidates_cluster_f16")?,
            f(cand_module, "ddtree_candidates_cluster_bf16")?,
        ];
        let partials = [
            f(cand_module, "ddtree_partials_f32")?,
            f(cand_module, "ddtree_partials_f16")?,
            f(cand_module, "ddtree_partials_bf16")?,
        ];
        let partial_sums = [
            f(cand_module, "ddtree_partial_sums_f32")?,
            f(cand_module, "ddtree_partial_sums_f16")?,
            f(cand_module, "ddtree_partial_sums_bf16")?,
        ];
        let merge_partials = f(cand_module, "ddtree_merge_partials")?;
        allow_dynamic_smem(select_fn, crate::launch::MAX_DYNAMIC_SMEM)?;
        for c in cand
            .into_iter()
            .chain(cand_wide)
            .chain(cand_cluster)
            .chain(partials)
            .chain([merge_partials])
        {
            allow_dynamic_smem(c, crate::launch::CANDIDATE_SMEM)?;
        }
        let accept_fns = [
            f(accept, "ddtree_accept_f32")?,
            f(accept, "ddtree_accept_f16")?,
            f(accept, "ddtree_accept_bf16")?,
        ];
        let accept_sampled_fns = [
            f(accept, "ddtree_accept_sampled_f32")?,
            f(accept, "ddtree_accept_sampled_f16")?,
            f(accept, "ddtree_accept_sampled_bf16")?,
        ];
        for a in accept_fns.into_iter().chain(accept_sampled_fns) {
            allow_dynamic_smem(a, crate::accept::ACCEPT_SMEM_CAP)?;
        }
        let mode = std::env::var("DDTREE_ATTENTION").unwrap_or_default();
        // The emulation's sizes are an H100/H200's (228 KB an SM, 227 KB a block); elsewhere
        // the mode is `portable`.
        let sm120_occupancy = mode == "sm120" && cc == 90;
        let portable = mode == "portable" || mode == "sm120";
        let attention_fns =
            attention_blocks(attention, "", &crate::attention::VARIANTS, sm120_occupancy)?;
        let attention_hopper = if cc == 90 && !portable {
            let m = load(kernels::ATTENTION_SM90A, "attention_sm90a")?;
            Some(attention_blocks(
                m,
                "sm90a_",
                &crate::attention::HOPPER_VARIANTS,
                false,
            )?)
        } else {
            None
        };
        Ok(Self {
            attention_check: f(attention, "ddtree_attention_check")?,
            attention: attention_fns,
            attention_hopper,
            attention_merge: [
                f(attention, "ddtree_attention_merge_bf16")?,
                f(attention, "ddtree_attention_merge_f16")?,
            ],
            candidates: cand,
            candidates_wide: cand_wide,
            candidates_cluster: cand_cluster,
            clusters: cand_cluster.map(max_active_clusters),
            resident: cand.map(|c| resident_candidates(&ctx, c)),
            partials,
            partial_sums,
            merge_partials,
            select: select_fn,
            emit: f(emit, "ddtree_emit")?,
            full_mask: f(emit, "ddtree_full_mask")?,
            accept: accept_fns,
            accept_sampled: accept_sampled_fns,
            advance_rng: f(accept, "ddtree_advance_rng")?,
            shard_keys: [
                f(accept, "ddtree_shard_keys_f32")?,
                f(accept, "ddtree_shard_keys_f16")?,
                f(accept, "ddtree_shard_keys_bf16")?,
            ],
            walk_keys: f(accept, "ddtree_walk_keys")?,
            load_sampling: f(accept, "ddtree_load_sampling")?,
            kept_slots: f(commit, "ddtree_kept_slots")?,
            readback: f(commit, "ddtree_readback")?,
            compact_kv: f(commit, "ddtree_compact_kv")?,
            gather_hidden: f(commit, "ddtree_gather_hidden")?,
            sm120_occupancy,
            sampling_exhaustive: std::env::var("DDTREE_SAMPLING").as_deref() == Ok("exhaustive"),
            _modules: modules,
            ctx,
        })
    }
}

impl Device {
    /// The attention kernel of tile `v` (entry `index` of its table), bf16 or fp16.
    pub fn attention_fn(
        &self,
        v: &crate::attention::Variant,
        index: usize,
        f16: bool,
    ) -> CUfunction {
        let fns = match (&self.attention_hopper, v.hopper) {
            (Some(h), true) => h,
            _ => &self.attention,
        };
        fns[index + if f16 { fns.len() / 2 } else { 0 }]
    }

    /// The dynamic shared memory a block of tile `v` is launched with: its own, or with
    /// [`Device::sm120_occupancy`] the emulation's (`sm120_launch_smem`).
    pub fn attention_smem(&self, v: &crate::attention::Variant) -> usize {
        launch_smem(v, self.sm120_occupancy)
    }
}

fn launch_smem(v: &crate::attention::Variant, sm120_occupancy: bool) -> usize {
    let own = v.smem_bytes(2);
    if sm120_occupancy && !v.hopper {
        sm120_launch_smem(own)
    } else {
        own
    }
}

/// Shared memory per SM on sm_120 (RTX PRO 6000 Blackwell: 100 KB) and on the H100/H200
/// (228 KB), and what CUDA reserves per resident block (1 KB) on both.
const SM120_SMEM_PER_SM: usize = 100 * 1024;
const SM90_SMEM_PER_SM: usize = 228 * 1024;
const SMEM_PER_BLOCK_RESERVED: usize = 1024;

/// A block of `own` bytes of shared memory takes this many on an H100/H200 to fit as many
/// times an SM as it fits in sm_120's 100 KB (registers allow the same on both: 64K a SM).
pub fn sm120_launch_smem(own: usize) -> usize {
    let blocks = (SM120_SMEM_PER_SM / (own + SMEM_PER_BLOCK_RESERVED)).max(1);
    (SM90_SMEM_PER_SM / blocks - SMEM_PER_BLOCK_RESERVED).max(own)
}

/// The attention kernels `ddtree_attention_{prefix}{dtype}_{name}` of `table`, bf16 then f16,
/// each allowed its tile's shared memory.
fn attention_blocks(
    module: CUmodule,
    prefix: &str,
    table: &[crate::attention::Variant],
    sm120_occupancy: bool,
) -> Result<Vec<CUfunction>, CudaError> {
    let mut fns = Vec::new();
    for dtype in ["bf16", "f16"] {
        for v in table {
            let a = function(
                module,
                &format!("ddtree_attention_{prefix}{dtype}_{}", v.name),
            )?;
            allow_dynamic_smem(a, launch_smem(v, sm120_occupancy))?;
            fns.push(a);
        }
    }
    Ok(fns)
}

/// Loads one embedded fatbin; says which images it has when none fits the device.
fn load_module(image: &'static [u8], name: &str, cc: u32) -> Result<CUmodule, CudaError> {
    let imgs = fatbin::images(image).unwrap_or_default();
    if !fatbin::runs_on(&imgs, cc) {
        return Err(CudaError::NoImage {
            module: name.to_string(),
            cc,
            images: imgs,
        });
    }
    // cuModuleLoadData wants an aligned image; include_bytes! guarantees no alignment.
    let mut aligned = vec![0u64; image.len().div_ceil(8)];
    unsafe {
        std::ptr::copy_nonoverlapping(
            image.as_ptr(),
            aligned.as_mut_ptr().cast::<u8>(),
            image.len(),
        )
    };
    unsafe { result::module::load_data(aligned.as_ptr().cast::<c_void>()) }
        .map_err(|e| CudaError::driver("cuModuleLoadData", e))
}

/// How many clusters of the clustered stage-1 kernel `f` the GPU holds at once. A cluster
/// must sit in one GPC, and each of its blocks takes an SM (1024 threads of 64 registers),
/// so this is what bounds one wave, not the SM count over 8. 0 when no cluster fits (a
/// small MIG slice) or the driver cannot say: the launcher then keeps one block a row.
fn max_active_clusters(f: CUfunction) -> u32 {
    use crate::launch::{CANDIDATE_CLUSTER, CANDIDATE_SMEM, CANDIDATE_THREADS};
    let config = sys::CUlaunchConfig {
        gridDimX: CANDIDATE_CLUSTER,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: CANDIDATE_THREADS,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: CANDIDATE_SMEM as u32,
        hStream: std::ptr::null_mut(),
        attrs: std::ptr::null_mut(),
        numAttrs: 0,
    };
    let mut clusters: std::ffi::c_int = 0;
    // SAFETY: a loaded kernel of the current context; `config` and `clusters` outlive the
    // call, which only reads the one and writes the other.
    match unsafe { sys::cuOccupancyMaxActiveClusters(&mut clusters, f, &config) }.result() {
        Ok(()) => clusters.max(0) as u32,
        Err(_) => 0,
    }
}

/// How many blocks of the one-block-a-row stage-1 kernel `f` the GPU holds at once, at
/// both block sizes, by the driver's occupancy (0 where it cannot say: the launcher then
/// keeps whole blocks).
fn resident_candidates(ctx: &CudaContext, f: CUfunction) -> launch::Resident {
    use crate::launch::{CANDIDATE_HALF_THREADS, CANDIDATE_SMEM, CANDIDATE_THREADS};
    let sms = ctx
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .unwrap_or(0)
        .max(0) as u32;
    let at = |threads: u32| {
        // SAFETY: a loaded kernel of the current context.
        let per_sm = unsafe {
            result::occupancy::max_active_block_per_multiprocessor(
                f,
                threads as i32,
                CANDIDATE_SMEM,
            )
        };
        sms * per_sm.unwrap_or(0).max(0) as u32
    };
    launch::Resident {
        whole: at(CANDIDATE_THREADS),
        half: at(CANDIDATE_HALF_THREADS),
    }
}

/// Lets `f` ask for up to `bytes` of dynamic shared memory (above the 48 KB default).
fn allow_dynamic_smem(f: CUfunction, bytes: usize) -> Result<(), CudaError> {
    unsafe {
        result::function::set_function_attribute(
            f,
            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            bytes as i32,
        )
    }
    .map_err(|e| CudaError::driver("cuFuncSetAttribute", e))
}

fn function(module: CUmodule, name: &str) -> Result<CUfunction, CudaError> {
    let cname = CString::new(name).expect("kernel names have no NUL");
    unsafe { result::module::get_function(module, cname) }
        .map_err(|e| CudaError::driver("cuModuleGetFunction", e))
}
