//! `CudaEngine`: the Rust round engine (`ddtree_cuda::engine`) as one Python object. The
//! Stepper builds it once from its buffers' addresses; each call then passes only that
//! call's tensors, whose metadata is read here (a few attribute reads, no dict), checked
//! with the argument's name, and launched on PyTorch's current stream of the device.

use crate::buffers::{self, AccOut, SamplingOut, TreeOut};
use crate::checks::Checks;
use crate::cuda_round::{split_plan, AttentionArg, Scratch};
use crate::errors;
use ddtree_cuda::engine::{Buffers, CacheTable, Engine, Limits, Round};
use ddtree_cuda::params::ParamSource;
use ddtree_cuda::{CudaError, Logits, ReadbackRing};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use std::collections::HashMap;

#[pyclass(module = "ddtree._core", name = "CudaEngine")]
pub struct CudaEngine {
    engine: Engine,
    checks: Checks,
    /// The registered caches (`register_caches`) and the tensor holding their address table,
    /// kept alive here.
    caches: Option<(CacheTable, Py<PyAny>)>,
    /// The attention workspaces made by `prepare_attention`, per (Hq, Hkv, Dqk, Dv).
    attention: HashMap<[usize; 4], Workspace>,
}

/// An attention workspace the engine owns: the split plan for its calls (up to max_batch
/// requests of the Stepper's Q nodes) and its scratch tensors (partials, status).
struct Workspace {
    plan: ddtree_cuda::attention::SplitPlan,
    part: Py<PyAny>,
    status: Py<PyAny>,
}

/// Sampling parameters as the Stepper passes them: (temperature, top_k, top_p), each a
/// checked number or a `[bs]` tensor.
type Params<'py> = (Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>);

/// A round as Python holds it: (bs, depth, K, V).
pub(crate) fn round_key<'py>(py: Python<'py>, r: Round) -> PyResult<Bound<'py, PyTuple>> {
    PyTuple::new(py, [r.bs, r.depth, r.k, r.vocab])
}

