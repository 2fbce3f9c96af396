//! The kernels' ABI: the #[repr(C)] twins of `kernels/include/ddtree/params.h`, each passed
//! by value to its kernels (`__grid_constant__`). Device addresses are `u64`. The tests
//! below assert the sizes and offsets that the header's static_asserts hold, so a field
//! added on one side only fails the build there and `cargo test` here.

/// SPEC stages 1–3: one struct for the candidates, select and emit launches of a build.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BuildParams {
    pub logits: u64,
    pub s0: i64,
    pub s1: i64,
    pub s2: i64,
    pub roots: u64,
    pub prefix: u64,
    pub topk_logprobs: u64,
    pub topk_ids: u64,
    pub eligible: u64,
    pub bad: u64,
    pub verify_ids: u64,
    pub positions: u64,
    pub depths: u64,
    pub parents: u64,
    pub first_child: u64,
    pub next_sibling: u64,
    pub scores: u64,
    pub ancestor_bits: u64,
    pub num_nodes: u64,
    pub status: u64,
    pub stats: u64,
    pub l: i32,
    pub v: i32,
    pub k: i32,
    pub budget: i32,
    pub cache_lp: i32,
    pub best_first: i32,
}

/// SPEC stage 4: the walk (and the generator's advance, which reads `rng`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AcceptParams {
    pub logits: u64,
    pub s0: i64,
    pub s1: i64,
    pub s2: i64,
    pub verify_ids: u64,
    pub first_child: u64,
    pub next_sibling: u64,
    pub accepted_nodes: u64,
    pub accepted_tokens: u64,
    pub accept_index: u64,
    pub accept_len: u64,
    pub bonus: u64,
    pub status: u64,
    /// Null (0) with the three below: a greedy batch.
    pub temperature: u64,
    pub top_k: u64,
    pub top_p: u64,
    pub rng: u64,
    pub v: i32,
    pub q: i32,
    pub path_len: i32,
    pub cache_slice: i32,
}

/// SPEC stage 5: kept slots, compaction and the hidden gather.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommitParams {
    pub nodes: u64,
    pub status: u64,
    pub window: u64,
    pub kept: u64,
    pub release: u64,
    pub buffers: u64,
    pub hidden: u64,
    pub out: u64,
    pub row_bytes: i64,
    /// Rows of the smallest cache; < 0: slots unchecked.
    pub slots: i64,
    pub q: i32,
    pub path_len: i32,
}

/// SGLang's FULL mask.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MaskParams {
    pub ancestor_bits: u64,
    pub seq_lens: u64,
    pub out: u64,
    pub out_len: i64,
    pub q: i32,
    pub write_prefix: i32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    // The same numbers as the static_asserts in kernels/include/ddtree/params.h.
    #[test]
    fn build_params_match_the_header() {
        assert_eq!(size_of::<BuildParams>(), 192);
        assert_eq!(offset_of!(BuildParams, roots), 32);
        assert_eq!(offset_of!(BuildParams, stats), 160);
        assert_eq!(offset_of!(BuildParams, l), 168);
        assert_eq!(offset_of!(BuildParams, best_first), 188);
    }

    #[test]
    fn accept_params_match_the_header() {
        assert_eq!(size_of::<AcceptParams>(), 152);
        assert_eq!(offset_of!(AcceptParams, verify_ids), 32);
        assert_eq!(offset_of!(AcceptParams, rng), 128);
        assert_eq!(offset_of!(AcceptParams, v), 136);
        assert_eq!(offset_of!(AcceptParams, cache_slice), 148);
    }

    #[test]
    fn commit_and_mask_params_match_the_header() {
        assert_eq!(size_of::<CommitParams>(), 88);
        assert_eq!(offset_of!(CommitParams, row_bytes), 64);
        assert_eq!(offset_of!(CommitParams, q), 80);
        assert_eq!(size_of::<MaskParams>(), 40);
        assert_eq!(offset_of!(MaskParams, q), 32);
    }

    #[test]
    fn the_header_holds_the_asserted_numbers() {
        // The header's static_asserts must state the numbers these tests check (a change
        // to one side without the other fails here, not only on a GPU build).
        let header = include_str!("../../../kernels/include/ddtree/params.h");
        for line in [
            "sizeof(BuildParams) == 192",
            "offsetof(BuildParams, stats) == 160",
            "offsetof(BuildParams, L) == 168",
            "offsetof(BuildParams, best_first) == 188",
            "sizeof(AcceptParams) == 152",
            "offsetof(AcceptParams, rng) == 128",
            "offsetof(AcceptParams, cache_slice) == 148",
            "sizeof(CommitParams) == 88",
            "offsetof(CommitParams, q) == 80",
            "sizeof(MaskParams) == 40",
        ] {
            assert!(header.contains(line), "params.h lacks `{line}`");
        }
    }
}
