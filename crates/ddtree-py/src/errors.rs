//! The one seam where core errors become Python exceptions.

use ddtree_core::ArgError;
use pyo3::exceptions::PyValueError;
use pyo3::PyErr;

/// A bad argument becomes a `ValueError` whose message starts with the argument's name.
pub fn to_py(err: ArgError) -> PyErr {
    PyValueError::new_err(err.to_string())
}
