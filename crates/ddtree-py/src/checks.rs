//! Reading and checking a call's tensors for an engine (`engine.rs`): a few attribute reads
//! per tensor (no dict), each failure a Python exception that names the argument, with the
//! messages of the package's documented checks. One `Checks` per engine, for its device
//! (`None`: the CPU).

use crate::buffers::data_ptr;
use crate::errors;
use ddtree_core::round::{Planner, Round};
use ddtree_cuda::params::{ParamDtype, ParamSource};
use ddtree_cuda::{Dtype, Logits};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

/// The torch objects a call compares against, looked up once.
pub struct Torch {
    tensor: Py<PyAny>,
    dtypes: [Py<PyAny>; 3], // float32, float16, bfloat16 (Dtype order)
    int64: Py<PyAny>,
    /// The dtypes a per-request sampling tensor may have, with the kernel's code.
    param_dtypes: Vec<(Py<PyAny>, ParamDtype)>,
    pub raw_stream: Option<Py<PyAny>>,
    /// `numbers.Integral` and `numbers.Real`: what a scalar sampling parameter may be.
    integral: Py<PyAny>,
    real: Py<PyAny>,
}

impl Torch {
    pub fn load(py: Python<'_>) -> PyResult<Self> {
        let torch = py.import("torch")?;
        let d = |name: &str| torch.getattr(name).map(Bound::unbind);
        Ok(Self {
            tensor: d("Tensor")?,
            dtypes: [d("float32")?, d("float16")?, d("bfloat16")?],
            int64: d("int64")?,
            param_dtypes: vec![
                (d("float32")?, ParamDtype::F32),
                (d("float64")?, ParamDtype::F64),
                (d("float16")?, ParamDtype::F16),
                (d("bfloat16")?, ParamDtype::Bf16),
                (d("int32")?, ParamDtype::I32),
                (d("int64")?, ParamDtype::I64),
            ],
            // A private binding, a few times cheaper than `torch.cuda.current_stream`; absent
            // from some builds (CPU-only torch), where the CUDA engine asks the public API.
            raw_stream: torch
                .getattr("_C")?
                .getattr("_cuda_getCurrentRawStream")
                .ok()
                .map(Bound::unbind),
            integral: py.import("numbers")?.getattr("Integral")?.unbind(),
            real: py.import("numbers")?.getattr("Real")?.unbind(),
        })
    }
}

/// What a call reads of a tensor.
pub struct Meta {
    pub ptr: u64,
    pub shape: Vec<usize>,
    pub strides: Vec<i64>,
}

/// A shape as Python prints a tuple: `(2, 3)`, `(5,)`.
pub fn as_tuple(shape: &[usize]) -> String {
    let parts: Vec<String> = shape.iter().map(usize::to_string).collect();
    let comma = if shape.len() == 1 { "," } else { "" };
    format!("({}{comma})", parts.join(", "))
}

/// A step's checked inputs: the draft logits, the round they plan, the index vectors'
/// addresses, and the contiguous copies made of strided ones (alive until the launch).
pub struct StepInputs<'py> {
    pub logits: Logits,
    pub round: Round,
    pub roots: u64,
    pub prefix: u64,
    _copies: [Option<Bound<'py, PyAny>>; 2],
}

/// The tensor checks of an engine on `device` (a CUDA ordinal, or `None` for the CPU).
pub struct Checks {
    pub torch: Torch,
    pub device: Option<usize>,
}

impl Checks {
    pub fn new(py: Python<'_>, device: Option<usize>) -> PyResult<Self> {
        Ok(Self {
            torch: Torch::load(py)?,
            device,
        })
    }

