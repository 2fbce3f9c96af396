//! The kernels' ABI: the #[repr(C)] twins of `kernels/include/ddtree/params.h`, each passed
//! by value to its kernels (`__grid_constant__`). Device addresses are `u64`. The tests
//! below assert the sizes and offsets that the header's static_asserts hold, so a field
//! added on one side only fails the build there and `cargo test` here. The pointer groups
//! they nest (`TreePtrs`, `Scratch`, `WalkTree`, `AcceptPtrs`, `Sampling`) are the crate's
//! own launch types, #[repr(C)], each field's offset asserted.

use crate::{AcceptPtrs, Sampling, Scratch, TreePtrs, WalkTree};

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
    pub out: TreePtrs,
    pub scratch: Scratch,
    pub l: i32,
    pub v: i32,
    pub k: i32,
    pub budget: i32,
    pub cache_lp: i32,
    pub best_first: i32,
}

/// SPEC stage 1 as partials: the part, part-sum and merge launches (`partials.cuh`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PartialParams {
    pub logits: u64,
    pub s0: i64,
    pub s1: i64,
    pub s2: i64,
    pub l: i32,
    pub v: i32,
    pub k: i32,
    pub chunk: i32,
    pub parts: i32,
    pub part_base: i32,
    pub id0: i64,
    pub values: u64,
    pub ids: u64,
    pub maxima: u64,
    pub bad: u64,
    pub sums: u64,
    pub lp: u64,
    pub ti: u64,
    pub eligible: u64,
    pub row_bad: u64,
}

/// SPEC stage 4: the walk (and the generator's advance, which reads `sampling.rng`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AcceptParams {
    pub logits: u64,
    pub s0: i64,
    pub s1: i64,
    pub s2: i64,
    pub tree: WalkTree,
    pub out: AcceptPtrs,
    /// All null (0) for a greedy batch.
    pub sampling: Sampling,
    pub v: i32,
    pub q: i32,
    pub path_len: i32,
    /// `ACCEPT_CACHE_SLICE | ACCEPT_EXHAUSTIVE` bits (`kAcceptCacheSlice`, ...).
    pub flags: i32,
}

/// SPEC stage 4 over a vocabulary shard: each node's greedy and draw keys of this rank's
/// tokens (`accept_shard.cuh`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShardKeyParams {
    pub logits: u64,
    pub s0: i64,
    pub s1: i64,
    pub s2: i64,
    /// temperature and rng are read; all null (0) for a greedy batch.
    pub sampling: Sampling,
    pub greedy: u64,
    pub sampled: u64,
    pub id0: i64,
    pub v: i32,
    pub q: i32,
    pub bs: i32,
    pub reserved: i32,
}

/// The walk along the keys every rank gathered (`[tp, bs, Q]` each).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyWalkParams {
    pub greedy: u64,
    pub sampled: u64,
    /// float32 `[bs]`, or 0 for a greedy batch.
    pub temperature: u64,
    pub tree: WalkTree,
    pub out: AcceptPtrs,
    pub tp: i32,
    pub q: i32,
    pub path_len: i32,
    pub bs: i32,
}

/// A per-request parameter's element type in a `ParamSource` (`ParamDtype` in C++).
#[repr(i32)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ParamDtype {
    #[default]
    F32 = 0,
    F64 = 1,
    F16 = 2,
    Bf16 = 3,
    I32 = 4,
    I64 = 5,
}

/// Where a `SamplingLoad` takes one per-request parameter from: `scalar` for every request
/// (`ptr` 0), or element `i * stride` of a `[bs]` device tensor of `dtype`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ParamSource {
    pub ptr: u64,
    pub stride: i64,
    pub scalar: f64,
    pub dtype: ParamDtype,
    pub pad: i32,
}

impl ParamSource {
    /// The same value for every request.
    pub fn scalar(v: f64) -> Self {
        Self {
            scalar: v,
            ..Self::default()
        }
    }

    /// A temperature that makes every request greedy: the number 0 (a tensor may hold any
    /// mix, so it always takes the sampling kernel, greedy where it is 0).
    pub fn is_greedy(&self) -> bool {
        self.ptr == 0 && self.scalar == 0.0
    }
}