#[pymethods]
impl CudaEngine {
    /// `limits`: (max_batch, budget, depth, vocab, topk or None). The buffers, read once
    /// here: `tree` and `acc` (a `Tree` and an `Acceptance` of the largest shape, views of
    /// the Stepper's static buffers), the build's `scratch` dict, the `SamplingState`, the
    /// readback ring's device side (mapped slots, cursor, slot words, slots) and the
    /// kept_slots outputs.
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        device: usize,
        limits: (usize, usize, usize, usize, Option<usize>),
        tree: TreeOut,
        acc: AccOut,
        scratch: &Bound<'_, PyDict>,
        sampling: SamplingOut,
        ring: (Bound<'_, PyAny>, Bound<'_, PyAny>, i64, i32),
        kept_release: (Bound<'_, PyAny>, Bound<'_, PyAny>),
    ) -> PyResult<Self> {
        let (max_batch, budget, depth, vocab, topk) = limits;
        let limits = Limits {
            max_batch,
            budget,
            depth,
            vocab,
            topk,
        };
        let (host, cursor, slot_words, nslots) = ring;
        // The ring's slots as the readback kernel addresses them: mapped pinned memory.
        let slots = ddtree_cuda::mapped_host_pointer(device, buffers::data_ptr(&host)? as u64)
            .map_err(errors::cuda_to_py)?;
        let cursor = buffers::data_ptr(&cursor)? as u64;
        let bufs = Buffers {
            tree: tree.ptrs(),
            scratch: buffers::scratch(scratch)?,
            acc: acc.ptrs(),
            sampling: sampling.ptrs(),
            ring: ReadbackRing {
                slots,
                cursor,
                slot_words,
                nslots,
            },
            kept: buffers::data_ptr(&kept_release.0)? as u64,
            release: buffers::data_ptr(&kept_release.1)? as u64,
        };
        Ok(Self {
            engine: Engine::new(device, limits, bufs),
            checks: Checks::new(py, Some(device))?,
            caches: None,
            attention: HashMap::new(),
        })
    }

    /// SPEC stages 1–3 into the static buffers; returns the round's (bs, depth, K, V).
    fn step<'py>(
        &mut self,
        py: Python<'py>,
        draft_logits: &Bound<'py, PyAny>,
        root_tokens: &Bound<'py, PyAny>,
        prefix_lens: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let inputs = self.checks.step_inputs(
            &self.engine.planner,
            draft_logits,
            root_tokens,
            prefix_lens,
        )?;
        let (x, roots, prefix) = (inputs.logits, inputs.roots, inputs.prefix);
        let stream = self.stream(py)?;
        // SAFETY: the tensors were checked above (dtype, rank, sizes, device, contiguity
        // of the index vectors) and stay alive for the call; the launches are asynchronous.
        let r = py
            .detach(|| unsafe { self.engine.step(stream, x, roots, prefix) })
            .map_err(errors::cuda_to_py)?;
        round_key(py, r)
    }

    /// SPEC stage 4 for the last step's tree: greedy when `params` is None or its
    /// temperature is None or the number 0; else sampled from the per-request parameters
    /// (temperature, top_k, top_p: each None, a number or a `[bs]` tensor, read by the
    /// device when the graph runs), written first in the same graph, with a new `seed` if
    /// given (else the sampling state's generator runs on). `readback` publishes it. Every
    /// argument is checked, target first, before anything is launched. Returns the round's
    /// (bs, depth, K, V).
    #[pyo3(signature = (target_logits, readback, params=None, seed=None))]
    fn accept<'py>(
        &mut self,
        py: Python<'py>,
        target_logits: &Bound<'py, PyAny>,
        readback: bool,
        params: Option<Params<'py>>,
        seed: Option<i64>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let (t, sources) = self.check_accept(target_logits, params.as_ref())?;
        let sources = sources.filter(|[temperature, _, _]| !temperature.is_greedy());
        let sampled = sources.is_some();
        let load = sources
            .map(|s| self.engine.sampling_load(s, seed))
            .transpose()
            .map_err(errors::cuda_to_py)?;
        let stream = self.stream(py)?;
        // SAFETY: checked live device logits of the last tree's shape, and parameter
        // tensors on this device (the caller keeps them alive until the stream reads them).
        let r = py
            .detach(|| unsafe { self.engine.accept(stream, t, sampled, readback, load) })
            .map_err(errors::cuda_to_py)?;
        round_key(py, r)
    }

    /// Checks target logits against the last tree, and the sampling parameters if given,
    /// without launching (before a seed is drawn from a torch.Generator, which advances it).
    #[pyo3(name = "check_target", signature = (target_logits, params=None))]
    fn py_check_target<'py>(
        &self,
        target_logits: &Bound<'py, PyAny>,
        params: Option<Params<'py>>,
    ) -> PyResult<()> {
        self.check_accept(target_logits, params.as_ref())
            .map(|_| ())
    }

    /// Eager steps as one graph launch (the default) or as three plain launches (for the
    /// host benchmark's ratio). Inside the caller's capture they are always plain.
    #[setter]
    fn set_eager_graphs(&mut self, on: bool) {
        self.engine.set_eager_graphs(on);
    }

    /// Build graphs the engine holds (one per launch geometry an eager step has seen).
    #[getter]
    fn graphs(&self) -> usize {
        self.engine.graphs()
    }

    /// Makes a round returned by `step` current again (after replaying a graph of it).
    fn resume(&mut self, round: (usize, usize, usize, usize)) {
        let (bs, depth, k, vocab) = round;
        let budget = self.engine.planner.limits.budget;
        self.engine.resume(Round {
            bs,
            depth,
            vocab,
            k,
            budget,
        });
    }

    /// Stores the last acceptance into the readback ring's next slot.
    fn publish(&self, py: Python<'_>) -> PyResult<()> {
        let stream = self.stream(py)?;
        // SAFETY: the static buffers are alive (the Stepper owns them).
        py.detach(|| unsafe { self.engine.publish(stream) })
            .map_err(errors::cuda_to_py)
    }

    /// Kept slots and release mask of the last acceptance from the verify window
    /// `out_cache_loc` (int64 `[bs, Q]`, checked here) into the static outputs;
    /// `num_slots` bounds its slots; `readback` then publishes the acceptance.
    fn kept_slots(
        &self,
        py: Python<'_>,
        out_cache_loc: &Bound<'_, PyAny>,
        num_slots: Option<usize>,
        readback: bool,
    ) -> PyResult<()> {
        let r = self.accepted("kept_slots")?;
        let window = self.checks.window(out_cache_loc, r)?;
        // SAFETY: `window` is a checked live int64 [bs, Q] tensor; the buffers are alive.
        self.commit(py, readback, |e, stream| unsafe {
            e.kept_slots(stream, window, num_slots)
        })
    }

    /// The caches `compact_kv` moves rows in (checked by the Stepper's `CacheTable`): the
    /// int64 device tensor of their base addresses, how many, their row bytes and the rows
    /// every one holds.
    fn register_caches(
        &mut self,
        table: Bound<'_, PyAny>,
        count: usize,
        row_bytes: usize,
        slots: usize,
    ) -> PyResult<()> {
        let t = CacheTable {
            table: buffers::data_ptr(&table)? as u64,
            count,
            row_bytes,
            slots,
        };
        self.caches = Some((t, table.unbind()));
        Ok(())
    }

    /// KV compaction for the last acceptance in the registered caches, from the verify
    /// window `out_cache_loc` (int64 `[bs, Q]`, checked here); `readback` then publishes.
    fn compact_kv(
        &self,
        py: Python<'_>,
        out_cache_loc: &Bound<'_, PyAny>,
        readback: bool,
    ) -> PyResult<()> {
        let r = self.accepted("compact_kv")?;
        let Some((caches, _)) = self.caches else {
            return Err(pyo3::exceptions::PyRuntimeError::new_err(
                "Stepper.compact_kv: call register_caches() first",
            ));
        };
        let window = self.checks.window(out_cache_loc, r)?;
        // SAFETY: a checked live int64 [bs, Q] window; the cache table and the caches are
        // kept alive by the Stepper; the static buffers too.
        self.commit(py, readback, |e, stream| unsafe {
            e.compact_kv(stream, window, caches)
        })
    }

    /// The accepted nodes' rows of `hidden` (`[bs*Q, H, ...]`) in path order into `out`
    /// (`[bs, L+1, H, ...]`, zeros past each path), both checked here; `readback` then
    /// publishes.
    fn gather_hidden(
        &self,
        py: Python<'_>,
        hidden: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
        readback: bool,
    ) -> PyResult<()> {
        let r = self.accepted("gather_hidden")?;
        let (src, q, row_bytes) = self.checks.hidden(hidden, r.bs)?;
        let dst = self.checks.gather_out(out, hidden, r.bs, r.path_len())?;
        // SAFETY: checked live contiguous tensors of the shapes the gather reads and writes.
        self.commit(py, readback, |e, stream| unsafe {
            e.gather_hidden(stream, src, q, row_bytes, dst)
        })
    }

    /// Makes (once per head shape) the workspace of `tree_attention` calls with `heads`
    /// (Hq, Hkv) and head dims `dims` (Dqk, Dv): its split plan for this GPU and its
    /// scratch, allocated here through PyTorch (so never inside a call, which may be
    /// captured). Returns the partials' fp32 size.
    fn prepare_attention(
        &mut self,
        py: Python<'_>,
        heads: (usize, usize),
        dims: (usize, usize),
    ) -> PyResult<usize> {
        let key = [heads.0, heads.1, dims.0, dims.1];
        if let Some(w) = self.attention.get(&key) {
            return Ok(w.plan.part_floats);
        }
        let limits = self.engine.planner.limits;
        let ordinal = self.engine.ordinal;
        let Some(plan) = split_plan(ordinal, limits.max_batch, limits.budget + 1, heads, dims)?
        else {
            return Err(PyValueError::new_err(format!(
                "k_new: no compiled tile for {} query heads over {} KV heads of head dim {}",
                heads.0, heads.1, dims.0
            )));
        };
        let torch = py.import("torch")?;
        let device = format!("cuda:{}", self.engine.ordinal);
        let empty = |n: usize, dtype: &str| -> PyResult<Py<PyAny>> {
            let kw = PyDict::new(py);
            kw.set_item("dtype", torch.getattr(dtype)?)?;
            kw.set_item("device", &device)?;
            Ok(torch.call_method("empty", (n,), Some(&kw))?.unbind())
        };
        let part_floats = plan.part_floats;
        let w = Workspace {
            part: empty(part_floats.max(1), "float32")?,
            status: empty(limits.max_batch, "int32")?,
            plan,
        };
        self.attention.insert(key, w);
        Ok(part_floats)
    }

    /// Tree verify attention for the last step's tree with this engine's workspace of the
    /// call's head shape (`prepare_attention` first), on the current stream. `arg` is the
    /// checked call (`_attention.launch_arg`): its `status`, when given, receives the
    /// per-request codes instead of the workspace's.
    fn tree_attention(&self, py: Python<'_>, arg: AttentionArg<'_>) -> PyResult<()> {
        let [bs, _, hq, hkv, dqk, dv, _, _] = arg.shape().map(|x| x as usize);
        let Some(w) = self.attention.get(&[hq, hkv, dqk, dv]) else {
            return Err(pyo3::exceptions::PyRuntimeError::new_err(format!(
                "Stepper.tree_attention: no workspace for (hq, hkv, dqk, dv) = ({hq}, {hkv}, \
                 {dqk}, {dv}); call prepare_attention() first (outside a capture)"
            )));
        };
        let scratch = Scratch {
            part: buffers::data_ptr(w.part.bind(py))? as u64,
            status: match arg.status()? {
                Some(s) => s,
                None => buffers::data_ptr(w.status.bind(py))? as u64,
            },
            splits: w.plan.splits_for(bs) as i32,
        };
        let stream = self.stream(py)?;
        arg.launch(py, self.engine.ordinal, stream, scratch)
    }

    /// The workspaces' scratch tensors (partials, status) per head shape, for tests.
    fn attention_workspaces<'py>(
        &self,
        py: Python<'py>,
    ) -> Vec<([usize; 4], Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        self.attention
            .iter()
            .map(|(k, w)| (*k, w.part.bind(py).clone(), w.status.bind(py).clone()))
            .collect()
    }
}