    /// A step's arguments, checked in the documented order against `planner`'s limits.
    pub fn step_inputs<'py>(
        &self,
        planner: &Planner,
        draft_logits: &Bound<'py, PyAny>,
        root_tokens: &Bound<'py, PyAny>,
        prefix_lens: &Bound<'py, PyAny>,
    ) -> PyResult<StepInputs<'py>> {
        let logits = self.logits(draft_logits, "draft_logits")?;
        let round = planner.plan_step(logits.shape).map_err(errors::to_py)?;
        let (roots, a) = self.index_vector(root_tokens, "root_tokens", round.bs)?;
        let (prefix, b) = self.index_vector(prefix_lens, "prefix_lens", round.bs)?;
        Ok(StepInputs {
            logits,
            round,
            roots,
            prefix,
            _copies: [a, b],
        })
    }

    /// Whether tensor `x` is on this engine's device (the device type too: an `xpu:0`
    /// tensor is not on `cuda:0`).
    fn on_device(&self, x: &Bound<'_, PyAny>) -> PyResult<bool> {
        match self.device {
            None => x.getattr(pyo3::intern!(x.py(), "is_cpu"))?.extract(),
            Some(d) => Ok(x
                .getattr(pyo3::intern!(x.py(), "is_cuda"))?
                .extract::<bool>()?
                && x.call_method0(pyo3::intern!(x.py(), "get_device"))?
                    .extract::<i64>()?
                    == d as i64),
        }
    }

    /// Target logits checked against the last step's tree (`planner`): tensor, dtype,
    /// device, rank, then the tree's shape and the draft's vocabulary; with that round.
    pub fn target(&self, planner: &Planner, x: &Bound<'_, PyAny>) -> PyResult<(Logits, Round)> {
        let t = self.logits(x, "target_logits")?;
        let r = planner.plan_accept(t.shape).map_err(errors::to_py)?;
        Ok((t, r))
    }

    /// How torch names the device: `cpu`, `cuda:0`.
    fn device_name(&self) -> String {
        self.device.map_or("cpu".into(), |d| format!("cuda:{d}"))
    }

    /// A `TypeError` naming `name` unless `x` is a torch.Tensor.
    pub fn tensor(&self, x: &Bound<'_, PyAny>, name: &str) -> PyResult<()> {
        if x.is_instance(self.torch.tensor.bind(x.py()))? {
            return Ok(());
        }
        let ty = x.get_type().name()?;
        Err(PyTypeError::new_err(format!(
            "{name}: expected a torch.Tensor, got {ty}"
        )))
    }

    /// A tensor's pointer, shape and strides, after the device check.
    pub fn meta(&self, x: &Bound<'_, PyAny>, name: &str) -> PyResult<Meta> {
        if !self.on_device(x)? {
            let on = x.getattr("device")?.str()?;
            return Err(PyValueError::new_err(format!(
                "{name}: is on {on}, the other inputs are on {}",
                self.device_name()
            )));
        }
        Ok(Meta {
            ptr: data_ptr(x)? as u64,
            shape: x.getattr(pyo3::intern!(x.py(), "shape"))?.extract()?,
            strides: x.call_method0(pyo3::intern!(x.py(), "stride"))?.extract()?,
        })
    }

    pub fn logits(&self, x: &Bound<'_, PyAny>, name: &str) -> PyResult<Logits> {
        self.tensor(x, name)?;
        let py = x.py();
        let dtype = x.getattr(pyo3::intern!(x.py(), "dtype"))?;
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
    pub fn index_vector<'py>(
        &self,
        x: &Bound<'py, PyAny>,
        name: &str,
        n: usize,
    ) -> PyResult<(u64, Option<Bound<'py, PyAny>>)> {
        self.tensor(x, name)?;
        let dtype = x.getattr(pyo3::intern!(x.py(), "dtype"))?;
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
            let copy = x.call_method0(pyo3::intern!(x.py(), "contiguous"))?;
            let ptr = data_ptr(&copy)? as u64;
            return Ok((ptr, Some(copy)));
        }
        Ok((m.ptr, None))
    }

    /// One per-request sampling parameter: None (off), a number (checked here by the
    /// rules `scalar_param` states), or a `[bs]` tensor on this device of a float or
    /// integer dtype (its values are the kernel's to judge: checking them here would sync).
    /// The Python path's messages.
    pub fn param_source(
        &self,
        x: &Bound<'_, PyAny>,
        name: &str,
        bs: usize,
    ) -> PyResult<ParamSource> {
        if !x.is_instance(self.torch.tensor.bind(x.py()))? {
            return self.scalar_param(x, name).map(ParamSource::scalar);
        }
        let shape: Vec<usize> = x.getattr(pyo3::intern!(x.py(), "shape"))?.extract()?;
        if shape != [bs] {
            return Err(PyValueError::new_err(format!(
                "{name}: must be a scalar or a [{bs}] tensor, got {shape:?}"
            )));
        }
        if !self.on_device(x)? {
            let on = x.getattr("device")?.str()?;
            return Err(PyValueError::new_err(format!(
                "{name}: tensor on {on}, expected {}",
                self.device_name()
            )));
        }
        let dtype = x.getattr(pyo3::intern!(x.py(), "dtype"))?;
        let py = x.py();
        let Some(&(_, code)) = self
            .torch
            .param_dtypes
            .iter()
            .find(|(d, _)| d.bind(py).is(&dtype))
        else {
            return Err(PyTypeError::new_err(format!(
                "{name}: dtype must be a float or integer type (float32/64, float16, \
                 bfloat16, int32, int64), got {}",
                dtype.str()?
            )));
        };
        Ok(ParamSource {
            ptr: data_ptr(x)? as u64,
            stride: x
                .call_method1(pyo3::intern!(x.py(), "stride"), (0,))?
                .extract()?,
            dtype: code,
            ..ParamSource::default()
        })
    }

    /// `hidden` for a hidden gather of `bs` requests: a contiguous tensor `[bs*Q, H, ...]` on
    /// this device; returns its address, Q and the bytes of a row (the CPU path's checks,
    /// in its order and words).
    pub fn hidden(&self, x: &Bound<'_, PyAny>, bs: usize) -> PyResult<(u64, usize, usize)> {
        let name = "hidden";
        self.tensor(x, name)?;
        let shape: Vec<usize> = x.getattr(pyo3::intern!(x.py(), "shape"))?.extract()?;
        if shape.len() < 2 {
            return Err(PyValueError::new_err(format!(
                "{name}: must be a tensor [bs*Q, H, ...]"
            )));
        }
        if shape[0] % bs != 0 || !self.on_device(x)? {
            let on = x.getattr("device")?.str()?;
            return Err(PyValueError::new_err(format!(
                "{name}: must be [bs*Q, ...] on {} with bs={bs}, got {shape:?} on {on}",
                self.device_name()
            )));
        }
        let ptr = contiguous_ptr(x, name)?;
        let elem: usize = x
            .call_method0(pyo3::intern!(x.py(), "element_size"))?
            .extract()?;
        let row = shape[1..].iter().product::<usize>() * elem;
        Ok((ptr, shape[0] / bs, row))
    }

    /// `out` of a hidden gather: a contiguous tensor of `hidden`'s dtype, shaped
    /// `[bs, L+1, H, ...]`, on this device; its address.
    pub fn gather_out(
        &self,
        out: &Bound<'_, PyAny>,
        hidden: &Bound<'_, PyAny>,
        bs: usize,
        path_len: usize,
    ) -> PyResult<u64> {
        let hshape: Vec<usize> = hidden
            .getattr(pyo3::intern!(hidden.py(), "shape"))?
            .extract()?;
        let want: Vec<usize> = [bs, path_len]
            .into_iter()
            .chain(hshape[1..].iter().copied())
            .collect();
        let dtype = hidden.getattr(pyo3::intern!(hidden.py(), "dtype"))?;
        let fits = out.is_instance(self.torch.tensor.bind(out.py()))?
            && out.getattr(pyo3::intern!(out.py(), "dtype"))?.is(&dtype)
            && out
                .getattr(pyo3::intern!(out.py(), "shape"))?
                .extract::<Vec<usize>>()?
                == want
            && self.on_device(out)?;
        if !fits {
            return Err(PyValueError::new_err(format!(
                "out: must be {} {want:?} on {}",
                dtype.str()?,
                self.device_name()
            )));
        }
        contiguous_ptr(out, "out")
    }

    /// The verify window of the last round: an int64 `[bs, Q]` contiguous tensor on this
    /// device (the CPU path's messages, in its order).
    pub fn window(&self, w: &Bound<'_, PyAny>, r: Round) -> PyResult<u64> {
        let name = "out_cache_loc";
        self.tensor(w, name)?;
        let dtype = w.getattr(pyo3::intern!(w.py(), "dtype"))?;
        let shape: Vec<usize> = w.getattr(pyo3::intern!(w.py(), "shape"))?.extract()?;
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
        if !self.on_device(w)? {
            let on = w.getattr("device")?.str()?;
            return Err(PyValueError::new_err(format!(
                "{name}: on {on}, the acceptance is on {}",
                self.device_name()
            )));
        }
        contiguous_ptr(w, name)
    }
}

