//! The one seam where core errors become Python exceptions.

use ddtree_core::ArgError;
use ddtree_cuda::CudaError;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::PyErr;

/// A bad argument becomes a `ValueError` whose message starts with the argument's name.
pub fn to_py(err: ArgError) -> PyErr {
    PyValueError::new_err(err.to_string())
}

/// GPU errors: a bad argument is a `ValueError`; a driver failure or a missing kernel image
/// a `RuntimeError` whose message names the failing call.
pub fn cuda_to_py(err: CudaError) -> PyErr {
    match err {
        CudaError::Arg(msg) => PyValueError::new_err(msg),
        other => PyRuntimeError::new_err(other.to_string()),
    }
}
