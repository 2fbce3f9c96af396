//! Launch geometry of the three build stages, as plain arithmetic (tested without a GPU).

use crate::CudaError;

/// Threads per block of the candidates kernel (must match `kCandThreads`).
pub const CANDIDATE_THREADS: u32 = 1024;
/// Dynamic shared memory of the candidates kernel (`kCandSmem`, checked there by a
/// static_assert against the size of its shared state).
pub const CANDIDATE_SMEM: usize = 88 * 1024;
/// Largest K the candidates kernel sorts in shared memory (`kMaxK`).
pub const MAX_K: usize = 1024;
/// Largest budget the selection kernel supports (`kMaxBudget`).
pub const MAX_BUDGET: usize = 1023;
/// Deepest tree the selection kernel packs (`kMaxSelectDepth`).
pub const MAX_DEPTH: usize = 20;
/// Dynamic shared memory a block may ask for on every target (sm_120's opt-in limit).
pub const MAX_DYNAMIC_SMEM: usize = 99 * 1024;
/// Threads per block of the selection kernel (`kSelectThreads`).
pub const SELECT_THREADS: u32 = 512;
/// Paths the parallel selection enumerates at most (`kStoreCap`).
pub const SELECT_STORE_CAP: usize = 4096;
/// Threads per block of the emit and mask kernels.
pub const EMIT_THREADS: u32 = 256;
/// Verify slots whose ancestor rows one emit block fills (`kEmitRows`).
pub const EMIT_ROWS: usize = 128;

/// Emit blocks a request, each filling the ancestor rows of EMIT_ROWS slots (mirror of
/// `emit_parts` in `emit.cuh`): a request of Q = 1024 spreads its 32k (row, word) pairs over
/// eight blocks instead of one.
pub fn emit_parts(q: usize) -> u32 {
    q.div_ceil(EMIT_ROWS) as u32
}

/// Threads of a stage-1 block where two share an SM (`launch::candidate_threads`).
pub const CANDIDATE_HALF_THREADS: u32 = CANDIDATE_THREADS / 2;
/// The largest K stage 1 launches half blocks for (`launch::candidate_threads`).
pub const CANDIDATE_HALF_MAX_K: usize = 256;

/// Blocks of the one-block-a-row stage-1 kernel a GPU holds at once, at
/// [`CANDIDATE_THREADS`] threads a block (`whole`) and at [`CANDIDATE_HALF_THREADS`]
/// (`half`), by the driver's occupancy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Resident {
    pub whole: u32,
    pub half: u32,
}

/// Threads a block of the one-block-a-row stage-1 kernel: half blocks where the rows fill
/// more than one wave of whole blocks and the GPU holds twice as many half blocks (the
/// H200: 228 KB of shared memory an SM; not sm_120's 100 KB). Two blocks on an SM are
/// rarely in the same phase, so one's first pass (waiting on memory) runs beside the
/// other's second (bound by its instructions). K must be small beside a half block: pass
/// 2's floor is the K-th largest of the threads' maxima (two a thread), and the lower it is
/// the more tokens pass 2 keeps and ranks. Measured on the H200 at bs = 64 (BENCHMARKS
/// session 29): half blocks 1.2x faster at K = 255, 2x slower at K = 1023; the cut at
/// K = 256 is not measured between. Spreading each row over a pair of half blocks (a
/// cluster of two, so that as few rows are open at once as with whole blocks and second
/// passes hit L2) measured slower than one row a half block (234 µs against 207 at bs = 64,
/// K = 63; branch `wip/stage1-pairs`). The output is the same either way.
pub fn candidate_threads(shape: &BuildShape, resident: Resident) -> u32 {
    let rows = (shape.bs * shape.depth) as u64;
    let halves = resident.whole > 0 && resident.half >= 2 * resident.whole;
    let k_fits = shape.k <= CANDIDATE_HALF_MAX_K;
    if halves && k_fits && rows > u64::from(resident.whole) {
        CANDIDATE_HALF_THREADS
    } else {
        CANDIDATE_THREADS
    }
}

/// The largest K whose one-block-a-row stage-1 kernel may read a row once
/// (`kOneReadMaxK`, candidates.cuh).
pub const ONE_READ_MAX_K: usize = 128;

/// Which build of the one-block-a-row stage-1 kernel a shape runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OneBlockKernel {
    /// `ddtree_candidates_*`: one read where the row allows it, else two.
    MayReadOnce,
    /// `ddtree_candidates_wide_*`: the two reads alone, for K past [`ONE_READ_MAX_K`],
    /// which never reads once. The same outputs; compiled without the one read's code it
    /// spills no registers (ptxas -v: 16 bytes otherwise) and ran stage 1 at bs = 64,
    /// K = 255 1.07x faster on the H100 (BENCHMARKS.md, session 37).
    TwoReads,
}

