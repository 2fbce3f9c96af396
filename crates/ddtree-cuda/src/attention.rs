//! Tree verify attention on the GPU (`kernels/attention.cu`): a per-request index check,
//! the attention blocks (one kernel per head-dimension tile), and, when the key range is
//! split across blocks, the merge of the splits by their log-sum-exp. All three take the one
//! [`AttentionParams`] by value.

use crate::device::enter_device;
use crate::{launch, CudaError, Params};
use cudarc::driver::sys::CUstream;

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

/// One compiled tile shape (`DDTREE_ATTENTION` in attention.cu): query/key head dims up to
/// `d`, `dvc` value columns per block, `warps` warps of 16 query rows, `kt` keys per tile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Variant {
    pub d: usize,
    pub dvc: usize,
    pub warps: usize,
    pub kt: usize,
}

const fn variant(d: usize, dvc: usize, warps: usize, kt: usize) -> Variant {
    Variant { d, dvc, warps, kt }
}

/// The compiled variants, smallest head dim first (the order of the device's functions).
pub const VARIANTS: [Variant; 4] = [
    variant(64, 64, 4, 64),
    variant(128, 128, 4, 64),
    variant(256, 128, 4, 32),
    variant(576, 256, 2, 16),
];
/// Shared-row padding, elements (`kAttnPad`), and K/V stages in flight (`kStages`).
const PAD: usize = 8;
const STAGES: usize = 2;

impl Variant {
    /// Query rows per block.
    pub fn rows(&self) -> usize {
        16 * self.warps
    }
    /// Dynamic shared memory of a block (`AttnTile::kSmem`) for `elem` bytes per element.
    pub fn smem_bytes(&self, elem: usize) -> usize {
        let qs = self.d + PAD;
        let vs = self.dvc + PAD;
        elem * (self.rows() * qs + STAGES * self.kt * (qs + vs))
    }
    /// The variant for query/key head dim `dqk`: the smallest that holds it.
    pub fn for_head_dim(dqk: usize) -> Option<(usize, Variant)> {
        VARIANTS
            .iter()
            .copied()
            .enumerate()
            .find(|(_, v)| dqk <= v.d)
    }
}

/// How a call is cut into blocks: row tiles per (request, KV head), value-column chunks and
/// key splits (a pure function of the shapes, so graph replays keep their geometry).
pub fn geometry(v: &Variant, q_nodes: usize, group: usize, dv: usize) -> (usize, usize) {
    let rows = q_nodes * group;
    (rows.div_ceil(v.rows()), dv.div_ceil(v.dvc))
}

/// Launches the check, the attention blocks and (with `p.splits` > 1) the merge on
/// `stream`. `f16` selects the fp16 kernels (else bf16). The caller fills every field but
/// `row_tiles` and `dv_chunks`, set here.
///
/// # Safety
/// Every pointer in `p` addresses live device memory of the shapes it states (`part` holds
/// `splits * bs*Hkv * Q*group * (dv+2)` floats when `splits` > 1; `status` `[bs]`).
pub unsafe fn tree_attention(
    ordinal: usize,
    stream: u64,
    mut p: AttentionParams,
    f16: bool,
) -> Result<(), CudaError> {
    let dqk = p.dqk as usize;
    let Some((index, v)) = Variant::for_head_dim(dqk) else {
        return Err(CudaError::arg(format!(
            "q: head dim {dqk} exceeds the largest compiled tile ({})",
            VARIANTS[VARIANTS.len() - 1].d
        )));
    };
    if p.hkv < 1 || p.hq % p.hkv != 0 || p.splits < 1 || p.bs < 1 {
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
    let group = (p.hq / p.hkv) as usize;
    let (row_tiles, dv_chunks) = geometry(&v, p.q_nodes as usize, group, p.dv as usize);
    p.row_tiles = row_tiles as i32;
    p.dv_chunks = dv_chunks as i32;
    let (dev, _ctx) = enter_device(ordinal)?;
    let stream = stream as CUstream;
    let z = (p.bs * p.hkv) as u32;
    let mut args = Params::new();
    args.arg(&p);
    launch(
        "cuLaunchKernel(attention_check)",
        dev.attention_check,
        (p.bs as u32, 1, 1),
        256,
        0,
        stream,
        &mut args,
    )?;
    let f = dev.attention[index + if f16 { VARIANTS.len() } else { 0 }];
    let grid = ((row_tiles * dv_chunks) as u32, p.splits as u32, z);
    let mut args = Params::new();
    args.arg(&p);
    launch(
        "cuLaunchKernel(attention)",
        f,
        grid,
        (32 * v.warps) as u32,
        v.smem_bytes(2),
        stream,
        &mut args,
    )?;
    if p.splits > 1 {
        let rows = (p.q_nodes as usize * group) as u32;
        let mut args = Params::new();
        args.arg(&p);
        launch(
            "cuLaunchKernel(attention_merge)",
            dev.attention_merge[usize::from(f16)],
            (rows, z, 1),
            128,
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
        assert!(header.contains(&format!("kStages = {STAGES};")));
        let entry = include_str!("../../../kernels/attention.cu");
        for v in VARIANTS {
            let line = format!(
                "d{}, __nv_bfloat16, {}, {}, {}, {})",
                v.d, v.d, v.dvc, v.warps, v.kt
            );
            assert!(entry.contains(&line), "attention.cu lacks {line}");
        }
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
        assert_eq!(Variant::for_head_dim(576).unwrap().1.d, 576);
        assert_eq!(Variant::for_head_dim(96).unwrap().1.d, 128);
        assert!(Variant::for_head_dim(1024).is_none());
    }

    #[test]
    fn geometry_covers_every_row_and_value_column() {
        let mla = VARIANTS[3];
        assert_eq!(geometry(&mla, 256, 8, 512), (64, 2));
        assert_eq!(geometry(&VARIANTS[1], 64, 4, 128), (4, 1));
        assert_eq!(geometry(&VARIANTS[0], 16, 3, 64), (1, 1));
    }
}
