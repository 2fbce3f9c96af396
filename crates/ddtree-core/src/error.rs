//! The one error type of the core: a bad argument, named.

use std::fmt;

/// An argument the core cannot work with. The binding layer turns it into a Python
/// `ValueError` whose message starts with the argument's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgError {
    pub arg: &'static str,
    pub msg: String,
}

impl ArgError {
    pub fn new(arg: &'static str, msg: impl Into<String>) -> Self {
        Self {
            arg,
            msg: msg.into(),
        }
    }
}

impl fmt::Display for ArgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.arg, self.msg)
    }
}

impl std::error::Error for ArgError {}

pub type Result<T> = std::result::Result<T, ArgError>;

/// Fails with `ArgError` unless `cond` holds.
pub(crate) fn ensure(cond: bool, arg: &'static str, msg: impl FnOnce() -> String) -> Result<()> {
    if cond {
        Ok(())
    } else {
        Err(ArgError::new(arg, msg()))
    }
}