/// The one-block-a-row stage-1 kernel for `shape` ([`OneBlockKernel`]).
pub fn one_block_candidates(shape: &BuildShape) -> OneBlockKernel {
    if shape.k <= ONE_READ_MAX_K {
        OneBlockKernel::MayReadOnce
    } else {
        OneBlockKernel::TwoReads
    }
}

/// The largest budget whose selection runs the best-first warp rather than the parallel
/// threshold search (`select_best_first`).
pub const BEST_FIRST_MAX_BUDGET: usize = 31;

/// Whether the selection of a `budget`-node tree runs the best-first warp: a pop costs it
/// about 0.8 µs, while the parallel search pays about 20 µs whatever the budget (its first
/// threshold, a block-wide step a level, the ranking). Measured on the H100 (BENCHMARKS.md,
/// session 42; L = 15, V = 151,936): the warp at B = 7, 15, 23, 31 took 10.7, 16.1, 21.3,
/// 26.8 µs at bs = 1 against 16.3, 22.3, 24.6, 25.6, and 10.9, 17.0, 22.5, 28.8 at bs = 64
/// against 19.2, 24.2, 37.2, 37.7; at B = 39 it was 1.2x slower at bs = 1. Those are the
/// bench's DFlash-like rows (a few strong tokens a depth: deep, narrow trees). On flat rows
/// (`tests/gpu_sglang_bench.py`: Gaussian logits, bushy trees of two or three levels, where
/// the parallel search runs few levels) the whole build at B = 15 was 1.02-1.05x slower
/// with the warp (53.4 against 50.8 µs at bs = 1). Both give the SPEC's order exactly;
/// `force_parallel` (a stage bit, for tests and benchmarks) keeps the parallel search at
/// every budget.
pub fn select_best_first(budget: usize, force_parallel: bool) -> bool {
    !force_parallel && budget <= BEST_FIRST_MAX_BUDGET
}

/// Blocks a row of the clustered stage-1 kernel (`kCandCluster`).
pub const CANDIDATE_CLUSTER: u32 = 8;
/// The smallest vocabulary the clustered kernel takes (`kClusterMinVocab`: every block's
/// chunk then holds a token).
pub const CLUSTER_MIN_VOCAB: usize = 4096;

/// The largest K stage 1 spreads rows over clusters for (`launch::cluster_rows`).
pub const CLUSTER_MAX_K: usize = 256;

/// Whether stage 1 spreads each row over a cluster of [`CANDIDATE_CLUSTER`] blocks: when
/// every row's cluster fits on the GPU at once (`clusters`: the driver's count of clusters
/// it holds at once), so one block a row would leave most SMs idle, the rows are long
/// enough to split, and K is at most [`CLUSTER_MAX_K`]. Each block still pays the kernel's
/// fixed tail (the K-th largest thread maximum, its select and sort, then block 0's merge
/// of every block's K), so a second wave of clusters costs more than one block a row
/// (measured on the H200: bs = 8, 120 rows, 294 µs against 85), and so does a large K:
/// at bs = 1 the cluster took 24.8 µs against one block's 31.0 at K = 63, 32.0 against
/// 32.9 at K = 255, but 76.6 against 53.7 at K = 1023 (BENCHMARKS, session 30). The output
/// is the same either way.
pub fn cluster_rows(shape: &BuildShape, clusters: u32) -> bool {
    shape.vocab >= CLUSTER_MIN_VOCAB
        && shape.k <= CLUSTER_MAX_K
        && (shape.bs * shape.depth) as u64 <= u64::from(clusters)
}

/// The shapes of one GPU build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BuildShape {
    pub bs: usize,
    pub depth: usize,
    pub vocab: usize,
    pub budget: usize,
    pub k: usize,
}

impl BuildShape {
    /// Checks the shape against the kernels' limits.
    pub fn check(&self) -> Result<(), CudaError> {
        let bad = |what: &str| Err(CudaError::arg(what.to_string()));
        if self.bs == 0 || self.depth == 0 || self.vocab == 0 {
            return bad("draft_logits: every dimension must be ≥ 1");
        }
        if self.depth > MAX_DEPTH {
            return bad(&format!(
                "draft_logits: depth {} exceeds the GPU limit {MAX_DEPTH}",
                self.depth
            ));
        }
        if self.budget == 0 || self.budget > MAX_BUDGET {
            return bad(&format!(
                "budget: must be in 1..={MAX_BUDGET} on the GPU, got {}",
                self.budget
            ));
        }
        if self.k == 0 || self.k > MAX_K.min(self.budget).min(self.vocab) {
            return bad(&format!(
                "topk: K = {} must be in 1..=min(budget, V)",
                self.k
            ));
        }
        if self.vocab > i32::MAX as usize || self.bs * self.depth > i32::MAX as usize {
            return bad("draft_logits: too large for 32-bit grid indices");
        }
        Ok(())
    }

