//! Tree verify attention on the GPU (`kernels/attention.cu`): a per-request index check,
//! the attention blocks (one kernel per head-dimension tile), and, when the key range is
//! split across blocks, the merge of the splits by their log-sum-exp. All three take the one
//! [`AttentionParams`] by value.

use crate::device::enter_device;
use crate::{launch, launch_dependent, CudaError, Params};
use cudarc::driver::sys::{self, CUstream};

/// The kernels' argument struct, field for field (`AttentionParams` in attention.cuh, whose
/// static_asserts hold the same size and offsets as this crate's tests).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct AttentionParams {
    pub q: u64,
    pub k_new: u64,
    pub v_new: u64,
    pub k_cache: u64,
    pub v_cache: u64,
    pub kv_indptr: u64,
    pub kv_indices: u64,
    pub prefix_lens: u64,
    pub ancestor_bits: u64,
    pub out: u64,
    pub lse: u64,
    pub part: u64,
    pub status: u64,
    pub q_s0: i64,
    pub q_s1: i64,
    pub kn_s0: i64,
    pub kn_s1: i64,
    pub vn_s0: i64,
    pub vn_s1: i64,
    pub kc_s0: i64,
    pub kc_s1: i64,
    pub vc_s0: i64,
    pub vc_s1: i64,
    pub o_s0: i64,
    pub o_s1: i64,
    pub num_indices: i64,
    pub num_slots: i64,
    pub sm_scale_log2: f32,
    pub index64: i32,
    pub bs: i32,
    pub q_nodes: i32,
    pub hq: i32,
    pub hkv: i32,
    pub dqk: i32,
    pub dv: i32,
    pub page_shift: i32,
    pub words: i32,
    pub splits: i32,
    pub row_tiles: i32,
    pub dv_chunks: i32,
    pub reserved: i32,
}

/// One compiled tile shape (`DDTREE_ATTENTION` in attention.cu, kernel
/// `ddtree_attention_{dtype}_{name}`): query/key head dims up to `d`, `dvc` value columns
/// (all of the block's), `warps` warps over the query rows (16 * `m_tiles` each: m16 row
/// tiles sharing every K and V fragment the warp loads), `kt` keys per tile, `stages` tiles
/// in flight; `col_warps` 1 and `v_in_k` false.
/// An `mla` tile is the portable MLA tile (`DDTREE_ATTENTION_MLA`, attention_mla.cuh's
/// `PortableMlaTile`), V a view of K's first columns (`v_in_k`): for O += P V each of its
/// warps takes `dvc` value columns of all `16 * m_tiles` rows (`col_warps` warps side by
/// side over the value columns), for S = Q K^T a quarter of the rows over half the head dim.
/// A `hopper` tile is `DDTREE_ATTENTION_HOPPER` in attention_sm90a.cu (kernel
/// `ddtree_attention_sm90a_{dtype}_{name}`): its warps come in warpgroups of four, `dvc` is a
/// warpgroup's value columns and `col_warps / 4` the warpgroups side by side over them. A
/// `producer` tile (`DDTREE_ATTENTION_HOPPER_WS`, `WsTile`; with `v_in_k`, MLA's
/// `DDTREE_ATTENTION_HOPPER_MLA`, `MlaTile`) adds a warpgroup that only gathers the K/V tiles;
/// the others compute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Variant {
    pub name: &'static str,
    pub d: usize,
    pub dvc: usize,
    pub warps: usize,
    pub kt: usize,
    pub col_warps: usize,
    pub v_in_k: bool,
    pub stages: usize,
    pub m_tiles: usize,
    pub hopper: bool,
    pub producer: bool,
    pub mla: bool,
}

const fn variant(name: &'static str, d: usize, dvc: usize, warps: usize, kt: usize) -> Variant {
    Variant {
        name,
        d,
        dvc,
        warps,
        kt,
        col_warps: 1,
        v_in_k: false,
        stages: 2,
        m_tiles: 1,
        hopper: false,
        producer: false,
        mla: false,
    }
}

/// A Hopper tile: `rg` warpgroups over the rows (64 each), each over all `dvw` value
/// columns, 64 keys per tile, two stages.
const fn hopper(name: &'static str, d: usize, dvw: usize, rg: usize) -> Variant {
    Variant {
        name,
        d,
        dvc: dvw,
        warps: 4 * rg,
        kt: 64,
        col_warps: 1,
        v_in_k: false,
        stages: 2,
        m_tiles: 1,
        hopper: true,
        producer: false,
        mla: false,
    }
}

/// A warp-specialized Hopper tile: a producer warpgroup gathers tiles of `kt` keys into
/// `stages` stages for two consumer warpgroups of 64 rows and all `d` value columns each.
const fn hopper_ws(name: &'static str, d: usize, kt: usize, stages: usize) -> Variant {
    Variant {
        name,
        d,
        dvc: d,
        warps: 12,
        kt,
        col_warps: 1,
        v_in_k: false,
        stages,
        m_tiles: 1,
        hopper: true,
        producer: true,
        mla: false,
    }
}

