//! The result objects of the `ddtree` package (`Tree`, `Acceptance`, a `SamplingState`, a
//! scratch dict of tensors) read straight from Python: each field is the `data_ptr()` of the
//! attribute of the same name, so the field lists live here only, once for the CPU and the
//! GPU path (the package hands over the objects, not dicts of pointers).

use crate::tensor::{slice, slice_mut};
use ddtree_core::batch::{self, AcceptBuffers, BatchLinks, TreeBuffers};
use ddtree_core::emit::VerifyInputs;
use ddtree_cuda::{AcceptPtrs, CommitPath, Sampling, TreePtrs, WalkTree};
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// A tensor's `data_ptr()`.
pub fn data_ptr(t: &Bound<'_, PyAny>) -> PyResult<usize> {
    t.call_method0(pyo3::intern!(t.py(), "data_ptr"))?.extract()
}

/// The first two sizes of a tensor.
fn shape2(t: &Bound<'_, PyAny>) -> PyResult<(usize, usize)> {
    let shape: Vec<usize> = t.getattr(pyo3::intern!(t.py(), "shape"))?.extract()?;
    Ok((shape[0], shape.get(1).copied().unwrap_or(1)))
}

/// A `Tree`'s output tensors (contiguous, sized for the build's shape).
#[derive(FromPyObject)]
pub struct TreeOut {
    #[pyo3(from_py_with = data_ptr)]
    verify_ids: usize,
    #[pyo3(from_py_with = data_ptr)]
    positions: usize,
    #[pyo3(from_py_with = data_ptr)]
    depths: usize,
    #[pyo3(from_py_with = data_ptr)]
    parents: usize,
    #[pyo3(from_py_with = data_ptr)]
    first_child: usize,
    #[pyo3(from_py_with = data_ptr)]
    next_sibling: usize,
    #[pyo3(from_py_with = data_ptr)]
    ancestor_bits: usize,
    #[pyo3(from_py_with = data_ptr)]
    scores: usize,
    #[pyo3(from_py_with = data_ptr)]
    num_nodes: usize,
    #[pyo3(from_py_with = data_ptr)]
    topk_logprobs: usize,
    #[pyo3(from_py_with = data_ptr)]
    topk_ids: usize,
    #[pyo3(from_py_with = data_ptr)]
    status: usize,
}

impl TreeOut {
    /// The CPU path's slices.
    ///
    /// # Safety
    /// The pointers must address live, non-overlapping tensors sized for `s`.
    pub unsafe fn buffers(&self, s: &batch::Shape) -> TreeBuffers<'static> {
        let (bs, q, lk) = (s.bs, s.q(), s.depth * s.k);
        TreeBuffers {
            verify: VerifyInputs {
                verify_ids: slice_mut(self.verify_ids, bs * q),
                positions: slice_mut(self.positions, bs * q),
                depths: slice_mut(self.depths, bs * q),
                parents: slice_mut(self.parents, bs * q),
                first_child: slice_mut(self.first_child, bs * q),
                next_sibling: slice_mut(self.next_sibling, bs * q),
                ancestor_bits: slice_mut(self.ancestor_bits, bs * q * s.words()),
                scores: slice_mut(self.scores, bs * q),
            },
            num_nodes: slice_mut(self.num_nodes, bs),
            topk_logprobs: slice_mut(self.topk_logprobs, bs * lk),
            topk_ids: slice_mut(self.topk_ids, bs * lk),
            status: slice_mut(self.status, bs),
        }
    }

    /// The links of the tree a step of `[bs, q]` wrote into these buffers.
    pub fn links(&self, bs: usize, q: usize) -> Links {
        Links {
            shape: (bs, q),
            verify_ids: self.verify_ids,
            first_child: self.first_child,
            next_sibling: self.next_sibling,
        }
    }

    /// The GPU path's device addresses.
    pub fn ptrs(&self) -> TreePtrs {
        TreePtrs {
            verify_ids: self.verify_ids as u64,
            positions: self.positions as u64,
            depths: self.depths as u64,
            parents: self.parents as u64,
            first_child: self.first_child as u64,
            next_sibling: self.next_sibling as u64,
            ancestor_bits: self.ancestor_bits as u64,
            scores: self.scores as u64,
            num_nodes: self.num_nodes as u64,
            topk_logprobs: self.topk_logprobs as u64,
            topk_ids: self.topk_ids as u64,
            status: self.status as u64,
        }
    }
}

/// The links of a `Tree` an accept walks, and its `[bs, Q]` shape.
#[derive(FromPyObject)]
pub struct Links {
    #[pyo3(attribute("verify_ids"), from_py_with = shape2)]
    shape: (usize, usize),
    #[pyo3(from_py_with = data_ptr)]
    verify_ids: usize,
    #[pyo3(from_py_with = data_ptr)]
    first_child: usize,
    #[pyo3(from_py_with = data_ptr)]
    next_sibling: usize,
}

