//! `CudaEngine`: the Rust round engine (`ddtree_cuda::engine`) as one Python object. The
//! Stepper builds it once from its buffers' addresses; each call then passes only that
//! call's tensors, whose metadata is read here (a few attribute reads, no dict), checked
//! with the argument's name, and launched on PyTorch's current stream of the device.

use crate::buffers::{self, AccOut, SamplingOut, TreeOut};
use crate::errors;
use ddtree_cuda::engine::{Buffers, Engine, Limits, Round};
use ddtree_cuda::{Dtype, Logits, ReadbackRing};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

/// The torch objects a call compares against, looked up once.
struct Torch {
    tensor: Py<PyAny>,
    dtypes: [Py<PyAny>; 3], // float32, float16, bfloat16 (Dtype order)
    int64: Py<PyAny>,
    raw_stream: Py<PyAny>,
}

impl Torch {
    fn load(py: Python<'_>) -> PyResult<Self> {
        let torch = py.import("torch")?;
        let d = |name: &str| torch.getattr(name).map(Bound::unbind);
        Ok(Self {
            tensor: d("Tensor")?,
            dtypes: [d("float32")?, d("float16")?, d("bfloat16")?],
            int64: d("int64")?,
            raw_stream: torch
                .getattr("_C")?
                .getattr("_cuda_getCurrentRawStream")?
                .unbind(),
        })
    }
}

/// What a call reads of a tensor.
struct Meta {
    ptr: u64,
    shape: Vec<usize>,
    strides: Vec<i64>,
}

#[pyclass(module = "ddtree._core", name = "CudaEngine")]
pub struct CudaEngine {
    engine: Engine,
    torch: Torch,
}

/// A shape as Python prints a tuple: `(2, 3)`, `(5,)`.
fn as_tuple(shape: &[usize]) -> String {
    let parts: Vec<String> = shape.iter().map(usize::to_string).collect();
    let comma = if shape.len() == 1 { "," } else { "" };
    format!("({}{comma})", parts.join(", "))
}

/// A round as Python holds it: (bs, depth, K, V).
fn round_key<'py>(py: Python<'py>, r: Round) -> PyResult<Bound<'py, PyTuple>> {
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
        ring: (u64, u64, i64, i32),
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
        let (slots, cursor, slot_words, nslots) = ring;
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
            torch: Torch::load(py)?,
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
        let x = self.logits(draft_logits, "draft_logits")?;
        let r = self.engine.plan_step(x.shape).map_err(errors::cuda_to_py)?;
        let (roots, _roots_copy) = self.index_vector(root_tokens, "root_tokens", r.bs)?;
        let (prefix, _prefix_copy) = self.index_vector(prefix_lens, "prefix_lens", r.bs)?;
        let stream = self.stream(py)?;
        // SAFETY: the tensors were checked above (dtype, rank, sizes, device, contiguity
        // of the index vectors) and stay alive for the call; the launches are asynchronous.
        let r = py
            .detach(|| unsafe { self.engine.step(stream, x, roots, prefix) })
            .map_err(errors::cuda_to_py)?;
        round_key(py, r)
    }

    /// SPEC stage 4 for the last step's tree: greedy, or (`sampled`) from the per-request
    /// parameters of the Stepper's sampling state — written first, in the same graph, when
    /// `params` (scalar temperature, top_k, top_p) or `seed` are given; `readback`
    /// publishes it. Returns the round's (bs, depth, K, V).
    #[pyo3(signature = (target_logits, sampled, readback, params=None, seed=None))]
    fn accept<'py>(
        &mut self,
        py: Python<'py>,
        target_logits: &Bound<'py, PyAny>,
        sampled: bool,
        readback: bool,
        params: Option<(f32, i32, f32)>,
        seed: Option<i64>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let t = self.check_target(target_logits)?;
        let load = if params.is_some() || seed.is_some() {
            Some(
                self.engine
                    .sampling_load(params, seed)
                    .map_err(errors::cuda_to_py)?,
            )
        } else {
            None
        };
        let stream = self.stream(py)?;
        // SAFETY: checked live device logits of the last tree's shape.
        let r = py
            .detach(|| unsafe { self.engine.accept(stream, t, sampled, readback, load) })
            .map_err(errors::cuda_to_py)?;
        round_key(py, r)
    }

    /// Checks target logits against the last tree without launching (for a sampled accept,
    /// whose parameters are loaded only once the target is known to be good).
    #[pyo3(name = "check_target")]
    fn py_check_target(&self, target_logits: &Bound<'_, PyAny>) -> PyResult<()> {
        self.check_target(target_logits).map(|_| ())
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
        let budget = self.engine.limits.budget;
        self.engine.resume(Round {
            bs,
            depth,
            vocab,
            k,
            budget,
        });
    }

    /// Restarts the generator at `seed` and/or loads scalar sampling parameters `(temperature,
    /// top_k, top_p)` for the last step's requests, in one launch (the Stepper's tensor
    /// path: the tensors' copies follow).
    #[pyo3(signature = (params, seed=None))]
    fn load_sampling(
        &self,
        py: Python<'_>,
        params: Option<(f32, i32, f32)>,
        seed: Option<i64>,
    ) -> PyResult<()> {
        let a = self
            .engine
            .sampling_load(params, seed)
            .map_err(errors::cuda_to_py)?;
        let stream = self.stream(py)?;
        // SAFETY: the sampling state's buffers are alive (the Stepper owns them).
        py.detach(|| unsafe { self.engine.load_sampling(stream, a) })
            .map_err(errors::cuda_to_py)
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
        let window = self.window(out_cache_loc)?;
        let stream = self.stream(py)?;
        // SAFETY: `window` is a checked live int64 [bs, Q] tensor; the buffers are alive.
        py.detach(|| unsafe {
            self.engine.kept_slots(stream, window, num_slots)?;
            if readback {
                self.engine.publish(stream)?;
            }
            Ok(())
        })
        .map_err(errors::cuda_to_py)
    }
}

