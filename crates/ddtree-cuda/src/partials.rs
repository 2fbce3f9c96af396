//! SPEC stage 1 as mergeable partials on the GPU (`kernels/include/ddtree/partials.cuh`):
//! a row's vocabulary cut into parts — chunks of one GPU's row, or of each tensor-parallel
//! rank's shard — each reduced to its top K, its maximum and (once every part's maximum is
//! known) its fixed-point exp-sum; the merge gives exactly the one-block stage 1 of the
//! whole row. Between the part launches and the merge, a caller may all-gather the part
//! arrays across ranks (a few hundred bytes a row instead of the row).
//!
//! Run on an H200 in session 18: exact against the one-block stage 1 on every benchmark
//! shape, but slower than it except at bs = 1 with large K (BENCHMARKS.md).

use crate::device::{enter_device, Device};
use crate::launch::{CANDIDATE_SMEM, CANDIDATE_THREADS, MAX_K};
use crate::params::PartialParams;
use crate::{launch_params, CudaError, Logits};
use cudarc::driver::sys::{CUfunction, CUstream};

/// Entries a merge selects among in shared memory (`kTieCap`): parts × K at most.
pub const MAX_PART_ENTRIES: usize = 8192;
/// Threads of a part-sum block (`kSumThreads`).
pub const SUM_THREADS: u32 = 256;
/// Rows a launch covers (its grid's x extent; the parts, at most MAX_PART_ENTRIES, are y).
pub const MAX_ROWS: usize = i32::MAX as usize;

/// The part arrays of a batch: `parts` lists of `k` per row, `[rows, parts(, k)]` each
/// (device pointers; `sums` holds two uint64 per part).
#[derive(Debug, Clone, Copy)]
pub struct PartArrays {
    pub rows: usize,
    pub parts: usize,
    pub k: usize,
    pub values: u64,
    pub ids: u64,
    pub maxima: u64,
    pub bad: u64,
    pub sums: u64,
}

impl PartArrays {
    /// Checks the arrays against the kernels' limits.
    pub fn check(&self) -> Result<(), CudaError> {
        let bad = |m: String| Err(CudaError::arg(m));
        if self.rows == 0 || self.rows > MAX_ROWS {
            return bad(format!(
                "rows: must be in 1..={MAX_ROWS}, got {}",
                self.rows
            ));
        }
        if self.k == 0 || self.k > MAX_K {
            return bad(format!("k: must be in 1..={MAX_K}, got {}", self.k));
        }
        if self.parts == 0 || self.parts * self.k > MAX_PART_ENTRIES {
            return bad(format!(
                "parts: {} lists of {} exceed the merge's {MAX_PART_ENTRIES} entries",
                self.parts, self.k
            ));
        }
        Ok(())
    }

    fn params(&self) -> PartialParams {
        PartialParams {
            k: self.k as i32,
            parts: self.parts as i32,
            values: self.values,
            ids: self.ids,
            maxima: self.maxima,
            bad: self.bad,
            sums: self.sums,
            ..Default::default()
        }
    }
}

/// Where one launch's logits sit among a row's parts: cut into `chunk`-token parts, the
/// first at `part_base`, token 0 being global id `id0` (a shard's first token).
#[derive(Debug, Clone, Copy)]
pub struct PartSlice {
    pub chunk: usize,
    pub part_base: usize,
    pub id0: usize,
}

impl PartSlice {
    /// How many parts `vocab` tokens make.
    pub fn count(&self, vocab: usize) -> usize {
        vocab.div_ceil(self.chunk.max(1))
    }

    fn params(&self, logits: &Logits, arrays: &PartArrays) -> Result<PartialParams, CudaError> {
        let [bs, depth, vocab] = logits.shape;
        if bs * depth != arrays.rows {
            return Err(CudaError::arg(format!(
                "logits: {bs} x {depth} rows, the part arrays {}",
                arrays.rows
            )));
        }
        if self.chunk == 0 || vocab == 0 {
            return Err(CudaError::arg(
                "logits: vocabulary and chunk must be ≥ 1".into(),
            ));
        }
        // Ties are ordered by a 32-bit id (`composite`): every global id must fit one.
        if self.id0 + vocab > i32::MAX as usize {
            return Err(CudaError::arg(format!(
                "id0: ids {}..{} exceed the kernels' 32-bit ids",
                self.id0,
                self.id0 + vocab
            )));
        }
        if self.part_base + self.count(vocab) > arrays.parts {
            return Err(CudaError::arg(format!(
                "part_base: parts {}..{} exceed the arrays' {}",
                self.part_base,
                self.part_base + self.count(vocab),
                arrays.parts
            )));
        }
        Ok(PartialParams {
            logits: logits.ptr,
            s0: logits.strides[0],
            s1: logits.strides[1],
            s2: logits.strides[2],
            l: depth as i32,
            v: vocab as i32,
            chunk: self.chunk.min(vocab) as i32,
            part_base: self.part_base as i32,
            id0: self.id0 as i64,
            ..arrays.params()
        })
    }
}

/// The chunk that cuts `vocab` into parts enough to give `rows` rows about `blocks` blocks
/// in all, each part at least `k` and 4096 tokens (a 1024-thread block reads 4 or more a
/// thread) and at most [`MAX_PART_ENTRIES`] / `k` parts a row; a multiple of 64 tokens, so
/// that every part starts 16-byte aligned when the row does.
pub fn chunk_for(vocab: usize, k: usize, rows: usize, blocks: usize) -> usize {
    let wanted = blocks
        .div_ceil(rows.max(1))
        .clamp(1, (MAX_PART_ENTRIES / k.max(1)).max(1));
    let chunk = vocab.div_ceil(wanted).max(k).max(4096);
    let chunk = chunk.div_ceil(64) * 64;
    // Rounding up may leave more parts than the merge holds: widen until it does not.
    let mut c = chunk;
    while vocab.div_ceil(c) * k > MAX_PART_ENTRIES {
        c += 64;
    }
    c
}