/// MLA's Hopper tile (`DDTREE_ATTENTION_HOPPER_MLA`, `MlaTile`): head dim 576, V the first
/// 512 columns of K; a producer warpgroup gathers tiles of 64 keys, two consumers of 64 rows
/// and 256 value columns each take alternate tiles (FlashMLA's seesaw).
const fn hopper_mla() -> Variant {
    Variant {
        name: "d576vk",
        d: 576,
        dvc: 256,
        warps: 12,
        kt: 64,
        col_warps: 2,
        v_in_k: true,
        stages: 2,
        m_tiles: 1,
        hopper: true,
        producer: true,
        mla: false,
    }
}

/// The compiled variants, smallest head dim first (the order of the device's functions);
/// a `v_in_k` variant serves only calls whose V is a view of K.
pub const VARIANTS: [Variant; 5] = [
    variant("d64", 64, 64, 4, 64),
    // Two m16 tiles a warp: each K/V fragment feeds twice the products (FlashAttention-2's
    // 128 x 32 tile); four warps of 246 registers, two blocks an H200 SM.
    Variant {
        m_tiles: 2,
        ..variant("d128", 128, 128, 4, 32)
    },
    variant("d256", 256, 128, 4, 32),
    variant("d576", 576, 256, 2, 16),
    // MLA's absorbed form: 64 rows a block, Q in registers (attention_mla.cuh).
    Variant {
        col_warps: 8,
        v_in_k: true,
        m_tiles: 4,
        mla: true,
        ..variant("d576vk", 576, 64, 8, 32)
    },
];
/// The sm_90a tiles (wgmma, up to 227 KB of shared memory), loaded on compute capability 9.0
/// only; a head dim none of them holds takes the portable tile.
pub const HOPPER_VARIANTS: [Variant; 4] = [
    hopper_ws("d64", 64, 128, 4),
    hopper_ws("d128", 128, 128, 3),
    hopper("d256", 256, 256, 2),
    hopper_mla(),
];
/// Most dynamic shared memory a Hopper block may have (227 KB).
pub const HOPPER_SMEM: usize = 227 * 1024;
/// Shared-row padding, elements (`kAttnPad`).
const PAD: usize = 8;
/// Bytes of a portable block's `KeySources` (attention.cuh): where its keys come from.
const KEY_SOURCES: usize = 64;

impl Variant {
    /// Query rows per block.
    pub fn rows(&self) -> usize {
        if self.hopper {
            let producer = if self.producer { 4 } else { 0 };
            64 * ((self.warps - producer) / 4 / self.col_warps)
        } else {
            16 * self.m_tiles * (self.warps / self.col_warps)
        }
    }
    /// Value columns per block.
    pub fn block_cols(&self) -> usize {
        self.dvc * self.col_warps
    }
    /// Dynamic shared memory of a block (`AttnTile::kSmem`) for `elem` bytes per element.
    pub fn smem_bytes(&self, elem: usize) -> usize {
        if self.producer && self.v_in_k {
            // Q, the two tiles and a P block (`MlaTile::kSmem`); four ready, four free and two
            // maximum mbarriers; the shared maximum and two row sums (fp32 rows of 64); a
            // round's 4-byte pool slots; 1 KB for the alignment.
            let halves = self.rows() * self.d + self.stages * self.kt * self.d + 64 * self.kt;
            return elem * halves + 10 * 8 + 4 * 3 * 64 + 4 * self.stages * self.kt + 1024;
        }
        if self.producer {
            // Q and the ring (`WsTile::kSmem`), a full and an empty mbarrier per stage, a
            // tile's 4-byte pool slots, and 1 KB for the alignment.
            let halves = self.rows() * self.d + self.stages * self.kt * (self.d + self.dvc);
            return elem * halves + 16 * self.stages + 4 * self.kt + 1024;
        }
        if self.hopper {
            // Unpadded swizzled buffers (`HopperTile::kSmem`), two tiles' 8-byte page ids, and
            // 1 KB for the alignment.
            let halves = self.rows() * self.d + self.stages * self.kt * (self.d + self.dvc);
            let ids = if self.stages_page_ids() {
                8 * 2 * self.kt
            } else {
                0
            };
            return elem * halves + ids + 1024;
        }
        if self.mla {
            // The K tiles and P (`PortableMlaTile::kSmem`); each warp's fp32 partial scores for
            // its partner's rows (two float4 a lane); three fp32 values a row and a flag a warp;
            // the staged page ids and the block's key sources (64 bytes).
            let halves = self.stages * self.kt * (self.d + PAD) + self.rows() * (self.kt + PAD);
            let sums = 16 * self.warps * 2 * 32;
            // The Q fragments of each warp's last two k-steps (a uint4 a lane a k-step).
            let q_tail = 16 * 2 * 32 * self.warps;
            return elem * halves
                + sums
                + q_tail
                + 4 * 3 * self.rows()
                + 4 * self.warps
                + 8 * self.stages * self.kt
                + KEY_SOURCES;
        }
        // Q, the stages' K and V rows (`AttnTile::kSmem`), each stage's staged page ids (kt
        // 8-byte entries) and the block's key sources.
        let (qs, vs) = (self.d + PAD, self.dvc + PAD);
        let ids = 8 * self.stages * self.kt + KEY_SOURCES;
        elem * (self.rows() * qs + self.stages * self.kt * (qs + vs)) + ids
    }
    /// A two-warpgroup Hopper tile of which an SM holds one block (MINB 1 in
    /// attention_sm90a.cu: d256) stages each tile's page ids in shared memory a tile ahead;
    /// with two blocks per SM the other block hides the page-table read.
    pub fn stages_page_ids(&self) -> bool {
        self.hopper && !self.producer && self.d >= 256
    }

