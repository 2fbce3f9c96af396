//! Tensors handed over by the Python layer, read here.
//!
//! `ddtree._core` is private: its only caller, the `ddtree` package, passes live tensors
//! that it has already checked (device, dtype, rank, sizes) and keeps alive for the whole
//! call; `_core` reads their `data_ptr()`, dtype, shape and element strides itself (the
//! Python layer never handles an address). That contract is what makes the `unsafe`
//! slices below sound; the core re-checks every shape it relies on.

use ddtree_core::logits::{Element, Logits3};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// A strided tensor's address, dtype (`float32`, …), shape and element strides.
pub struct TensorArg {
    pub ptr: usize,
    pub dtype: String,
    pub shape: Vec<usize>,
    pub strides: Vec<usize>,
}

/// Reads a tensor argument (`#[pyo3(from_py_with = tensor_arg)]`).
pub fn tensor_arg(t: &Bound<'_, PyAny>) -> PyResult<TensorArg> {
    let dtype = t.getattr("dtype")?.str()?.to_string();
    Ok(TensorArg {
        ptr: crate::buffers::data_ptr(t)?,
        dtype: dtype.trim_start_matches("torch.").to_string(),
        shape: t.getattr("shape")?.extract()?,
        strides: t.call_method0("stride")?.extract()?,
    })
}

/// Evaluates `$body` with `$l` bound to the logits tensor `$t` (a [`TensorArg`] from the
/// Python layer) viewed as a `Logits3` of its own element type: the one place where the
/// three logits dtypes become Rust types. Propagates the dtype and shape errors with `?`.
macro_rules! with_logits {
    ($t:expr, $arg:expr, |$l:ident| $body:expr) => {{
        // SAFETY: the Python layer passes live, checked tensors (the module comment).
        match $t.logits_dtype($arg)? {
            $crate::tensor::LogitsDtype::F32 => {
                let $l = unsafe { $t.logits3::<f32>($arg)? };
                $body
            }
            $crate::tensor::LogitsDtype::F16 => {
                let $l = unsafe { $t.logits3::<half::f16>($arg)? };
                $body
            }
            $crate::tensor::LogitsDtype::Bf16 => {
                let $l = unsafe { $t.logits3::<half::bf16>($arg)? };
                $body
            }
        }
    }};
}
pub(crate) use with_logits;

/// Element type of a logits tensor.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum LogitsDtype {
    F32,
    F16,
    Bf16,
}

impl TensorArg {
    /// The logits dtype, or a `ValueError` naming `arg`.
    pub fn logits_dtype(&self, arg: &str) -> PyResult<LogitsDtype> {
        match self.dtype.as_str() {
            "float32" => Ok(LogitsDtype::F32),
            "float16" => Ok(LogitsDtype::F16),
            "bfloat16" => Ok(LogitsDtype::Bf16),
            other => Err(PyValueError::new_err(format!(
                "{arg}: dtype must be bfloat16, float16 or float32, got {other}"
            ))),
        }
    }

    /// Shape and strides of a rank-3 tensor, or a `ValueError` naming `arg`.
    pub fn shape3(&self, arg: &str) -> PyResult<([usize; 3], [usize; 3])> {
        match (&self.shape[..], &self.strides[..]) {
            (&[a, b, c], &[sa, sb, sc]) => Ok(([a, b, c], [sa, sb, sc])),
            _ => Err(PyValueError::new_err(format!(
                "{arg}: must be 3-D, got shape {:?}",
                self.shape
            ))),
        }
    }

    /// A rank-3 strided view of the tensor as `T`.
    ///
    /// # Safety
    /// `ptr` must address a live tensor of element type `T` whose every index under
    /// `shape`/`strides` is readable for the lifetime `'a`.
    pub unsafe fn logits3<'a, T: Element>(&self, arg: &'static str) -> PyResult<Logits3<'a, T>> {
        let (shape, strides) = self.shape3(arg)?;
        let extent = 1
            + (0..3)
                .map(|i| shape[i].saturating_sub(1) * strides[i])
                .sum::<usize>();
        let data = std::slice::from_raw_parts(self.ptr as *const T, extent);
        Logits3::new(arg, data, shape, strides).map_err(crate::errors::to_py)
    }
}

/// A contiguous read-only buffer of `len` elements at `ptr`.
///
/// # Safety
/// `ptr` must address `len` live, initialised, properly aligned elements of `T`.
pub unsafe fn slice<'a, T>(ptr: usize, len: usize) -> &'a [T] {
    std::slice::from_raw_parts(ptr as *const T, len)
}

/// A contiguous writable buffer of `len` elements at `ptr`, aliased by nothing else.
///
/// # Safety
/// As [`slice`], and no other live reference may overlap it.
pub unsafe fn slice_mut<'a, T>(ptr: usize, len: usize) -> &'a mut [T] {
    std::slice::from_raw_parts_mut(ptr as *mut T, len)
}
