//! The round's state machine, the same for a CPU and a CUDA `Stepper`: the limits it was
//! built for, the shape of its last step, and the checks of a step's draft logits and an
//! accept's target logits against them (named after the argument, with the messages the
//! Python package documents). The CUDA engine (ddtree-cuda's `engine`) and the CPU engine
//! (ddtree-py's `CpuEngine`) each hold one.

use crate::error::{ArgError, Result};

/// What a Stepper was built for (its constructor's checked arguments).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_batch: usize,
    pub budget: usize,
    pub depth: usize,
    pub vocab: usize,
    pub topk: Option<usize>,
}

/// The shape of a step: what the accept and the commit calls after it work on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Round {
    pub bs: usize,
    pub depth: usize,
    /// The draft's vocabulary: the target must score the same one.
    pub vocab: usize,
    pub k: usize,
    pub budget: usize,
}

impl Round {
    pub fn q(&self) -> usize {
        self.budget + 1
    }
    pub fn path_len(&self) -> usize {
        self.depth + 1
    }
}

/// The limits and the last step's round.
#[derive(Debug, Clone)]
pub struct Planner {
    pub limits: Limits,
    last: Option<Round>,
}

impl Planner {
    pub fn new(limits: Limits) -> Self {
        Self { limits, last: None }
    }

    /// The last step's round, if any.
    pub fn last(&self) -> Option<Round> {
        self.last
    }

    /// Makes `r` the current round (a step of it ran, or a replayed graph rewrote it).
    pub fn resume(&mut self, r: Round) {
        self.last = Some(r);
    }

    /// The current round, or "`what`: call step() first".
    pub fn round(&self, what: &'static str) -> Result<Round> {
        self.last
            .ok_or_else(|| ArgError::new(what, "call step() first"))
    }

    /// The round a step with draft logits of `shape` builds.
    pub fn plan_step(&self, shape: [usize; 3]) -> Result<Round> {
        let [bs, depth, vocab] = shape;
        let l = &self.limits;
        let bad = |m: String| Err(ArgError::new("draft_logits", m));
        if let Some(i) = shape.iter().position(|&d| d == 0) {
            let what = ["batch size", "depth L", "vocabulary V"][i];
            return bad(format!(
                "{what} must be ≥ 1, got shape ({bs}, {depth}, {vocab})"
            ));
        }
        if depth > l.depth {
            return bad(format!("depth L = {depth} exceeds the limit {}", l.depth));
        }
        if bs > l.max_batch {
            return bad(format!("batch size {bs} exceeds max_batch={}", l.max_batch));
        }
        if vocab > l.vocab {
            return bad(format!("vocabulary {vocab} exceeds vocab={}", l.vocab));
        }
        // SPEC's K = min(B, V, topk cap).
        let k = l.budget.min(vocab).min(l.topk.unwrap_or(l.budget));
        Ok(Round {
            bs,
            depth,
            vocab,
            k,
            budget: l.budget,
        })
    }

    /// Checks target logits of `shape` against the last step's tree.
    pub fn plan_accept(&self, shape: [usize; 3]) -> Result<Round> {
        let r = self.round("Stepper.accept")?;
        let bad = |m: String| Err(ArgError::new("target_logits", m));
        if shape[0] != r.bs || shape[1] != r.q() {
            return bad(format!(
                "shape must be [{}, {}, V] for this tree, got {shape:?}",
                r.bs,
                r.q()
            ));
        }
        if shape[2] != r.vocab {
            return bad(format!(
                "vocabulary V = {} differs from the draft's V = {} (the draft_logits of the \
                 last step())",
                shape[2], r.vocab
            ));
        }
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn planner(topk: Option<usize>) -> Planner {
        Planner::new(Limits {
            max_batch: 8,
            budget: 63,
            depth: 6,
            vocab: 1000,
            topk,
        })
    }

    #[test]
    fn a_step_plans_k_from_the_budget_the_vocabulary_and_the_cap() {
        let p = planner(None);
        assert_eq!(p.plan_step([8, 6, 1000]).unwrap().k, 63);
        assert_eq!(p.plan_step([2, 1, 40]).unwrap().k, 40);
        assert_eq!(planner(Some(5)).plan_step([2, 3, 1000]).unwrap().k, 5);
        let r = p.plan_step([3, 4, 900]).unwrap();
        assert_eq!((r.q(), r.path_len()), (64, 5));
    }

    #[test]
    fn a_step_outside_the_limits_names_draft_logits() {
        let p = planner(None);
        for (shape, want) in [
            ([9, 6, 1000], "batch size 9 exceeds max_batch=8"),
            ([8, 7, 1000], "depth L = 7 exceeds the limit 6"),
            ([8, 6, 1001], "vocabulary 1001 exceeds vocab=1000"),
            (
                [0, 6, 1000],
                "batch size must be ≥ 1, got shape (0, 6, 1000)",
            ),
            ([8, 6, 0], "vocabulary V must be ≥ 1"),
        ] {
            let m = p.plan_step(shape).unwrap_err().to_string();
            assert!(m.starts_with("draft_logits: ") && m.contains(want), "{m}");
        }
    }

    #[test]
    fn accept_needs_a_step_and_a_target_of_the_trees_shape_and_vocabulary() {
        let mut p = planner(None);
        let m = p.plan_accept([1, 64, 1000]).unwrap_err().to_string();
        assert_eq!(m, "Stepper.accept: call step() first");
        assert_eq!(
            p.round("Stepper.publish").unwrap_err().to_string(),
            "Stepper.publish: call step() first"
        );
        p.resume(p.plan_step([3, 4, 900]).unwrap());
        assert_eq!(p.plan_accept([3, 64, 900]).unwrap().bs, 3);
        let m = p.plan_accept([3, 63, 900]).unwrap_err().to_string();
        assert!(
            m.starts_with("target_logits: shape must be [3, 64, V]"),
            "{m}"
        );
        let m = p.plan_accept([3, 64, 1000]).unwrap_err().to_string();
        assert!(
            m.contains("V = 1000 differs from the draft's V = 900"),
            "{m}"
        );
    }
}