    /// The variant for query/key head dim `dqk` and value dim `dv`: the smallest that holds
    /// `dqk`, the one that reads V from the K tile when `v_in_k` (V a view of K's first `dv`
    /// columns) and one exists for that size whose block covers all `dv` columns (its values
    /// start at K's column 0, so a second chunk of value columns could not be read there).
    pub fn for_head_dim(dqk: usize, dv: usize, v_in_k: bool) -> Option<(usize, Variant)> {
        Self::in_table(&VARIANTS, dqk, dv, v_in_k)
    }

    /// The tile a call takes: a Hopper tile when `hopper` (the device has them) and one
    /// holds `dqk`, else the portable one. The index is into the variant's own table.
    pub fn for_call(hopper: bool, dqk: usize, dv: usize, v_in_k: bool) -> Option<(usize, Variant)> {
        let fast = Self::in_table(&HOPPER_VARIANTS, dqk, dv, v_in_k).filter(|_| hopper);
        fast.or_else(|| Self::for_head_dim(dqk, dv, v_in_k))
    }

    /// Whether the tile folds the score scale into its exponentials, taking the maximum of
    /// the raw scores for that of the scaled ones: right for a positive scale only (0 times
    /// a masked key's -inf is NaN; a negative scale reverses the order). The Hopper MLA tile
    /// does (`mla_softmax`); the others scale the scores first.
    pub fn folds_scale(&self) -> bool {
        self.hopper && self.v_in_k
    }

    /// [`Variant::for_call`] for a call whose scores are scaled by `scale_log2`: a tile
    /// that folds the scale serves a positive one only, else the portable tile does.
    pub fn for_scaled_call(
        hopper: bool,
        dqk: usize,
        dv: usize,
        v_in_k: bool,
        scale_log2: f32,
    ) -> Option<(usize, Variant)> {
        let positive = scale_log2 > 0.0; // false for NaN too
        match Self::for_call(hopper, dqk, dv, v_in_k) {
            Some((_, v)) if v.folds_scale() && !positive => Self::for_call(false, dqk, dv, v_in_k),
            pick => pick,
        }
    }

    fn in_table(
        table: &[Variant],
        dqk: usize,
        dv: usize,
        v_in_k: bool,
    ) -> Option<(usize, Variant)> {
        let d = table.iter().map(|v| v.d).filter(|&d| dqk <= d).min()?;
        let of_size = || {
            table
                .iter()
                .copied()
                .enumerate()
                .filter(move |(_, v)| v.d == d)
        };
        of_size()
            .find(|(_, v)| v.v_in_k && v_in_k && dv <= v.block_cols())
            .or_else(|| of_size().find(|(_, v)| !v.v_in_k))
    }
}

/// How a call is cut into blocks: row tiles per (request, KV head), value-column chunks and
/// key splits (a pure function of the shapes, so graph replays keep their geometry).
pub fn geometry(v: &Variant, q_nodes: usize, group: usize, dv: usize) -> (usize, usize) {
    let rows = q_nodes * group;
    (rows.div_ceil(v.rows()), dv.div_ceil(v.block_cols()))
}

/// How a call's key range is split (flash-decoding) and the scratch the splits need, for
/// calls of up to `max_batch` requests of one head shape: made once per workspace, so the
/// split count depends only on the shapes and graph replays keep their geometry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitPlan {
    /// Key splits per request for a batch of `bs` requests: `splits[bs - 1]`.
    pub splits: Vec<usize>,
    /// fp32 elements of the partial results (`part`), 0 when no batch splits.
    pub part_floats: usize,
    /// The kernel tile planned for: its name, `sm90a_` first for a Hopper tile.
    pub tile: String,
}

/// Most key splits per request: past this the merge's cost outgrows the gain (and the
/// merge gives each split one lane of a warp).
pub const MAX_SPLITS: usize = 32;
const _: () = assert!(MAX_SPLITS <= 32);

