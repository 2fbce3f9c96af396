//! `CpuEngine`: the CPU twin of `CudaEngine` behind a CPU `Stepper`. The same tensor checks
//! (`checks.rs`, for the CPU) and the same round state machine (ddtree-core's `Planner`), then
//! the Rust CPU path instead of kernels. On the CPU the index *values* are checked too, on
//! the host (on CUDA they are status codes: reading them would sync).

use crate::buffers::{data_ptr, AccOut, TreeOut};
use crate::checks::Checks;
use crate::engine::round_key;
use crate::tensor::{slice, with_logits, TensorArg};
use ddtree_core::round::{Limits, Planner};
use ddtree_cuda::{Dtype, Logits};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

#[pyclass(module = "ddtree._core", name = "CpuEngine")]
pub struct CpuEngine {
    planner: Planner,
    checks: Checks,
    /// The Stepper's `Tree` of the largest shape: each field's region starts there, and a
    /// step of any shape writes the leading part.
    tree: TreeOut,
    /// The Stepper's `Acceptance` of the largest shape, likewise.
    acc: AccOut,
}

/// Per-request sampling parameters as the Stepper passes them: `[bs]` float64
/// temperature, int64 top_k, float64 top_p CPU tensors (checked by `_api.sampling_params`).
type Params<'py> = (Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>);

#[pymethods]
impl CpuEngine {
    /// `limits`: (max_batch, budget, depth, vocab, topk or None); `tree` and `acc`: a `Tree`
    /// and an `Acceptance` of the largest shape viewing the Stepper's static buffers (read
    /// once, here).
    #[new]
    fn new(
        py: Python<'_>,
        limits: (usize, usize, usize, usize, Option<usize>),
        tree: TreeOut,
        acc: AccOut,
    ) -> PyResult<Self> {
        let (max_batch, budget, depth, vocab, topk) = limits;
        Ok(Self {
            planner: Planner::new(Limits {
                max_batch,
                budget,
                depth,
                vocab,
                topk,
            }),
            checks: Checks::new(py, None)?,
            tree,
            acc,
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
        let inputs =
            self.checks
                .step_inputs(&self.planner, draft_logits, root_tokens, prefix_lens)?;
        let (x, r, roots, prefix) = (inputs.logits, inputs.round, inputs.roots, inputs.prefix);
        // SAFETY: checked live int64 [bs] CPU tensors (or their contiguous copies).
        let (rs, ps) = unsafe {
            (
                slice::<i64>(roots as usize, r.bs),
                slice::<i64>(prefix as usize, r.bs),
            )
        };
        check_roots(rs, r.vocab)?;
        check_prefix(ps, r.depth)?;
        let logits = tensor_arg(&x, "draft_logits")?;
        let l = self.planner.limits;
        let (root_ptr, prefix_ptr, tree) = (roots as usize, prefix as usize, &self.tree);
        with_logits!(logits, "draft_logits", |x| crate::build_as(
            py, x, root_ptr, prefix_ptr, l.budget, l.topk, tree
        ))?;
        self.planner.resume(r);
        round_key(py, r)
    }

    /// Checks target logits against the last step's tree (shape, vocabulary, device).
    fn check_target(&self, target_logits: &Bound<'_, PyAny>) -> PyResult<()> {
        self.checks.target(&self.planner, target_logits).map(|_| ())
    }

    /// SPEC stage 4 for the last step's tree into the static acceptance: greedy, or with
    /// per-request `params` (see `Params`) and random numbers keyed by `seed`. The target is
    /// checked first; returns the round's (bs, depth, K, V).
    #[pyo3(signature = (target_logits, params=None, seed=0))]
    fn accept<'py>(
        &self,
        py: Python<'py>,
        target_logits: &Bound<'py, PyAny>,
        params: Option<Params<'py>>,
        seed: u64,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let (t, r) = self.checks.target(&self.planner, target_logits)?;
        let target = tensor_arg(&t, "target_logits")?;
        let (links, acc) = (
            self.tree.links(r.bs, r.q()),
            self.acc.sized(r.bs, r.path_len()),
        );
        let args = (&links, &acc);
        match params {
            None => with_logits!(target, "target_logits", |x| crate::accept_greedy_as(
                py, x, args
            )),
            Some((temperature, top_k, top_p)) => {
                let ptrs = (
                    data_ptr(&temperature)?,
                    data_ptr(&top_k)?,
                    data_ptr(&top_p)?,
                );
                // SAFETY: `_api.sampling_params` made them: [bs] CPU f64, i64, f64.
                let p = unsafe { crate::sampling_params(ptrs, r.bs) };
                with_logits!(target, "target_logits", |x| crate::accept_sampled_as(
                    py, x, args, &p, seed
                ))
            }
        }?;
        round_key(py, r)
    }
}

/// The CPU path's view of checked logits `name` (CPU strides are never negative).
fn tensor_arg(x: &Logits, name: &str) -> PyResult<TensorArg> {
    let dtype = match x.dtype {
        Dtype::F32 => "float32",
        Dtype::F16 => "float16",
        Dtype::Bf16 => "bfloat16",
    };
    let strides = x
        .strides
        .iter()
        .map(|&s| usize::try_from(s))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| {
            PyValueError::new_err(format!("{name}: negative strides are not supported"))
        })?;
    Ok(TensorArg {
        ptr: x.ptr as usize,
        dtype: dtype.into(),
        shape: x.shape.to_vec(),
        strides,
    })
}

/// Every root token must lie in the draft's vocabulary (the first one that does not is
/// named).
fn check_roots(roots: &[i64], vocab: usize) -> PyResult<()> {
    match roots.iter().find(|&&t| t < 0 || t as u64 >= vocab as u64) {
        Some(bad) => Err(PyValueError::new_err(format!(
            "root_tokens: token {bad} is outside the vocabulary 0..{}",
            vocab.saturating_sub(1)
        ))),
        None => Ok(()),
    }
}

/// Prefix lengths must be ≥ 0, and small enough that `prefix + depth` fits in the int64
/// positions.
fn check_prefix(prefix: &[i64], depth: usize) -> PyResult<()> {
    let (Some(&lo), Some(&hi)) = (prefix.iter().min(), prefix.iter().max()) else {
        return Ok(());
    };
    if lo < 0 {
        return Err(PyValueError::new_err(format!(
            "prefix_lens: must be ≥ 0, got {lo}"
        )));
    }
    let limit = i64::MAX - depth as i64;
    if hi > limit {
        return Err(PyValueError::new_err(format!(
            "prefix_lens: {hi} + depth {depth} overflows the int64 positions (at most \
             {limit} at this depth)"
        )));
    }
    Ok(())
}
