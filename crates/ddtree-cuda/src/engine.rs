//! The round engine behind a CUDA `Stepper`: built once from the Stepper's limits and the
//! device addresses of its static buffers (allocated through PyTorch, kept alive by the
//! Stepper), it remembers the last step's shape and launches every stage of a round on the
//! caller's stream. A call passes only that call's tensors; the checks that need no GPU
//! (`plan_step`, `plan_accept`) are plain arithmetic, tested without one.

use crate::accept::{accept_launches, AcceptPtrs, Sampling, WalkTree};
use crate::commit::{compact_kv, gather_hidden, kept_slots, CommitPath};
use crate::device::{enter_device, Device};
use crate::graph::{is_capturing, run, GraphCache, KernelGraph, Node};
use crate::launch::BuildShape;
use crate::params::{AcceptParams, BuildParams, ParamSource, SamplingLoad};
use crate::readback::{readback, readback_kernel, ReadbackRing, ReadbackSrc};
use crate::{
    build_kernels, build_params, CudaError, Kernel, Logits, Params, Scratch, TreePtrs, ALL_STAGES,
};
pub use ddtree_core::round::{Limits, Planner, Round};

const LOAD_SAMPLING_THREADS: u32 = 256;

/// A core argument error as this crate's (a `ValueError` naming the argument in Python).
fn arg_error(e: ddtree_core::ArgError) -> CudaError {
    CudaError::arg(e.to_string())
}

/// What an accept graph's nodes hold: the sampling load, the walk's struct and the
/// readback's arguments.
type AcceptGraph = (
    Option<SamplingLoad>,
    AcceptParams,
    Option<(ReadbackRing, ReadbackSrc)>,
);

fn load_kernel(dev: &Device) -> Kernel {
    Kernel {
        call: "cuLaunchKernel(load_sampling)",
        f: dev.load_sampling,
        grid: (1, 1, 1),
        block: LOAD_SAMPLING_THREADS,
        smem: 0,
    }
}

/// The KV caches `compact_kv` moves rows in, registered once: the device table of their
/// base addresses, how many, their row size and the rows every one of them holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheTable {
    pub table: u64,
    pub count: usize,
    pub row_bytes: usize,
    pub slots: usize,
}

/// Device addresses of the Stepper's static buffers. Each field's region is sized for the
/// largest shape and a call uses its leading part, so the addresses never change.
#[derive(Debug, Clone, Copy)]
pub struct Buffers {
    pub tree: TreePtrs,
    pub scratch: Scratch,
    pub acc: AcceptPtrs,
    pub sampling: Sampling,
    pub ring: ReadbackRing,
    /// int64 `[max_batch, L+1]` and bool `[max_batch, Q]`: kept_slots' outputs.
    pub kept: u64,
    pub release: u64,
}

pub struct Engine {
    pub ordinal: usize,
    /// The limits and the last step's round (ddtree-core's, shared with the CPU engine).
    pub planner: Planner,
    /// The round of the last accept: what the commit calls and a publish work on (a later
    /// step does not change the acceptance they read).
    accepted: Option<Round>,
    bufs: Buffers,
    /// An eager step replays one graph of its three launches, an eager accept one of its
    /// walk (+ the generator's advance) (+ the readback), per launch geometry.
    eager_graphs: bool,
    build_graphs: GraphCache<BuildParams, KernelGraph>,
    accept_graphs: GraphCache<AcceptGraph, KernelGraph>,
}

impl Engine {
    pub fn new(ordinal: usize, limits: Limits, bufs: Buffers) -> Self {
        Self {
            ordinal,
            planner: Planner::new(limits),
            accepted: None,
            bufs,
            eager_graphs: true,
            build_graphs: GraphCache::default(),
            accept_graphs: GraphCache::default(),
        }
    }

    /// The last step's shape, if any.
    pub fn last(&self) -> Option<Round> {
        self.planner.last()
    }

