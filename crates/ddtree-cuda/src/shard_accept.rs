//! SPEC stage 4 over vocabulary shards (tensor parallelism; `kernels/include/ddtree/
//! accept_shard.cuh`): each rank turns its shard of the target logits into one greedy and
//! one draw key per node (`shard_keys`), the caller gathers the ranks' keys in rank order,
//! and every rank walks the tree along the maximum over them (`walk_keys`), which is the
//! single-GPU walk's posterior bit for bit. Temperature sampling only: top_k / top_p need
//! the whole row.
//!
//! Written in session 18 and not yet run on a GPU: compiled for sm_90 and sm_120 only.

use crate::accept::{AcceptPtrs, Sampling, WalkTree, ACCEPT_MAX_VOCAB, LINK_CAP};
use crate::device::enter_device;
use crate::params::{KeyWalkParams, ShardKeyParams};
use crate::{CudaError, Dtype, Kernel, Logits, Params};

/// Threads of a shard-keys block (`kShardKeyThreads`) and of a walk block
/// (`kKeyWalkThreads`).
pub const SHARD_KEY_THREADS: u32 = 256;
pub const KEY_WALK_THREADS: u32 = 128;
/// Node rows a keys launch covers (its grid's x extent).
pub const MAX_NODE_ROWS: usize = i32::MAX as usize;

/// The `[bs, Q]` key arrays of one rank (uint64 device tensors).
#[derive(Debug, Clone, Copy)]
pub struct ShardKeys {
    pub greedy: u64,
    pub sampled: u64,
}

/// The keys launch's parameters for this rank's `shard` (`[bs, Q, V_r]`, token 0 being
/// global id `id0`; `vocab` the whole vocabulary), checked.
pub fn shard_key_params(
    shard: Logits,
    id0: usize,
    vocab: usize,
    keys: ShardKeys,
    sampling: Option<Sampling>,
) -> Result<ShardKeyParams, CudaError> {
    let [bs, q, v] = shard.shape;
    let bad = |m: String| Err(CudaError::arg(m));
    if bs == 0 || q == 0 || v == 0 || bs * q > MAX_NODE_ROWS {
        return bad(format!(
            "target_logits: shard shape {:?} is empty or too large",
            shard.shape
        ));
    }
    if vocab > ACCEPT_MAX_VOCAB || id0 + v > vocab {
        return bad(format!(
            "vocab_start: shard [{id0}, {}) outside a vocabulary of {vocab} (at most \
             {ACCEPT_MAX_VOCAB})",
            id0 + v
        ));
    }
    let [s0, s1, s2] = shard.strides;
    Ok(ShardKeyParams {
        logits: shard.ptr,
        s0,
        s1,
        s2,
        sampling: sampling.unwrap_or_default(),
        greedy: keys.greedy,
        sampled: keys.sampled,
        id0: id0 as i64,
        v: v as i32,
        q: q as i32,
        bs: bs as i32,
        reserved: 0,
    })
}

/// The walk's parameters: `tp` ranks' keys gathered `[tp, bs, Q]`; `temperature` the
/// float32 `[bs]` of the sampling state, or None for a greedy batch.
pub fn key_walk_params(
    tp: usize,
    shape: [usize; 2],
    path_len: usize,
    gathered: ShardKeys,
    temperature: Option<u64>,
    tree: WalkTree,
    out: AcceptPtrs,
) -> Result<KeyWalkParams, CudaError> {
    let [bs, q] = shape;
    if tp == 0 || bs == 0 || q == 0 || path_len == 0 || bs > MAX_NODE_ROWS {
        return Err(CudaError::arg(format!(
            "group: a walk of {tp} ranks' keys over [{bs}, {q}] nodes, paths of {path_len}"
        )));
    }
    Ok(KeyWalkParams {
        greedy: gathered.greedy,
        sampled: gathered.sampled,
        temperature: temperature.unwrap_or(0),
        tree,
        out,
        tp: tp as i32,
        q: q as i32,
        path_len: path_len as i32,
        bs: bs as i32,
    })
}