impl Links {
    pub fn bs(&self) -> usize {
        self.shape.0
    }

    pub fn q(&self) -> usize {
        self.shape.1
    }

    /// # Safety
    /// The pointers must address live int64 `[bs, Q]` tensors.
    pub unsafe fn batch(&self) -> BatchLinks<'static> {
        let (bs, q) = self.shape;
        let n = bs * q;
        BatchLinks {
            verify_ids: slice(self.verify_ids, n),
            first_child: slice(self.first_child, n),
            next_sibling: slice(self.next_sibling, n),
            q,
        }
    }

    pub fn walk(&self) -> WalkTree {
        WalkTree {
            verify_ids: self.verify_ids as u64,
            first_child: self.first_child as u64,
            next_sibling: self.next_sibling as u64,
        }
    }
}

/// An `Acceptance`'s tensors, and its `[bs, L+1]` path shape.
#[derive(FromPyObject, Clone, Copy)]
pub struct AccOut {
    #[pyo3(attribute("accepted_nodes"), from_py_with = shape2)]
    shape: (usize, usize),
    #[pyo3(from_py_with = data_ptr)]
    accepted_nodes: usize,
    #[pyo3(from_py_with = data_ptr)]
    accepted_tokens: usize,
    #[pyo3(from_py_with = data_ptr)]
    accept_index: usize,
    #[pyo3(from_py_with = data_ptr)]
    accept_len: usize,
    #[pyo3(from_py_with = data_ptr)]
    bonus: usize,
    #[pyo3(from_py_with = data_ptr)]
    status: usize,
}

impl AccOut {
    pub fn path_len(&self) -> usize {
        self.shape.1
    }

    /// The acceptance of `bs` requests with paths of `path_len` in these buffers (each
    /// field's region starts at the same address whatever the shape).
    pub fn sized(&self, bs: usize, path_len: usize) -> AccOut {
        AccOut {
            shape: (bs, path_len),
            ..*self
        }
    }

    /// # Safety
    /// The pointers must address live, non-overlapping tensors of the acceptance's shape.
    pub unsafe fn batch(&self) -> AcceptBuffers<'static> {
        let (bs, w) = self.shape;
        AcceptBuffers {
            accepted_nodes: slice_mut(self.accepted_nodes, bs * w),
            accepted_tokens: slice_mut(self.accepted_tokens, bs * w),
            accept_index: slice_mut(self.accept_index, bs * w),
            accept_len: slice_mut(self.accept_len, bs),
            bonus: slice_mut(self.bonus, bs),
            status: slice_mut(self.status, bs),
        }
    }

    pub fn ptrs(&self) -> AcceptPtrs {
        AcceptPtrs {
            accepted_nodes: self.accepted_nodes as u64,
            accepted_tokens: self.accepted_tokens as u64,
            accept_index: self.accept_index as u64,
            accept_len: self.accept_len as u64,
            bonus: self.bonus as u64,
            status: self.status as u64,
        }
    }

    /// The paths and status a commit launch reads, for a window of `q` slots.
    pub fn path(&self, q: usize) -> CommitPath {
        CommitPath {
            bs: self.shape.0,
            q,
            path_len: self.shape.1,
            accepted_nodes: self.accepted_nodes as u64,
            status: self.status as u64,
        }
    }
}

/// A `SamplingState`'s per-request parameters and generator (device tensors).
#[derive(FromPyObject)]
pub struct SamplingOut {
    #[pyo3(from_py_with = data_ptr)]
    temperature: usize,
    #[pyo3(from_py_with = data_ptr)]
    top_k: usize,
    #[pyo3(from_py_with = data_ptr)]
    top_p: usize,
    #[pyo3(from_py_with = data_ptr)]
    rng: usize,
}

impl SamplingOut {
    pub fn ptrs(&self) -> Sampling {
        Sampling {
            temperature: self.temperature as u64,
            top_k: self.top_k as u64,
            top_p: self.top_p as u64,
            rng: self.rng as u64,
        }
    }
}

/// A build's device scratch: a dict of int32 `[bs * L]` tensors `eligible` and `bad`, and
/// the selection's diagnostics `stats` (int64 `[bs, 16]`) when the benchmark asks for them.
pub fn scratch(d: &Bound<'_, PyDict>) -> PyResult<ddtree_cuda::Scratch> {
    let get = |name: &str| -> PyResult<u64> {
        match d.get_item(name)? {
            Some(t) => Ok(data_ptr(&t)? as u64),
            None if name == "stats" => Ok(0),
            None => Err(pyo3::exceptions::PyKeyError::new_err(name.to_string())),
        }
    };
    Ok(ddtree_cuda::Scratch {
        eligible: get("eligible")?,
        bad: get("bad")?,
        stats: get("stats")?,
    })
}