    /// Makes `r` the current round again, stepped and accepted: a replayed graph of a whole
    /// round rewrote the buffers for it.
    pub fn resume(&mut self, r: Round) {
        self.planner.resume(r);
        self.accepted = Some(r);
    }

    /// The round of the last accept, if any.
    pub fn accepted(&self) -> Option<Round> {
        self.accepted
    }

    /// The round a step with draft logits of `shape` builds, or the error naming the
    /// argument (the Stepper's limits; the kernels' own limits are checked at launch).
    pub fn plan_step(&self, shape: [usize; 3]) -> Result<Round, CudaError> {
        self.planner.plan_step(shape).map_err(arg_error)
    }

    /// Checks target logits of `shape` against the last step's tree.
    pub fn plan_accept(&self, shape: [usize; 3]) -> Result<Round, CudaError> {
        self.planner.plan_accept(shape).map_err(arg_error)
    }

    /// SPEC stages 1–3 into the static tree buffers.
    ///
    /// # Safety
    /// `logits`, `roots` and `prefix` address live device tensors of the stated shapes
    /// (int64 `[bs]` for the last two) on this engine's device, and the buffers are alive.
    pub unsafe fn step(
        &mut self,
        stream: u64,
        logits: Logits,
        roots: u64,
        prefix: u64,
    ) -> Result<Round, CudaError> {
        let r = self.plan_step(logits.shape)?;
        let shape = BuildShape {
            bs: r.bs,
            depth: r.depth,
            vocab: r.vocab,
            budget: r.budget,
            k: r.k,
        };
        shape.check()?;
        let b = &self.bufs;
        let p = build_params(
            &shape, &logits, roots, prefix, &b.tree, &b.scratch, ALL_STAGES,
        );
        let (dev, _ctx) = enter_device(self.ordinal)?;
        let mut nodes: Vec<Node> = build_kernels(&dev, &shape, logits.dtype, ALL_STAGES)
            .into_iter()
            .map(|k| (k, Params::one(&p)))
            .collect();
        let plain = !self.eager_graphs || is_capturing(stream)?;
        run(
            &mut self.build_graphs,
            self.ordinal,
            plain,
            &mut nodes,
            p,
            stream,
        )?;
        self.planner.resume(r);
        Ok(r)
    }

    /// Eager builds as one graph launch (the default) or as three plain launches.
    pub fn set_eager_graphs(&mut self, on: bool) {
        self.eager_graphs = on;
    }

    /// Graphs instantiated so far (one per launch geometry of a step or an accept).
    pub fn graphs(&self) -> usize {
        self.build_graphs.len() + self.accept_graphs.len()
    }

    /// SPEC stage 4 for the last step's tree, greedy or (`sampled`) from the sampling
    /// state's per-request parameters, which `load` (scalar parameters, a seed) writes
    /// first when given; `publish` also stores the acceptance into the readback ring.
    ///
    /// # Safety
    /// `target` addresses live device logits on this engine's device.
    pub unsafe fn accept(
        &mut self,
        stream: u64,
        target: Logits,
        sampled: bool,
        publish: bool,
        load: Option<SamplingLoad>,
    ) -> Result<Round, CudaError> {
        let r = self.plan_accept(target.shape)?;
        let t = &self.bufs.tree;
        let links = WalkTree {
            verify_ids: t.verify_ids,
            first_child: t.first_child,
            next_sibling: t.next_sibling,
        };
        let sampling = sampled.then_some(self.bufs.sampling);
        let (dev, _ctx) = enter_device(self.ordinal)?;
        let (p, kernels) =
            accept_launches(&dev, target, r.path_len(), links, self.bufs.acc, sampling)?;
        let mut nodes: Vec<Node> = Vec::with_capacity(4);
        if let Some(a) = &load {
            nodes.push((load_kernel(&dev), Params::one(a)));
        }
        nodes.extend(kernels.into_iter().map(|k| (k, Params::one(&p))));
        let (ring, src) = (self.bufs.ring, self.readback_src(r));
        let readback = if publish {
            let k = readback_kernel(&dev, &ring, &src)?;
            let mut args = Params::new();
            args.arg(&ring).arg(&src);
            nodes.push((k, args));
            Some((ring, src))
        } else {
            None
        };
        let plain = !self.eager_graphs || is_capturing(stream)?;
        let held = (load, p, readback);
        run(
            &mut self.accept_graphs,
            self.ordinal,
            plain,
            &mut nodes,
            held,
            stream,
        )?;
        self.accepted = Some(r);
        Ok(r)
    }