/// The split count for `blocks` blocks of equal work per split on a GPU that holds
/// `resident` blocks at once. The run time goes as the waves the blocks take (a last,
/// partial wave costs a whole one) times each block's share of the keys (1 / splits); every
/// split also costs a block's fixed work (its query rows, its partial results, the merge),
/// so the fewest splits within 5 % of the best time win. 64 blocks on 264 slots split in 4
/// (one full wave), not 5 (a second wave of 56 blocks: 1.6x the time).
pub fn splits_for(blocks: usize, resident: usize) -> usize {
    let (blocks, resident) = (blocks.max(1), resident.max(1));
    let cost = |s: usize| (blocks * s).div_ceil(resident) as f64 / s as f64;
    let best = (1..=MAX_SPLITS).map(cost).fold(f64::INFINITY, f64::min);
    (1..=MAX_SPLITS)
        .find(|&s| cost(s) <= 1.05 * best)
        .unwrap_or(1)
}

impl SplitPlan {
    /// The plan for `max_batch` requests of a tree of `q_nodes` nodes, `hq` query heads
    /// over `hkv` KV heads, head dims `dqk`/`dv`, with attention tile `v` on a GPU that
    /// holds `resident` of its blocks at once (`resident_blocks`). `None` when the heads do
    /// not divide. The tile is the one a call whose V is a view of K takes when `dv <= dqk`
    /// (MLA's usual form); a call that takes another tile runs with the same splits, which
    /// `part` holds.
    pub fn new(
        max_batch: usize,
        q_nodes: usize,
        heads: (usize, usize),
        dims: (usize, usize),
        tile: (&Variant, usize),
    ) -> Option<Self> {
        let ((hq, hkv), (_, dv), (v, resident)) = (heads, dims, tile);
        if hkv == 0 || hq % hkv != 0 || max_batch == 0 {
            return None;
        }
        let (row_tiles, dv_chunks) = geometry(v, q_nodes, hq / hkv, dv);
        let per_request = hkv * row_tiles * dv_chunks;
        let splits: Vec<usize> = (1..=max_batch)
            .map(|bs| splits_for(bs * per_request, resident))
            .collect();
        let most = splits
            .iter()
            .enumerate()
            .map(|(i, s)| s * (i + 1))
            .max()
            .unwrap_or(0);
        let any_split = splits.iter().any(|&s| s > 1);
        let part_floats = if any_split {
            most * q_nodes * hq * (dv + 2)
        } else {
            0
        };
        let tile = format!("{}{}", if v.hopper { "sm90a_" } else { "" }, v.name);
        Some(Self {
            splits,
            part_floats,
            tile,
        })
    }

    /// Key splits per request for a batch of `bs` (1 ≤ bs ≤ max_batch).
    pub fn splits_for(&self, bs: usize) -> usize {
        self.splits[bs - 1]
    }
}

/// The tile a call of head dims `dqk`/`dv` takes on device `ordinal` (as `SplitPlan` plans
/// it: V a view of K when `dv <= dqk`) and the blocks of it the device holds at once: its
/// multiprocessors times the blocks one keeps resident, by the driver's occupancy for the
/// kernel's threads, registers and shared memory. `None` when no compiled tile holds `dqk`.
pub fn resident_blocks(
    ordinal: usize,
    dqk: usize,
    dv: usize,
) -> Result<Option<(Variant, usize)>, CudaError> {
    let (dev, _ctx) = enter_device(ordinal)?;
    let hopper = dev.attention_hopper.is_some();
    let Some((index, v)) = Variant::for_call(hopper, dqk, dv, dv <= dqk) else {
        return Ok(None);
    };
    let sms = dev
        .ctx
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .map_err(|e| CudaError::driver("cuDeviceGetAttribute", e))?;
    // SAFETY: a loaded kernel of this device, its context current.
    let per_sm = unsafe {
        cudarc::driver::result::occupancy::max_active_block_per_multiprocessor(
            dev.attention_fn(&v, index, false),
            (32 * v.warps) as i32,
            dev.attention_smem(&v),
        )
    }
    .map_err(|e| CudaError::driver("cuOccupancyMaxActiveBlocksPerMultiprocessor", e))?;
    Ok(Some((v, (sms.max(1) * per_sm.max(1)) as usize)))
}

/// Blocks per request of the index check: about 512 pages each (two a thread, so that a
/// thread's loads are one round trip to memory) when the pages of `num_indices` are shared
/// evenly by `bs` requests, from 1 to 512 (past 256k pages a thread takes more). A function
/// of the shapes alone, so that graph replays keep their geometry.
pub fn check_blocks(num_indices: i64, bs: i32) -> u32 {
    let per_request = num_indices.max(0) as u64 / bs.max(1) as u64;
    per_request.div_ceil(512).clamp(1, 512) as u32
}

/// Warps a block of the merge has (`kMergeWarps` in attention.cuh), each merging 64 value
/// columns of one query row.
pub const MERGE_WARPS: usize = 4;