    pub fn q(&self) -> usize {
        self.budget + 1
    }

    /// Shared memory of the selection kernel (the parallel store and the best-first
    /// fallback share it) and whether the fallback caches the log-probs in it.
    pub fn select_smem(&self) -> (usize, bool) {
        let store = store_smem_bytes();
        let with_lp = select_smem_bytes(self.budget, self.depth, self.k, true);
        if with_lp <= MAX_DYNAMIC_SMEM {
            (with_lp.max(store), true)
        } else {
            let without = select_smem_bytes(self.budget, self.depth, self.k, false);
            (without.max(store), false)
        }
    }
}

/// Mirror of `Store::bytes` in `select_parallel.cuh`.
pub fn store_smem_bytes() -> usize {
    const SORT_CAP: usize = 1024;
    SELECT_STORE_CAP * (8 + 2 + 2 + 2 + 1 + 1) + (SELECT_STORE_CAP + 1) * 4 + SORT_CAP * (8 + 4)
}

/// Mirror of `SelectSmem::bytes` in `select.cuh` (the best-first fallback).
pub fn select_smem_bytes(budget: usize, depth: usize, k: usize, cache_lp: bool) -> usize {
    let n = budget + 1;
    let frontier = n * (8 + 8 + 8 * 4 + 2 + 2 + 2 + 1);
    let nodes = n * (8 + 2 + 2 + 1 + 2 + 2);
    let b = (frontier + nodes + 15) & !15;
    b + if cache_lp { depth * k * 4 } else { 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_budgets_select_best_first_unless_forced_parallel() {
        assert!(select_best_first(1, false));
        assert!(select_best_first(BEST_FIRST_MAX_BUDGET, false));
        assert!(!select_best_first(BEST_FIRST_MAX_BUDGET + 1, false));
        assert!(!select_best_first(MAX_BUDGET, false));
        assert!(!select_best_first(1, true));
    }

    #[test]
    fn emit_parts_cover_every_slot_once() {
        for q in [1, 2, 64, 128, 129, 256, 1024] {
            let parts = emit_parts(q) as usize;
            assert!(
                parts * EMIT_ROWS >= q && (parts - 1) * EMIT_ROWS < q,
                "q = {q}"
            );
        }
        assert_eq!(emit_parts(64), 1);
        assert_eq!(emit_parts(1024), 8);
        // The grid's parts must be the kernel's: fewer would leave ancestor rows unwritten.
        let header = include_str!("../../../kernels/include/ddtree/emit.cuh");
        assert!(header.contains(&format!("kEmitRows = {EMIT_ROWS};")));
    }

    #[test]
    fn the_wide_kernel_takes_exactly_the_ks_past_the_one_read() {
        assert_eq!(
            one_block_candidates(&shape(255, 1)),
            OneBlockKernel::MayReadOnce
        );
        let at = |k| one_block_candidates(&shape(255, k));
        assert_eq!(at(ONE_READ_MAX_K), OneBlockKernel::MayReadOnce);
        assert_eq!(at(ONE_READ_MAX_K + 1), OneBlockKernel::TwoReads);
        assert_eq!(at(1023), OneBlockKernel::TwoReads);
        // The kernel's own cut must be this one: past it one_read never runs, so the wide
        // kernel (every dtype's) gives up nothing.
        let header = include_str!("../../../kernels/include/ddtree/candidates.cuh");
        assert!(header.contains(&format!("kOneReadMaxK = {ONE_READ_MAX_K};")));
        let entry = include_str!("../../../kernels/candidates.cu");
        for dtype in ["f32", "f16", "bf16"] {
            assert!(entry.contains(&format!("ddtree_candidates_wide_{dtype},")));
        }
    }

    fn shape(budget: usize, k: usize) -> BuildShape {
        BuildShape {
            bs: 64,
            depth: 15,
            vocab: 151936,
            budget,
            k,
        }
    }

    #[test]
    fn half_blocks_only_past_one_wave_where_two_fit_an_sm_and_k_fits_one() {
        let h200 = Resident {
            whole: 132,
            half: 264,
        };
        let rows = |bs, k| BuildShape {
            bs,
            k,
            ..shape(255, 255)
        };
        // bs = 64 (960 rows) at K = 255: two half blocks an SM.
        assert_eq!(candidate_threads(&rows(64, 255), h200), 512);
        assert_eq!(candidate_threads(&rows(64, 256), h200), 512);
        // A larger K lowers a half block's floor: whole blocks.
        assert_eq!(candidate_threads(&rows(64, 257), h200), 1024);
        assert_eq!(candidate_threads(&rows(64, 1023), h200), 1024);
        // bs = 8 (120 rows) fits one wave of whole blocks.
        assert_eq!(candidate_threads(&rows(8, 255), h200), 1024);
        assert_eq!(candidate_threads(&rows(9, 255), h200), 512);
        // sm_120 (100 KB an SM): one block an SM either way.
        let sm120 = Resident {
            whole: 188,
            half: 188,
        };
        assert_eq!(candidate_threads(&rows(64, 255), sm120), 1024);
        // The driver could not say (for either size, or for whole blocks).
        assert_eq!(candidate_threads(&rows(64, 255), Resident::default()), 1024);
        let unknown_whole = Resident {
            whole: 0,
            half: 264,
        };
        assert_eq!(candidate_threads(&rows(64, 255), unknown_whole), 1024);
    }

    #[test]
    fn rows_spread_over_clusters_only_where_they_leave_sms_idle() {
        let rows = |bs, depth, vocab| BuildShape {
            bs,
            depth,
            vocab,
            ..shape(63, 63)
        };
        // With 16 clusters at once: bs = 1 at L = 15 (15 rows) and 2 x 8 fit, 17 rows do not.
        assert!(cluster_rows(&rows(1, 15, 151936), 16));
        assert!(cluster_rows(&rows(2, 8, 151936), 16));
        assert!(!cluster_rows(&rows(1, 17, 151936), 16));
        assert!(!cluster_rows(&rows(8, 15, 151936), 16));
        // No cluster fits (a small MIG slice, or the driver could not tell): one block a row.
        assert!(!cluster_rows(&rows(1, 1, 151936), 0));
        // A K past CLUSTER_MAX_K: one block a row (each block's tail and the merge grow
        // with K).
        let wide = |k| BuildShape {
            k,
            ..rows(1, 15, 151936)
        };
        assert!(cluster_rows(&wide(CLUSTER_MAX_K), 16));
        assert!(!cluster_rows(&wide(CLUSTER_MAX_K + 1), 16));
        assert!(!cluster_rows(&wide(1023), 16));
        // Rows too short to give every block of a cluster a chunk stay one block a row.
        assert!(!cluster_rows(&rows(1, 15, CLUSTER_MIN_VOCAB - 1), 16));
        assert!(cluster_rows(&rows(1, 15, CLUSTER_MIN_VOCAB), 16));
    }

    #[test]
    fn the_cluster_constants_are_the_headers() {
        // The grid's blocks a row and the launcher's shortest row must be the kernel's: a
        // cluster size that differs from `__cluster_dims__` fails the launch, and a shorter
        // row would leave a block without a chunk.
        let header = include_str!("../../../kernels/include/ddtree/candidates_cluster.cuh");
        assert!(header.contains(&format!("kCandCluster = {CANDIDATE_CLUSTER};")));
        assert!(header.contains(&format!("kClusterMinVocab = {CLUSTER_MIN_VOCAB};")));
    }

    #[test]
    fn every_supported_shape_fits_sm120_shared_memory() {
        for budget in [1, 63, 255, 511, 1023] {
            for k in [1, budget / 2 + 1, budget] {
                let (bytes, _) = shape(budget, k).select_smem();
                assert!(bytes <= MAX_DYNAMIC_SMEM, "B={budget} K={k}: {bytes}");
            }
        }
    }

    #[test]
    fn log_probs_are_cached_when_they_fit() {
        assert_eq!(
            shape(255, 255).select_smem(),
            (store_smem_bytes(), true),
            "the parallel store is the larger part at B = 255"
        );
        assert!(select_smem_bytes(255, 15, 255, true) < store_smem_bytes());
        let (_, cached) = shape(1023, 1023).select_smem();
        assert!(!cached, "15 x 1023 floats do not fit beside the frontier");
    }

    #[test]
    fn limits_are_checked() {
        assert!(shape(255, 255).check().is_ok());
        assert!(shape(1024, 1024).check().is_err());
        assert!(shape(255, 256).check().is_err());
        assert!(BuildShape {
            depth: 21,
            ..shape(7, 7)
        }
        .check()
        .is_err());
        assert!(BuildShape {
            bs: 0,
            ..shape(7, 7)
        }
        .check()
        .is_err());
    }
}
