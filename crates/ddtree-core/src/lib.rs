//! ddtree-core: a DDTree round on the CPU, exactly as `SPEC.md` defines it.
//!
//! Modules are named after SPEC.md's stages so the reference (`ddtree.reference`), this
//! crate and the CUDA kernels read side by side:
//! [`candidates`] (stage 1), [`select`] (stage 2), [`emit`] (stage 3), [`accept`] (stage 4),
//! [`commit`] (stage 5); [`batch`] runs a whole batch of requests in parallel; [`shard`] is
//! stage 1 split across vocabulary shards (tensor parallelism).

pub mod accept;
pub mod batch;
pub mod candidates;
pub mod commit;
pub mod emit;
mod error;
pub mod logits;
pub mod round;
pub mod sample;
pub mod select;
pub mod shard;
pub mod status;

pub use error::{ArgError, Result};