/// Most pool slots: the Hopper gather posts a key's slot as 32 bits, with two values above
/// the slots kept for a tree node's key and a key past the split.
pub const MAX_POOL_SLOTS: i64 = (u32::MAX - 2) as i64;

/// The pool must be addressable by the Hopper gather's 32-bit arithmetic: a slot below
/// `MAX_POOL_SLOTS`, and a row stride of K and V under 4 GiB (a slot's row is one 32 x 32 ->
/// 64-bit product of the two). Real pools are far inside both (2^32 rows of even one
/// 64-element head are 512 GiB).
pub fn check_pool(p: &AttentionParams, elem: usize) -> Result<(), CudaError> {
    if p.num_slots > MAX_POOL_SLOTS {
        return Err(CudaError::arg(format!(
            "k_cache: {} slots exceed the {MAX_POOL_SLOTS} a pool may have",
            p.num_slots
        )));
    }
    for (name, stride) in [("k_cache", p.kc_s0), ("v_cache", p.vc_s0)] {
        if stride.unsigned_abs() * elem as u64 > u64::from(u32::MAX) {
            return Err(CudaError::arg(format!(
                "{name}: a row stride of {stride} elements is 4 GiB or more"
            )));
        }
    }
    Ok(())
}

/// Launches the check, the attention blocks and (with `p.splits` > 1) the merge on
/// `stream`. `f16` selects the fp16 kernels (else bf16); `v_in_k` says V is a view of K's
/// first `dv` columns (same addresses and strides), which lets an MLA call read the values
/// from its K tiles. The caller fills every field but `row_tiles` and `dv_chunks`, set here.
///
/// # Safety
/// Every pointer in `p` addresses live device memory of the shapes it states (`part` holds
/// `splits * bs*Hkv * Q*group * (dv+2)` floats when `splits` > 1; `status` `[bs]`).
pub unsafe fn tree_attention(
    ordinal: usize,
    stream: u64,
    mut p: AttentionParams,
    f16: bool,
    v_in_k: bool,
) -> Result<(), CudaError> {
    let dqk = p.dqk as usize;
    let (dev, _ctx) = enter_device(ordinal)?;
    let hopper = dev.attention_hopper.is_some();
    let dv = p.dv as usize;
    let v_in_k = v_in_k && p.dv <= p.dqk;
    let Some((index, v)) = Variant::for_scaled_call(hopper, dqk, dv, v_in_k, p.sm_scale_log2)
    else {
        return Err(CudaError::arg(format!(
            "q: head dim {dqk} exceeds the largest compiled tile ({})",
            VARIANTS[VARIANTS.len() - 1].d
        )));
    };
    if p.hkv < 1 || p.hq % p.hkv != 0 || p.splits < 1 || p.splits as usize > MAX_SPLITS || p.bs < 1
    {
        return Err(CudaError::arg(
            "q: heads, batch or splits out of range".into(),
        ));
    }
    // Grid y and z dimensions hold at most 65535 blocks (the splits; bs * Hkv).
    let requests_heads = i64::from(p.bs) * i64::from(p.hkv);
    if requests_heads > 65535 || p.splits > 65535 {
        return Err(CudaError::arg(format!(
            "q: bs * Hkv = {requests_heads} exceeds the grid's 65535"
        )));
    }
    check_pool(&p, 2)?; // bf16 and fp16 alike
    let group = (p.hq / p.hkv) as usize;
    let (row_tiles, dv_chunks) = geometry(&v, p.q_nodes as usize, group, p.dv as usize);
    p.row_tiles = row_tiles as i32;
    p.dv_chunks = dv_chunks as i32;
    let stream = stream as CUstream;
    let z = (p.bs * p.hkv) as u32;
    // Status 0 (ok) for every request, then the check's blocks mark the bad ones.
    sys::cuMemsetD32Async(p.status, 0, p.bs as usize, stream)
        .result()
        .map_err(|e| CudaError::driver("cuMemsetD32Async(status)", e))?;
    let mut args = Params::new();
    args.arg(&p);
    launch(
        "cuLaunchKernel(attention_check)",
        dev.attention_check,
        (check_blocks(p.num_indices, p.bs), p.bs as u32, 1),
        256,
        0,
        stream,
        &mut args,
    )?;
    let f = dev.attention_fn(&v, index, f16);
    let grid = ((row_tiles * dv_chunks) as u32, p.splits as u32, z);
    let mut args = Params::new();
    args.arg(&p);
    // The attention and the merge start while the grid before them runs (each waits for
    // its results in the kernel): the Hopper d64/d128 and MLA blocks copy their queries
    // during the check, and neither launch waits out a gap.
    launch_dependent(
        "cuLaunchKernelEx(attention)",
        f,
        grid,
        (32 * v.warps) as u32,
        dev.attention_smem(&v),
        stream,
        &mut args,
    )?;
    if p.splits > 1 {
        // A warp per 64 value columns of a query row, MERGE_WARPS warps a block.
        let items = p.q_nodes as usize * group * (p.dv as usize).div_ceil(64);
        let blocks = items.div_ceil(MERGE_WARPS) as u32;
        let mut args = Params::new();
        args.arg(&p);
        launch_dependent(
            "cuLaunchKernelEx(attention_merge)",
            dev.attention_merge[usize::from(f16)],
            (blocks, z, 1),
            32 * MERGE_WARPS as u32,
            0,
            stream,
            &mut args,
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_params_struct_has_the_header_layout() {
        assert_eq!(std::mem::size_of::<AttentionParams>(), 272);
        assert_eq!(std::mem::offset_of!(AttentionParams, q_s0), 104);
        assert_eq!(std::mem::offset_of!(AttentionParams, sm_scale_log2), 216);
        assert_eq!(std::mem::offset_of!(AttentionParams, splits), 256);
        let header = include_str!("../../../kernels/include/ddtree/attention.cuh");
        assert!(header.contains(&format!("kAttnPad = {PAD};")));
        let entry = include_str!("../../../kernels/attention.cu");
        for v in VARIANTS.iter().filter(|v| !v.mla) {
            assert_eq!((v.col_warps, v.v_in_k), (1, false), "AttnTile: {}", v.name);
            for t in ["bf16, __nv_bfloat16", "f16, __half"] {
                let (dtype, ty) = t.split_once(", ").unwrap();
                let line = format!(
                    "(ddtree_attention_{dtype}_{}, {ty}, {}, {}, {}, {}, {}, {})",
                    v.name, v.d, v.dvc, v.warps, v.kt, v.stages, v.m_tiles
                );
                assert!(entry.contains(&line), "attention.cu lacks {line}");
            }
        }
        let mla = VARIANTS[4];
        assert!(mla.mla && mla.v_in_k && VARIANTS.iter().filter(|v| v.mla).count() == 1);
        assert!(entry.contains("DDTREE_ATTENTION_MLA(ddtree_attention_bf16_d576vk, __nv_bfloat16)"));
        let header = include_str!("../../../kernels/include/ddtree/attention_mla.cuh");
        for field in [
            format!("D = {};", mla.d),
            format!("kWarps = {};", mla.warps),
            format!("BM = {};", mla.rows()),
            format!("KT = {};", mla.kt),
            format!("ST = {};", mla.stages),
        ] {
            assert!(header.contains(&field), "PortableMlaTile lacks {field}");
        }
        let entry = include_str!("../../../kernels/attention_sm90a.cu");
        for v in HOPPER_VARIANTS.iter().filter(|v| v.producer && !v.v_in_k) {
            let line = format!("({}, {}, {}, {}, {})", v.name, v.d, v.dvc, v.kt, v.stages);
            assert!(entry.contains(&line), "attention_sm90a.cu lacks {line}");
            assert_eq!((v.warps, v.col_warps, v.v_in_k), (12, 1, false), "WsTile");
        }
        for v in HOPPER_VARIANTS.iter().filter(|v| !v.producer) {
            let rg = v.warps / 4;
            let minb = if v.stages_page_ids() { 1 } else { 2 };
            let line = format!("({}, {}, {}, {rg}, {minb})", v.name, v.d, v.dvc);
            assert!(entry.contains(&line), "attention_sm90a.cu lacks {line}");
            assert_eq!((v.kt, v.stages), (64, 2), "HopperTile's KT and ST");
            assert_eq!((v.col_warps, v.v_in_k), (1, false), "HopperTile");
        }
        let mla = HOPPER_VARIANTS[3];
        assert!(mla.producer && mla.v_in_k);
        assert!(entry.contains("DDTREE_ATTENTION_HOPPER_MLA(ddtree_attention_sm90a_bf16_d576vk,"));
        let header = include_str!("../../../kernels/include/ddtree/attention_hopper_mla.cuh");
        assert!(
            header.contains("D = 576, DV = 512, KT = 64, BM = 64;"),
            "MlaTile"
        );
    }

    #[test]
    fn hopper_tiles_fit_227_kb_and_serve_calls_only_on_hopper() {
        for v in HOPPER_VARIANTS {
            assert!(v.smem_bytes(2) <= HOPPER_SMEM, "{v:?}");
            assert_eq!(v.d % 64, 0);
        }
        let mla = HOPPER_VARIANTS[3];
        assert_eq!((mla.rows(), mla.block_cols()), (64, 512));
        // Q 64 x 576, two K tiles of 64 x 576 and P 64 x 64, bf16; ten mbarriers; three
        // fp32 rows of 64; 128 4-byte slots; the alignment slack: 688 bytes under the limit.
        assert_eq!(
            mla.smem_bytes(2),
            2 * (3 * 64 * 576 + 64 * 64) + 80 + 768 + 512 + 1024
        );
        assert_eq!(HOPPER_SMEM - mla.smem_bytes(2), 688);
        let d128 = HOPPER_VARIANTS[1];
        assert_eq!((d128.rows(), d128.block_cols()), (128, 128));
        // Q 128 x 128, three stages of 128 keys' K and V, bf16; six mbarriers; 128 4-byte
        // slots; the alignment slack: 1488 bytes under the limit.
        assert_eq!(
            d128.smem_bytes(2),
            2 * (128 * 128 + 3 * 128 * 256) + 48 + 512 + 1024
        );
        assert_eq!(HOPPER_SMEM - d128.smem_bytes(2), 1488);
        assert!(!d128.stages_page_ids() && HOPPER_VARIANTS[2].stages_page_ids());
        assert!(!mla.stages_page_ids());
        assert_eq!(geometry(&mla, 256, 8, 512), (32, 1));
        let pick = |hopper, dqk, vk| Variant::for_call(hopper, dqk, 512, vk).map(|(_, v)| v);
        assert_eq!(pick(true, 576, true), Some(mla));
        assert_eq!(pick(false, 576, true), Some(VARIANTS[4]));
        // No Hopper tile reads a separate V of head dim 576: the portable one serves it.
        assert_eq!(pick(true, 576, false), Some(VARIANTS[3]));
        // A Hopper tile that loads V also serves a call whose V is a view of K.
        assert_eq!(pick(true, 96, true), Some(HOPPER_VARIANTS[1]));
        assert_eq!(pick(true, 1024, false), None);
    }

    #[test]
    fn the_sm120_emulation_holds_as_many_blocks_an_sm_as_sm_120_would() {
        use crate::device::sm120_launch_smem;
        for v in VARIANTS {
            let own = v.smem_bytes(2);
            let launch = sm120_launch_smem(own);
            assert!(own <= launch && launch <= HOPPER_SMEM, "{v:?}");
            let on_sm120 = (100 * 1024) / (own + 1024);
            assert_eq!((228 * 1024) / (launch + 1024), on_sm120, "{v:?}");
        }
        // d128 (70 KB) and d576vk (96 KB): one block an SM on sm_120, so 227 KB here.
        assert_eq!(sm120_launch_smem(VARIANTS[1].smem_bytes(2)), HOPPER_SMEM);
        assert_eq!(sm120_launch_smem(VARIANTS[4].smem_bytes(2)), HOPPER_SMEM);
        // d64 (46 KB): two on either.
        assert_eq!(
            sm120_launch_smem(VARIANTS[0].smem_bytes(2)),
            114 * 1024 - 1024
        );
    }

    #[test]
    fn every_variant_fits_the_99_kb_that_sm_120_allows() {
        for v in VARIANTS {
            assert!(
                v.smem_bytes(2) <= 99 * 1024,
                "{v:?}: {} bytes",
                v.smem_bytes(2)
            );
        }
        // `AttnTile::kSmem` by hand (attention.cu asserts it is under 99 KB as well):
        // d128: Q 128 x 136, two stages of 32 keys' K and V rows of 136, bf16; 64 page ids and
        // 64 bytes of key sources.
        let d128 = VARIANTS[1];
        assert_eq!((d128.rows(), d128.m_tiles), (128, 2));
        assert_eq!(
            d128.smem_bytes(2),
            2 * (128 * 136 + 2 * 32 * 272) + 8 * 64 + 64
        );
        // d576vk (attention_mla.cuh): two stages of 32 keys' K rows, P 64 x 40, each warp's
        // fp32 scores for its partner (8 warps x 32 lanes x 2 float4), each warp's last two
        // k-steps of Q fragments (8 x 32 x 2 uint4), 64 rows' scale, maximum and sum and 8
        // flags, 64 page ids, 64 bytes of key sources: 97,632 bytes.
        let mla = VARIANTS[4];
        assert_eq!(
            (mla.rows(), mla.block_cols(), 32 * mla.warps),
            (64, 512, 256)
        );
        assert_eq!(
            mla.smem_bytes(2),
            2 * (2 * 32 * 584 + 64 * 40) + 8 * 32 * 2 * 16 * 2 + 4 * 3 * 64 + 4 * 8 + 8 * 64 + 64
        );
        assert_eq!(mla.smem_bytes(2), 97_632);
        assert_eq!(
            Variant::for_head_dim(576, 512, false).unwrap().1.name,
            "d576"
        );
        assert_eq!(
            Variant::for_head_dim(576, 512, true).unwrap().1.name,
            "d576vk"
        );
        assert_eq!(Variant::for_head_dim(96, 96, true).unwrap().1.name, "d128");
        assert!(Variant::for_head_dim(1024, 512, false).is_none());
        // V = K with all 576 columns: more value columns than a V-in-K block covers (its
        // values start at K's column 0), so the tile that loads V serves it, on both paths.
        assert_eq!(
            Variant::for_head_dim(576, 576, true).unwrap().1.name,
            "d576"
        );
        assert_eq!(
            Variant::for_call(true, 576, 576, true).unwrap().1,
            VARIANTS[3]
        );
    }

    #[test]
    fn splits_fill_whole_waves_with_the_fewest_splits() {
        assert_eq!(splits_for(64, 264), 4); // 256 blocks: one wave (5 would take two)
        assert_eq!(splits_for(320, 264), 4); // 5 waves of a quarter of the keys each
        assert_eq!(splits_for(192, 264), 4); // 3 waves (2 splits would take 2 of a half)
        assert_eq!(splits_for(1024, 264), 1); // 3.9 waves: splitting gains nothing
        assert_eq!(splits_for(264, 264), 1);
        assert!((30..=MAX_SPLITS).contains(&splits_for(1, 264))); // near the cap
        let cost = |b: usize, s: usize| (b * s).div_ceil(264) as f64 / s as f64;
        for b in 1..2000 {
            let s = splits_for(b, 264);
            let best = (1..=MAX_SPLITS)
                .map(|t| cost(b, t))
                .fold(f64::INFINITY, f64::min);
            assert!(cost(b, s) <= 1.05 * best, "{b} blocks: {s} splits");
            assert!(
                (1..s).all(|t| cost(b, t) > 1.05 * best),
                "{b}: fewer would do"
            );
        }
    }

    #[test]
    fn a_split_plan_sizes_the_partials_for_its_largest_need() {
        // MLA Hq=8, Q=256 (32 row tiles of one value chunk per request) on 132 slots.
        let mla = (&VARIANTS[4], 132);
        let p = SplitPlan::new(8, 256, (8, 1), (576, 512), mla).unwrap();
        assert_eq!(&p.splits[..4], &[4, 2, 4, 1]);
        let most = (1..=8).map(|bs| bs * p.splits_for(bs)).max().unwrap();
        assert_eq!(p.part_floats, most * 256 * 8 * 514);
        // Enough blocks without splitting: no scratch at all.
        let p = SplitPlan::new(4, 256, (32, 8), (128, 128), (&VARIANTS[1], 16)).unwrap();
        assert_eq!((p.splits.clone(), p.part_floats), (vec![1; 4], 0));
        assert!(SplitPlan::new(4, 16, (3, 2), (64, 64), (&VARIANTS[0], 264)).is_none());
        // The Hopper MLA tile holds 64 rows: 32 row tiles per request, so fewer splits.
        let p = SplitPlan::new(2, 256, (8, 1), (576, 512), (&HOPPER_VARIANTS[3], 132)).unwrap();
        assert_eq!((p.splits, p.tile.as_str()), (vec![4, 2], "sm90a_d576vk"));
    }

    #[test]
    fn the_pool_must_fit_the_gathers_32_bit_arithmetic() {
        let mut p = AttentionParams {
            num_slots: MAX_POOL_SLOTS,
            kc_s0: 1 << 30,
            vc_s0: (1 << 31) - 1,
            ..Default::default()
        };
        assert!(check_pool(&p, 2).is_ok());
        p.num_slots += 1;
        assert!(check_pool(&p, 2)
            .unwrap_err()
            .to_string()
            .starts_with("k_cache: 4294967294"));
        p.num_slots = 8;
        p.vc_s0 = 1 << 31;
        assert!(check_pool(&p, 2)
            .unwrap_err()
            .to_string()
            .starts_with("v_cache: a row stride"));
        p.vc_s0 = 64;
        p.kc_s0 = -(1 << 31);
        assert!(check_pool(&p, 2)
            .unwrap_err()
            .to_string()
            .starts_with("k_cache: a row stride"));
    }

    #[test]
    fn only_a_positive_scale_takes_the_tile_that_folds_it() {
        let pick = |dqk, dv, vk, scale| {
            let (_, v) = Variant::for_scaled_call(true, dqk, dv, vk, scale).unwrap();
            (v.name, v.hopper)
        };
        assert_eq!(pick(576, 512, true, 0.06), ("d576vk", true));
        for scale in [0.0, -0.06, f32::NAN] {
            assert_eq!(pick(576, 512, true, scale), ("d576vk", false));
            assert_eq!(pick(128, 128, false, scale), ("d128", true));
            assert_eq!(pick(256, 256, false, scale), ("d256", true));
        }
    }

    #[test]
    fn the_check_spreads_a_long_prefix_over_blocks() {
        assert_eq!(check_blocks(65536, 1), 128);
        assert_eq!(check_blocks(65536 * 8, 8), 128);
        assert_eq!(check_blocks(100, 4), 1);
        assert_eq!(check_blocks(0, 1), 1);
        assert_eq!(check_blocks(1 << 30, 1), 512);
    }

    #[test]
    fn geometry_covers_every_row_and_value_column() {
        let mla = VARIANTS[3];
        assert_eq!(geometry(&mla, 256, 8, 512), (64, 2));
        assert_eq!(geometry(&VARIANTS[4], 256, 8, 512), (32, 1));
        assert_eq!(geometry(&VARIANTS[1], 64, 4, 128), (2, 1));
        assert_eq!(geometry(&VARIANTS[0], 16, 3, 64), (1, 1));
    }
}