/// The Stepper's eager sampled accept: per-request parameters (scalars or the caller's
/// tensors) for `bs` requests and/or a new seed, written by the first node of its graph.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SamplingLoad {
    /// The sampling state written.
    pub to: Sampling,
    /// Temperature, top_k, top_p.
    pub from: [ParamSource; 3],
    pub seed: i64,
    /// Requests to fill; 0 leaves the parameters as they are.
    pub bs: i32,
    /// Nonzero: the generator restarts at (seed, 0).
    pub reseed: i32,
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

    // The same numbers as the static_asserts in kernels/include/ddtree/params.h, and the
    // header must state each of them (a change on one side only fails here).
    const HEADER: &str = include_str!("../../../kernels/include/ddtree/params.h");

    macro_rules! layout {
        ($t:ident, size $size:expr, $($f:ident $off:expr),*) => {{
            assert_eq!(size_of::<$t>(), $size, "size of {}", stringify!($t));
            let line = format!("sizeof({}) == {}", stringify!($t), $size);
            assert!(HEADER.contains(&line), "params.h lacks `{line}`");
            $(
                assert_eq!(offset_of!($t, $f), $off, "{}.{}", stringify!($t), stringify!($f));
                let line = format!("offsetof({}, {}) == {}", stringify!($t), stringify!($f), $off);
                assert!(HEADER.contains(&line), "params.h lacks `{line}`");
            )*
        }};
    }

    #[test]
    fn pointer_groups_match_the_header_field_by_field() {
        layout!(TreePtrs, size 96, positions 8, depths 16, parents 24, first_child 32,
                next_sibling 40, ancestor_bits 48, scores 56, num_nodes 64, topk_logprobs 72,
                topk_ids 80, status 88);
        layout!(Scratch, size 24, bad 8, stats 16);
        layout!(WalkTree, size 24, first_child 8, next_sibling 16);
        layout!(AcceptPtrs, size 48, accepted_tokens 8, accept_index 16, accept_len 24,
                bonus 32, status 40);
        layout!(Sampling, size 32, top_k 8, top_p 16, rng 24);
    }

    #[test]
    fn build_and_accept_params_match_the_header() {
        layout!(BuildParams, size 192, s0 8, s1 16, s2 24, roots 32, prefix 40, out 48,
                scratch 144, budget 180, cache_lp 184, best_first 188);
        layout!(AcceptParams, size 152, s0 8, s1 16, s2 24, tree 32, out 56, sampling 104,
                q 140, path_len 144, flags 148);
        // The dimension fields are upper case in C++.
        for (rust, cpp, off) in [
            (
                offset_of!(BuildParams, l),
                "offsetof(BuildParams, L) == 168",
                168,
            ),
            (
                offset_of!(BuildParams, v),
                "offsetof(BuildParams, V) == 172",
                172,
            ),
            (
                offset_of!(BuildParams, k),
                "offsetof(BuildParams, K) == 176",
                176,
            ),
            (
                offset_of!(AcceptParams, v),
                "offsetof(AcceptParams, V) == 136",
                136,
            ),
        ] {
            assert_eq!(rust, off, "{cpp}");
            assert!(HEADER.contains(cpp), "params.h lacks `{cpp}`");
        }
    }

    #[test]
    fn partial_params_match_the_header() {
        layout!(PartialParams, size 136, chunk 44, parts 48, part_base 52, id0 56, values 64,
                ids 72, maxima 80, bad 88, sums 96, lp 104, ti 112, eligible 120, row_bad 128);
        for (rust, cpp) in [
            (
                offset_of!(PartialParams, l),
                "offsetof(PartialParams, L) == 32",
            ),
            (
                offset_of!(PartialParams, v),
                "offsetof(PartialParams, V) == 36",
            ),
            (
                offset_of!(PartialParams, k),
                "offsetof(PartialParams, K) == 40",
            ),
        ] {
            assert!(HEADER.contains(cpp), "params.h lacks `{cpp}`");
            assert!(
                cpp.ends_with(&format!("== {rust}")),
                "{cpp}: Rust has {rust}"
            );
        }
    }

    #[test]
    fn shard_accept_params_match_the_header() {
        layout!(ShardKeyParams, size 104, s0 8, sampling 32, greedy 64, sampled 72, id0 80,
                q 92, bs 96);
        assert_eq!(offset_of!(ShardKeyParams, v), 88);
        assert!(HEADER.contains("offsetof(ShardKeyParams, V) == 88"));
        layout!(KeyWalkParams, size 112, temperature 16, tree 24, out 48, tp 96, q 100,
                path_len 104, bs 108);
    }

    #[test]
    fn sampling_load_matches_the_header() {
        layout!(ParamSource, size 32, ptr 0, stride 8, scalar 16, dtype 24, pad 28);
        layout!(SamplingLoad, size 144, to 0, from 32, seed 128, bs 136, reseed 140);
    }

    #[test]
    fn commit_and_mask_params_match_the_header() {
        layout!(CommitParams, size 88, status 8, window 16, kept 24, release 32, buffers 40,
                hidden 48, out 56, row_bytes 64, slots 72, q 80, path_len 84);
        layout!(MaskParams, size 40, seq_lens 8, out 16, out_len 24, q 32, write_prefix 36);
    }
}