/// Dynamic shared memory of a walk block: the tree's links when they fit.
pub fn key_walk_smem(q: usize) -> usize {
    if q <= LINK_CAP {
        12 * q
    } else {
        0
    }
}

/// Launches the keys of `p` on `stream`.
///
/// # Safety
/// Every pointer in `p` must address live device memory of its shape on device `ordinal`.
pub unsafe fn shard_keys(
    ordinal: usize,
    stream: u64,
    dtype: Dtype,
    p: &ShardKeyParams,
) -> Result<(), CudaError> {
    let (dev, _ctx) = enter_device(ordinal)?;
    let f = dev.shard_keys[dtype.index()];
    let k = Kernel {
        call: "cuLaunchKernel(shard_keys)",
        f,
        grid: ((p.bs as usize * p.q as usize) as u32, 1, 1),
        block: SHARD_KEY_THREADS,
        smem: 0,
    };
    k.launch(stream, &mut Params::one(p))
}

/// Launches the walk of `p` on `stream`.
///
/// # Safety
/// As [`shard_keys`].
pub unsafe fn walk_keys(ordinal: usize, stream: u64, p: &KeyWalkParams) -> Result<(), CudaError> {
    let (dev, _ctx) = enter_device(ordinal)?;
    let k = Kernel {
        call: "cuLaunchKernel(walk_keys)",
        f: dev.walk_keys,
        grid: (p.bs as u32, 1, 1),
        block: KEY_WALK_THREADS,
        smem: key_walk_smem(p.q as usize),
    };
    k.launch(stream, &mut Params::one(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(shape: [usize; 3]) -> Logits {
        Logits {
            ptr: 0x1000,
            dtype: Dtype::Bf16,
            shape,
            strides: [(shape[1] * shape[2]) as i64, shape[2] as i64, 1],
        }
    }
    const KEYS: ShardKeys = ShardKeys {
        greedy: 0x2000,
        sampled: 0x3000,
    };

    #[test]
    fn a_shard_keys_its_tokens_by_global_id() {
        let p = shard_key_params(shard([2, 5, 100]), 300, 400, KEYS, None).unwrap();
        assert_eq!((p.id0, p.v, p.q, p.bs), (300, 100, 5, 2));
        assert_eq!((p.s0, p.s1, p.s2), (500, 100, 1));
        assert_eq!(
            p.sampling,
            Sampling::default(),
            "greedy: no sampling pointers"
        );
        assert_eq!((p.greedy, p.sampled), (0x2000, 0x3000));
    }

    #[test]
    fn a_shard_past_the_vocabulary_or_the_key_ids_is_refused() {
        let err = |r: Result<ShardKeyParams, CudaError>| format!("{}", r.unwrap_err());
        assert!(
            err(shard_key_params(shard([2, 5, 100]), 301, 400, KEYS, None)).contains("vocab_start")
        );
        let big = ACCEPT_MAX_VOCAB + 1;
        assert!(
            err(shard_key_params(shard([1, 1, 10]), 0, big, KEYS, None)).contains("vocab_start")
        );
        assert!(
            err(shard_key_params(shard([0, 5, 100]), 0, 100, KEYS, None)).contains("target_logits")
        );
    }

    #[test]
    fn the_walk_reads_tp_ranks_and_keeps_links_in_shared_memory_when_they_fit() {
        let p = key_walk_params(
            3,
            [4, 16],
            9,
            KEYS,
            Some(0x4000),
            WalkTree::default(),
            AcceptPtrs::default(),
        )
        .unwrap();
        assert_eq!(
            (p.tp, p.bs, p.q, p.path_len, p.temperature),
            (3, 4, 16, 9, 0x4000)
        );
        assert_eq!(key_walk_smem(16), 192);
        assert_eq!(key_walk_smem(LINK_CAP + 1), 0);
        let none = key_walk_params(
            0,
            [4, 16],
            9,
            KEYS,
            None,
            WalkTree::default(),
            AcceptPtrs::default(),
        );
        assert!(none.is_err());
    }
}