impl CudaEngine {
    /// A commit call's launch on the current stream, then (`readback`) the publishing of
    /// the acceptance after it, with the GIL released.
    fn commit<F>(&self, py: Python<'_>, readback: bool, launch: F) -> PyResult<()>
    where
        F: FnOnce(&Engine, u64) -> Result<Round, CudaError> + Send,
    {
        let stream = self.stream(py)?;
        py.detach(|| {
            launch(&self.engine, stream)?;
            if readback {
                // SAFETY: the static buffers are alive (the Stepper owns them).
                unsafe { self.engine.publish(stream)? };
            }
            Ok(())
        })
        .map_err(errors::cuda_to_py)
    }

    /// The last acceptance's round, or the Stepper's "call accept() first".
    fn accepted(&self, what: &str) -> PyResult<Round> {
        self.engine
            .accepted()
            .ok_or_else(|| PyValueError::new_err(format!("Stepper.{what}: call accept() first")))
    }

    /// PyTorch's current stream of the engine's device (the capture stream inside a graph).
    fn stream(&self, py: Python<'_>) -> PyResult<u64> {
        let ordinal = self.engine.ordinal;
        match &self.checks.torch.raw_stream {
            Some(raw) => raw.bind(py).call1((ordinal,))?.extract(),
            None => py
                .import("torch")?
                .getattr("cuda")?
                .call_method1("current_stream", (ordinal,))?
                .getattr("cuda_stream")?
                .extract(),
        }
    }

    /// The target, then each sampling parameter (named, in order) for the tree's batch.
    fn check_accept(
        &self,
        x: &Bound<'_, PyAny>,
        params: Option<&Params<'_>>,
    ) -> PyResult<(Logits, Option<[ParamSource; 3]>)> {
        let (t, _) = self.checks.target(&self.engine.planner, x)?;
        let Some((temperature, top_k, top_p)) = params else {
            return Ok((t, None));
        };
        let bs = t.shape[0];
        let c = &self.checks;
        Ok((
            t,
            Some([
                c.param_source(temperature, "temperature", bs)?,
                c.param_source(top_k, "top_k", bs)?,
                c.param_source(top_p, "top_p", bs)?,
            ]),
        ))
    }
}