impl Checks {
    /// A scalar sampling parameter as the kernel stores it: None is off (temperature 0,
    /// top_k 0, top_p 1); a bool or a non-number is a `TypeError`; temperature must be
    /// finite and ≥ 0, top_k an integer ≥ 0 (beyond int32 it is off, like any k ≥ V), top_p
    /// in (0, 1]. Python's int and float are recognised by their exact type (cheap); other
    /// numbers (numpy's) by the `numbers` ABCs.
    fn scalar_param(&self, x: &Bound<'_, PyAny>, name: &str) -> PyResult<f64> {
        use pyo3::types::{PyBool, PyFloat, PyInt};
        if x.is_none() {
            return Ok(if name == "top_p" { 1.0 } else { 0.0 });
        }
        let integral = x.is_exact_instance_of::<PyInt>()
            || (!x.is_instance_of::<PyBool>()
                && !x.is_exact_instance_of::<PyFloat>()
                && x.is_instance(self.torch.integral.bind(x.py()))?);
        let real = integral
            || x.is_exact_instance_of::<PyFloat>()
            || (!x.is_instance_of::<PyBool>() && x.is_instance(self.torch.real.bind(x.py()))?);
        if !(if name == "top_k" { integral } else { real }) {
            let ty = x.get_type().name()?;
            return Err(PyTypeError::new_err(format!(
                "{name}: expected None, a number or a tensor, got {ty}"
            )));
        }
        match name {
            "top_k" => {
                if x.lt(0)? {
                    return Err(PyValueError::new_err("top_k: must be ≥ 0 (0 = off)"));
                }
                let k = x.extract::<i64>().unwrap_or(i64::MAX); // past i64: far past int32
                Ok(k.min(i64::from(i32::MAX)) as f64)
            }
            "temperature" => {
                let t: f64 = x.extract()?;
                if !(t.is_finite() && t >= 0.0) {
                    return Err(PyValueError::new_err("temperature: must be finite and ≥ 0"));
                }
                Ok(t)
            }
            _ => {
                let p: f64 = x.extract()?;
                if !(p > 0.0 && p <= 1.0) {
                    return Err(PyValueError::new_err("top_p: must be in (0, 1]"));
                }
                Ok(p)
            }
        }
    }
}

/// The address of `x`, or the `ValueError` "`name`: must be contiguous".
fn contiguous_ptr(x: &Bound<'_, PyAny>, name: &str) -> PyResult<u64> {
    if !x
        .call_method0(pyo3::intern!(x.py(), "is_contiguous"))?
        .extract::<bool>()?
    {
        return Err(PyValueError::new_err(format!("{name}: must be contiguous")));
    }
    Ok(data_ptr(x)? as u64)
}