    fn readback_src(&self, r: Round) -> ReadbackSrc {
        let a = &self.bufs.acc;
        ReadbackSrc {
            accept_len: a.accept_len,
            bonus: a.bonus,
            accepted_tokens: a.accepted_tokens,
            status: a.status,
            bs: r.bs as i32,
            path_len: r.path_len() as i32,
        }
    }

    /// The `SamplingLoad` that writes the per-request parameters (temperature, top_k,
    /// top_p: scalars or the caller's tensors) for the last step's requests and, with a
    /// `seed`, restarts the generator.
    pub fn sampling_load(
        &self,
        params: [ParamSource; 3],
        seed: Option<i64>,
    ) -> Result<SamplingLoad, CudaError> {
        let r = self.round("Stepper.accept")?;
        Ok(SamplingLoad {
            to: self.bufs.sampling,
            from: params,
            seed: seed.unwrap_or(0),
            bs: r.bs as i32,
            reseed: i32::from(seed.is_some()),
        })
    }

    /// Stores the last acceptance into the readback ring's next slot.
    ///
    /// # Safety
    /// The buffers are alive and an accept ran on `stream` (or before it) for this round.
    pub unsafe fn publish(&self, stream: u64) -> Result<(), CudaError> {
        let r = self.acceptance("Stepper.publish")?;
        readback(self.ordinal, stream, self.bufs.ring, self.readback_src(r))
    }

    /// SPEC stage 5's kept slots and release mask for the last acceptance, from the verify
    /// window `[bs, Q]` (int64), into the static outputs (contiguous for this shape).
    ///
    /// # Safety
    /// `window` addresses a live int64 `[bs, Q]` device tensor.
    pub unsafe fn kept_slots(
        &self,
        stream: u64,
        window: u64,
        num_slots: Option<usize>,
    ) -> Result<Round, CudaError> {
        let r = self.acceptance("Stepper.kept_slots")?;
        let (kept, release) = (self.bufs.kept, self.bufs.release);
        kept_slots(
            self.ordinal,
            stream,
            self.path(r),
            window,
            num_slots,
            kept,
            release,
        )?;
        Ok(r)
    }

    /// SPEC stage 5's KV compaction for the last acceptance: in every registered cache, each
    /// request's accepted rows move to the start of its verify window `[bs, Q]` (int64).
    ///
    /// # Safety
    /// `window` addresses a live int64 `[bs, Q]` device tensor; `caches.table` a live device
    /// table of `caches.count` cache base addresses, each cache `caches.slots` rows of
    /// `caches.row_bytes`.
    pub unsafe fn compact_kv(
        &self,
        stream: u64,
        window: u64,
        caches: CacheTable,
    ) -> Result<Round, CudaError> {
        let r = self.acceptance("Stepper.compact_kv")?;
        let CacheTable {
            table,
            count,
            row_bytes,
            slots,
        } = caches;
        compact_kv(
            self.ordinal,
            stream,
            self.path(r),
            window,
            table,
            count,
            row_bytes,
            slots,
        )?;
        Ok(r)
    }