impl CudaEngine {
    fn stream(&self, py: Python<'_>) -> PyResult<u64> {
        self.torch
            .raw_stream
            .bind(py)
            .call1((self.engine.ordinal,))?
            .extract()
    }

    /// A `TypeError` naming `name` unless `x` is a torch.Tensor.
    fn tensor(&self, x: &Bound<'_, PyAny>, name: &str) -> PyResult<()> {
        if x.is_instance(self.torch.tensor.bind(x.py()))? {
            return Ok(());
        }
        let ty = x.get_type().name()?;
        Err(PyTypeError::new_err(format!(
            "{name}: expected a torch.Tensor, got {ty}"
        )))
    }

    /// A tensor's pointer, shape and strides, after the device check.
    fn meta(&self, x: &Bound<'_, PyAny>, name: &str) -> PyResult<Meta> {
        let device: i64 = x.call_method0("get_device")?.extract()?;
        if device != self.engine.ordinal as i64 {
            let on = x.getattr("device")?.str()?;
            return Err(PyValueError::new_err(format!(
                "{name}: is on {on}, the other inputs are on cuda:{}",
                self.engine.ordinal
            )));
        }
        Ok(Meta {
            ptr: x.call_method0("data_ptr")?.extract()?,
            shape: x.getattr("shape")?.extract()?,
            strides: x.call_method0("stride")?.extract()?,
        })
    }

    fn logits(&self, x: &Bound<'_, PyAny>, name: &str) -> PyResult<Logits> {
        self.tensor(x, name)?;
        let py = x.py();
        let dtype = x.getattr("dtype")?;
        let Some(pos) = self.torch.dtypes.iter().position(|d| d.bind(py).is(&dtype)) else {
            return Err(PyTypeError::new_err(format!(
                "{name}: dtype must be bfloat16, float16 or float32, got {}",
                dtype.str()?
            )));
        };
        let m = self.meta(x, name)?;
        let (Ok(shape), Ok(strides)) = (
            <[usize; 3]>::try_from(m.shape.as_slice()),
            <[i64; 3]>::try_from(m.strides.as_slice()),
        ) else {
            return Err(PyValueError::new_err(format!(
                "{name}: must be 3-D [bs, L, V], got shape {}",
                as_tuple(&m.shape)
            )));
        };
        Ok(Logits {
            ptr: m.ptr,
            dtype: [Dtype::F32, Dtype::F16, Dtype::Bf16][pos],
            shape,
            strides,
        })
    }

    /// An int64 `[n]` vector on the engine's device, and the contiguous copy made of a
    /// strided one (kept by the caller until the launch is queued, all the stream needs).
    fn index_vector<'py>(
        &self,
        x: &Bound<'py, PyAny>,
        name: &str,
        n: usize,
    ) -> PyResult<(u64, Option<Bound<'py, PyAny>>)> {
        self.tensor(x, name)?;
        let dtype = x.getattr("dtype")?;
        if !dtype.is(self.torch.int64.bind(x.py())) {
            return Err(PyTypeError::new_err(format!(
                "{name}: dtype must be int64, got {}",
                dtype.str()?
            )));
        }
        let m = self.meta(x, name)?;
        if m.shape != [n] {
            return Err(PyValueError::new_err(format!(
                "{name}: shape must be [{n}], got {:?}",
                m.shape
            )));
        }
        if n > 1 && m.strides[0] != 1 {
            let copy = x.call_method0("contiguous")?;
            let ptr = copy.call_method0("data_ptr")?.extract()?;
            return Ok((ptr, Some(copy)));
        }
        Ok((m.ptr, None))
    }

    /// The verify window of the last round: an int64 `[bs, Q]` contiguous tensor on this
    /// device (the CPU path's messages, in its order).
    fn window(&self, w: &Bound<'_, PyAny>) -> PyResult<u64> {
        let r = self
            .engine
            .last()
            .ok_or_else(|| PyValueError::new_err("Stepper.kept_slots: call step() first"))?;
        let name = "out_cache_loc";
        self.tensor(w, name)?;
        let dtype = w.getattr("dtype")?;
        let shape: Vec<usize> = w.getattr("shape")?.extract()?;
        if shape.len() == 2 && shape[1] != r.q() {
            return Err(PyValueError::new_err(format!(
                "{name}: must be [bs, {}] (Q of the tree), got {shape:?}",
                r.q()
            )));
        }
        if !dtype.is(self.torch.int64.bind(w.py())) || shape.len() != 2 || shape[0] != r.bs {
            return Err(PyValueError::new_err(format!(
                "{name}: must be int64 [{}, Q], got {} {shape:?}",
                r.bs,
                dtype.str()?
            )));
        }
        let device: i64 = w.call_method0("get_device")?.extract()?;
        if device != self.engine.ordinal as i64 {
            let on = w.getattr("device")?.str()?;
            return Err(PyValueError::new_err(format!(
                "{name}: on {on}, the acceptance is on cuda:{}",
                self.engine.ordinal
            )));
        }
        if !w.call_method0("is_contiguous")?.extract::<bool>()? {
            return Err(PyValueError::new_err(format!("{name}: must be contiguous")));
        }
        w.call_method0("data_ptr")?.extract()
    }

    fn check_target(&self, x: &Bound<'_, PyAny>) -> PyResult<Logits> {
        let t = self.logits(x, "target_logits")?;
        self.engine
            .plan_accept(t.shape)
            .map_err(errors::cuda_to_py)?;
        Ok(t)
    }
}