/// A launch over every (row, part) of a slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartStage {
    /// Each part's top K, maximum and NaN/+inf flag into the part arrays.
    Parts,
    /// Each part's fixed-point exp-sum against its row's maximum over every part's maximum
    /// in `arrays.maxima` (all of them written first: this launch's, and on other ranks,
    /// gathered).
    Sums,
}

/// The `stage` launch over this slice's parts, into `arrays`.
///
/// # Safety
/// Live device pointers of the stated shapes on device `ordinal`.
pub unsafe fn stage1_parts(
    stage: PartStage,
    ordinal: usize,
    stream: u64,
    logits: Logits,
    slice: PartSlice,
    arrays: PartArrays,
) -> Result<(), CudaError> {
    let (call, fns, threads, smem): (_, fn(&Device) -> &[CUfunction; 3], _, _) = match stage {
        PartStage::Parts => (
            "cuLaunchKernel(partials)",
            |d| &d.partials,
            CANDIDATE_THREADS,
            CANDIDATE_SMEM,
        ),
        PartStage::Sums => (
            "cuLaunchKernel(partial_sums)",
            |d| &d.partial_sums,
            SUM_THREADS,
            0,
        ),
    };
    arrays.check()?;
    let p = slice.params(&logits, &arrays)?;
    let (dev, _ctx) = enter_device(ordinal)?;
    let grid = (arrays.rows as u32, slice.count(logits.shape[2]) as u32, 1);
    let f = fns(&dev)[logits.dtype.index()];
    launch_params(call, f, grid, threads, smem, stream as CUstream, &p)
}

/// Stage 1's outputs of each row from its parts: log-probs and ids `[rows, k]` (float32,
/// int64), finite ranks and the NaN/+inf flag `[rows]` (int32 each), as the one-block
/// stage 1 writes them for the whole row.
///
/// # Safety
/// As [`stage1_parts`]; every part of every row written (parts and sums).
pub unsafe fn stage1_merge(
    ordinal: usize,
    stream: u64,
    arrays: PartArrays,
    lp: u64,
    ti: u64,
    eligible: u64,
    row_bad: u64,
) -> Result<(), CudaError> {
    arrays.check()?;
    let p = PartialParams {
        lp,
        ti,
        eligible,
        row_bad,
        ..arrays.params()
    };
    let (dev, _ctx) = enter_device(ordinal)?;
    let grid = (arrays.rows as u32, 1, 1);
    launch_params(
        "cuLaunchKernel(merge_partials)",
        dev.merge_partials,
        grid,
        CANDIDATE_THREADS,
        CANDIDATE_SMEM,
        stream as CUstream,
        &p,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Dtype;

    fn arrays(rows: usize, parts: usize, k: usize) -> PartArrays {
        PartArrays {
            rows,
            parts,
            k,
            values: 0,
            ids: 0,
            maxima: 0,
            bad: 0,
            sums: 0,
        }
    }

    #[test]
    fn chunks_fill_the_gpu_within_the_merges_room() {
        // bs = 1, L = 15: about 264 blocks (two a SM on 132 SMs).
        for k in [1, 8, 64, 255, 1023] {
            let c = chunk_for(151_936, k, 15, 264);
            let parts = 151_936usize.div_ceil(c);
            assert_eq!(c % 64, 0, "k={k}");
            assert!(c >= 4096 && c >= k, "k={k}: {c}");
            assert!(parts * k <= MAX_PART_ENTRIES, "k={k}: {parts} parts");
            assert!(parts >= 2.min(MAX_PART_ENTRIES / k), "k={k}: {parts} parts");
        }
        // Many rows already fill it: one part a row.
        assert_eq!(151_936usize.div_ceil(chunk_for(151_936, 255, 960, 264)), 1);
        // A vocabulary smaller than a chunk is one part.
        assert_eq!(chunk_for(1000, 8, 1, 264), 4096);
    }

    #[test]
    fn limits_are_checked_before_a_launch() {
        assert!(arrays(15, 8, 1024).check().is_ok());
        assert!(arrays(15, 9, 1024).check().is_err());
        assert!(arrays(0, 1, 8).check().is_err());
        assert!(
            arrays(70_000, 1, 8).check().is_ok(),
            "rows run along the grid's x"
        );
        assert!(arrays(15, 1, 1025).check().is_err());
        let logits = Logits {
            ptr: 0,
            dtype: Dtype::Bf16,
            shape: [1, 15, 10_000],
            strides: [150_000, 10_000, 1],
        };
        let slice = PartSlice {
            chunk: 4096,
            part_base: 0,
            id0: 0,
        };
        assert!(slice.params(&logits, &arrays(15, 3, 8)).is_ok());
        assert!(
            slice.params(&logits, &arrays(15, 2, 8)).is_err(),
            "3 parts in 2"
        );
        assert!(PartSlice {
            part_base: 1,
            ..slice
        }
        .params(&logits, &arrays(15, 3, 8))
        .is_err());
        assert!(slice.params(&logits, &arrays(14, 3, 8)).is_err(), "rows");
        let far = PartSlice {
            id0: i32::MAX as usize - 5000,
            ..slice
        };
        assert!(
            far.params(&logits, &arrays(15, 3, 8)).is_err(),
            "ids past 2^31"
        );
    }
}
