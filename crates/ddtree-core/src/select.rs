//! SPEC stage 2 — selection: the first `B` rank paths in canonical order.
//!
//! Canonical order is (float64 score descending, rank path lexicographically ascending, a
//! proper prefix first). Every log-prob is ≤ 0, so a path's generator (its parent for a
//! first child, its previous sibling otherwise) always precedes it, and the best-first heap
//! that pops the best path and pushes its next sibling and its first child emits exactly
//! that order.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// The deepest tree this build supports (SPEC's L is 15 for b16 drafters).
pub const MAX_DEPTH: usize = 32;

/// A rank path `(r1, …, rd)`, stored inline so heap entries need no allocation.
#[derive(Clone, Copy, PartialEq, Eq)]
struct RankPath {
    ranks: [u16; MAX_DEPTH],
    len: u8,
}

impl RankPath {
    fn as_slice(&self) -> &[u16] {
        &self.ranks[..self.len as usize]
    }

    fn with_last(&self, rank: u16) -> Self {
        let mut next = *self;
        next.ranks[next.len as usize - 1] = rank;
        next
    }

    fn child(&self, rank: u16) -> Self {
        let mut next = *self;
        next.ranks[next.len as usize] = rank;
        next.len += 1;
        next
    }
}

/// One selected node: index `1 + position` in the selection.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Node {
    /// Parent node index (0 is the root).
    pub parent: usize,
    /// Depth d, 1-based (the path length).
    pub depth: usize,
    /// Rank at depth d (index into the stage-1 candidates of row d-1).
    pub rank: usize,
    /// The canonical float64 score.
    pub score: f64,
}

/// A path waiting in the heap.
struct Pending {
    score: f64,
    path: RankPath,
    parent: usize,
}

impl Ord for Pending {
    fn cmp(&self, other: &Self) -> Ordering {
        // Max-heap: higher score first, then the lexicographically smaller path. Scores are
        // never NaN (log-probs are ≤ 0 or -inf and only ever added).
        let by_score = self
            .score
            .partial_cmp(&other.score)
            .unwrap_or(Ordering::Equal);
        by_score.then_with(|| other.path.as_slice().cmp(self.path.as_slice()))
    }
}
impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Pending {}

/// Stage-1 candidates of one request: `lp[d * k + r]` is LP at depth d+1, rank r.
#[derive(Clone, Copy)]
pub struct RequestCandidates<'a> {
    pub lp: &'a [f32],
    /// Eligible ranks per depth row (ranks `0..eligible[d]` are finite).
    pub eligible: &'a [usize],
    pub k: usize,
}

impl RequestCandidates<'_> {
    fn depth_limit(&self) -> usize {
        self.eligible.len()
    }

    fn lp(&self, depth: usize, rank: usize) -> f64 {
        self.lp[(depth - 1) * self.k + rank] as f64
    }

    fn is_eligible(&self, depth: usize, rank: usize) -> bool {
        depth <= self.depth_limit() && rank < self.eligible[depth - 1].min(self.k)
    }
}

/// The first `budget` rank paths in canonical order (fewer if fewer exist).
pub fn select(cands: RequestCandidates<'_>, budget: usize) -> Vec<Node> {
    let mut nodes = Vec::with_capacity(budget);
    let mut heap = BinaryHeap::with_capacity(budget + 2);
    if cands.is_eligible(1, 0) {
        let first = RankPath {
            ranks: [0; MAX_DEPTH],
            len: 1,
        };
        heap.push(Pending {
            score: cands.lp(1, 0),
            path: first,
            parent: 0,
        });
    }
    while nodes.len() < budget {
        let Some(best) = heap.pop() else { break };
        let depth = best.path.len as usize;
        let rank = best.path.ranks[depth - 1] as usize;
        nodes.push(Node {
            parent: best.parent,
            depth,
            rank,
            score: best.score,
        });
        let index = nodes.len();
        if cands.is_eligible(depth, rank + 1) {
            // The sibling's score: its parent's score plus the next rank's log-prob.
            let lp = cands.lp(depth, rank + 1);
            let score = match best.parent {
                0 => lp,
                p => nodes[p - 1].score + lp,
            };
            heap.push(Pending {
                score,
                path: best.path.with_last(rank as u16 + 1),
                parent: best.parent,
            });
        }
        if cands.is_eligible(depth + 1, 0) {
            heap.push(Pending {
                score: best.score + cands.lp(depth + 1, 0),
                path: best.path.child(0),
                parent: index,
            });
        }
    }
    nodes
}
