//! SPEC stage 2 — selection: the first `B` rank paths in canonical order.
//!
//! Canonical order is (float64 score descending, rank path lexicographically ascending, a
//! proper prefix first). Every log-prob is ≤ 0, so a path's generator (its parent for a
//! first child, its previous sibling otherwise) always precedes it, and the best-first heap
//! that pops the best path and pushes its next sibling and its first child emits exactly
//! that order.

use std::cmp::Ordering;

/// The deepest tree this build supports (SPEC's L is 15 for b16 drafters).
pub const MAX_DEPTH: usize = 32;

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

/// A path waiting in the frontier: `parent`'s path extended by `rank` at `depth`.
#[derive(Clone, Copy)]
struct Pending {
    score: f64,
    parent: u32,
    rank: u16,
    depth: u8,
}

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

/// The frontier: a binary max-heap of (score, index into `pending`) in canonical order.
/// Entries move as 16 bytes and compare by score in place; rank paths are compared (through
/// the chosen nodes' ranks) only when two scores tie exactly.
struct Frontier {
    pending: Vec<Pending>,
    heap: Vec<(f64, u32)>,
}

impl Frontier {
    fn with_capacity(n: usize) -> Self {
        Self {
            pending: Vec::with_capacity(n),
            heap: Vec::with_capacity(n),
        }
    }

    /// Canonical "a before b": higher score, then the lexicographically smaller rank path.
    fn before(&self, nodes: &[Node], a: (f64, u32), b: (f64, u32)) -> bool {
        match a.0.partial_cmp(&b.0) {
            Some(Ordering::Greater) => true,
            Some(Ordering::Less) => false,
            _ => {
                let (pa, pb) = (&self.pending[a.1 as usize], &self.pending[b.1 as usize]);
                path_cmp(nodes, pa, pb) == Ordering::Less
            }
        }
    }

    fn push(&mut self, nodes: &[Node], p: Pending) {
        self.pending.push(p);
        self.heap.push((p.score, self.pending.len() as u32 - 1));
        let mut i = self.heap.len() - 1;
        while i > 0 {
            let up = (i - 1) / 2;
            if !self.before(nodes, self.heap[i], self.heap[up]) {
                break;
            }
            self.heap.swap(i, up);
            i = up;
        }
    }

    fn pop(&mut self, nodes: &[Node]) -> Option<Pending> {
        let top = *self.heap.first()?;
        let last = self.heap.pop().unwrap();
        if !self.heap.is_empty() {
            self.heap[0] = last;
            let mut i = 0;
            loop {
                let (l, r) = (2 * i + 1, 2 * i + 2);
                let mut best = i;
                for c in [l, r] {
                    if c < self.heap.len() && self.before(nodes, self.heap[c], self.heap[best]) {
                        best = c;
                    }
                }
                if best == i {
                    break;
                }
                self.heap.swap(i, best);
                i = best;
            }
        }
        Some(self.pending[top.1 as usize])
    }
}

/// Lexicographic order of two pending paths (a proper prefix first), walking the chosen
/// nodes' parent links from the root down.
fn path_cmp(nodes: &[Node], a: &Pending, b: &Pending) -> Ordering {
    let pa = ranks_of(nodes, a);
    let pb = ranks_of(nodes, b);
    pa[..a.depth as usize].cmp(&pb[..b.depth as usize])
}

fn ranks_of(nodes: &[Node], p: &Pending) -> [u16; MAX_DEPTH] {
    let mut ranks = [0u16; MAX_DEPTH];
    let mut d = p.depth as usize;
    ranks[d - 1] = p.rank;
    let mut n = p.parent as usize;
    while n != 0 {
        d -= 1;
        let node = &nodes[n - 1];
        ranks[d - 1] = node.rank as u16;
        n = node.parent;
    }
    ranks
}

/// The first `budget` rank paths in canonical order (fewer if fewer exist).
pub fn select(cands: RequestCandidates<'_>, budget: usize) -> Vec<Node> {
    let mut nodes: Vec<Node> = Vec::with_capacity(budget);
    let mut frontier = Frontier::with_capacity(2 * budget + 2);
    if cands.is_eligible(1, 0) {
        let first = Pending {
            score: cands.lp(1, 0),
            parent: 0,
            rank: 0,
            depth: 1,
        };
        frontier.push(&nodes, first);
    }
    while nodes.len() < budget {
        let Some(best) = frontier.pop(&nodes) else {
            break;
        };
        let (depth, rank) = (best.depth as usize, best.rank as usize);
        nodes.push(Node {
            parent: best.parent as usize,
            depth,
            rank,
            score: best.score,
        });
        let index = nodes.len() as u32;
        if cands.is_eligible(depth, rank + 1) {
            // The sibling's score: its parent's score plus the next rank's log-prob.
            let lp = cands.lp(depth, rank + 1);
            let score = match best.parent {
                0 => lp,
                p => nodes[p as usize - 1].score + lp,
            };
            let sibling = Pending {
                score,
                rank: best.rank + 1,
                ..best
            };
            frontier.push(&nodes, sibling);
        }
        if cands.is_eligible(depth + 1, 0) {
            let child = Pending {
                score: best.score + cands.lp(depth + 1, 0),
                parent: index,
                rank: 0,
                depth: best.depth + 1,
            };
            frontier.push(&nodes, child);
        }
    }
    nodes
}