    /// SPEC stage 5's hidden gather for the last acceptance: rows `b*q + node` of `hidden`
    /// (`q` rows of `row_bytes` per request; a node outside `[0, q)` is that request's
    /// status code) in path order into `out` `[bs, L+1, row]`, zeros past each path.
    ///
    /// # Safety
    /// `hidden` addresses a live `[bs*q, row]` device tensor, `out` a `[bs, L+1, row]` one.
    pub unsafe fn gather_hidden(
        &self,
        stream: u64,
        hidden: u64,
        q: usize,
        row_bytes: usize,
        out: u64,
    ) -> Result<Round, CudaError> {
        let r = self.acceptance("Stepper.gather_hidden")?;
        let path = CommitPath { q, ..self.path(r) };
        gather_hidden(self.ordinal, stream, path, hidden, row_bytes, out)?;
        Ok(r)
    }

    /// The accepted paths of round `r` as the commit kernels read them.
    fn path(&self, r: Round) -> CommitPath {
        CommitPath {
            bs: r.bs,
            q: r.q(),
            path_len: r.path_len(),
            accepted_nodes: self.bufs.acc.accepted_nodes,
            status: self.bufs.acc.status,
        }
    }

    /// The last accept's round, or "`what`: call accept() first".
    fn acceptance(&self, what: &'static str) -> Result<Round, CudaError> {
        self.accepted
            .ok_or_else(|| CudaError::arg(format!("{what}: call accept() first")))
    }

    fn round(&self, what: &'static str) -> Result<Round, CudaError> {
        self.planner.round(what).map_err(arg_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine(topk: Option<usize>) -> Engine {
        let tree = TreePtrs {
            verify_ids: 0,
            positions: 0,
            depths: 0,
            parents: 0,
            first_child: 0,
            next_sibling: 0,
            ancestor_bits: 0,
            scores: 0,
            num_nodes: 0,
            topk_logprobs: 0,
            topk_ids: 0,
            status: 0,
        };
        let bufs = Buffers {
            tree,
            scratch: Scratch {
                eligible: 0,
                bad: 0,
                stats: 0,
            },
            acc: AcceptPtrs {
                accepted_nodes: 0,
                accepted_tokens: 0,
                accept_index: 0,
                accept_len: 0,
                bonus: 0,
                status: 0,
            },
            sampling: Sampling {
                temperature: 0,
                top_k: 0,
                top_p: 0,
                rng: 0,
            },
            ring: ReadbackRing {
                slots: 0,
                cursor: 0,
                slot_words: 0,
                nslots: 4,
            },
            kept: 0,
            release: 0,
        };
        let limits = Limits {
            max_batch: 8,
            budget: 63,
            depth: 6,
            vocab: 1000,
            topk,
        };
        Engine::new(0, limits, bufs)
    }

    fn msg(e: CudaError) -> String {
        e.to_string()
    }

    #[test]
    fn the_engine_plans_with_the_cores_planner_and_names_the_argument() {
        // The checks themselves are ddtree-core's (round.rs); here, that the engine uses
        // them and turns their errors into argument errors that keep the name.
        let mut e = engine(None);
        assert_eq!(e.plan_step([8, 6, 1000]).unwrap().k, 63);
        let m = msg(e.plan_step([9, 6, 1000]).unwrap_err());
        assert_eq!(m, "draft_logits: batch size 9 exceeds max_batch=8");
        assert!(matches!(
            e.plan_accept([1, 64, 1000]),
            Err(CudaError::Arg(_))
        ));
        assert!(msg(e.publish_round_error()).contains("Stepper.publish: call accept() first"));
        e.resume(e.plan_step([3, 4, 900]).unwrap());
        assert_eq!(e.last().unwrap().bs, 3);
        // A replayed round counts as accepted; a later step alone does not move the round
        // the commit calls read.
        assert_eq!(e.accepted().unwrap().bs, 3);
        e.planner.resume(e.plan_step([2, 2, 900]).unwrap());
        assert_eq!((e.accepted().unwrap().bs, e.last().unwrap().bs), (3, 2));
        let m = msg(e.plan_accept([2, 64, 1000]).unwrap_err());
        assert!(m.starts_with("target_logits: vocabulary V = 1000"), "{m}");
    }

    impl Engine {
        fn publish_round_error(&self) -> CudaError {
            self.acceptance("Stepper.publish").unwrap_err()
        }
    }
}
