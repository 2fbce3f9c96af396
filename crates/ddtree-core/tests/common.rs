//! Helpers shared by the integration tests: a tiny deterministic RNG and a brute-force
//! enumerator of every rank path (SPEC stage 2 straight from its definition).

#![allow(dead_code)]

use ddtree_core::batch::{build_tree, TreeBuffers};
use ddtree_core::emit::VerifyInputs;
use ddtree_core::logits::Logits3;

/// xorshift64*: deterministic, dependency-free.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Every rank path in canonical order: (score desc, path lexicographic asc, prefix first).
pub fn brute_force(lp: &[f32], eligible: &[usize], k: usize) -> Vec<(Vec<usize>, f64)> {
    let mut all = Vec::new();
    let mut stack: Vec<(Vec<usize>, f64)> = (0..eligible[0].min(k))
        .map(|r| (vec![r], lp[r] as f64))
        .collect();
    while let Some((path, score)) = stack.pop() {
        let d = path.len();
        if d < eligible.len() {
            for r in 0..eligible[d].min(k) {
                let mut child = path.clone();
                child.push(r);
                stack.push((child, score + lp[d * k + r] as f64));
            }
        }
        all.push((path, score));
    }
    all.sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap().then_with(|| a.0.cmp(&b.0)));
    all
}

/// Owned outputs of a build, for tests.
pub struct OwnedTree {
    pub q: usize,
    pub k: usize,
    pub words: usize,
    pub verify_ids: Vec<i64>,
    pub positions: Vec<i64>,
    pub depths: Vec<i64>,
    pub parents: Vec<i64>,
    pub first_child: Vec<i64>,
    pub next_sibling: Vec<i64>,
    pub ancestor_bits: Vec<i32>,
    pub scores: Vec<f64>,
    pub num_nodes: Vec<i64>,
    pub topk_logprobs: Vec<f32>,
    pub topk_ids: Vec<i64>,
    pub status: Vec<i32>,
}

/// Builds a tree from fp32 logits `[bs, L, V]` (contiguous) with prefix lengths 100·b.
pub fn build(
    logits: &[f32],
    shape: [usize; 3],
    roots: &[i64],
    budget: usize,
    topk: Option<usize>,
) -> OwnedTree {
    let [bs, depth, vocab] = shape;
    let k = budget.min(vocab).min(topk.unwrap_or(usize::MAX));
    let q = budget + 1;
    let words = q.div_ceil(32);
    let mut t = OwnedTree {
        q,
        k,
        words,
        verify_ids: vec![7; bs * q],
        positions: vec![7; bs * q],
        depths: vec![7; bs * q],
        parents: vec![7; bs * q],
        first_child: vec![7; bs * q],
        next_sibling: vec![7; bs * q],
        ancestor_bits: vec![7; bs * q * words],
        scores: vec![7.0; bs * q],
        num_nodes: vec![7; bs],
        topk_logprobs: vec![7.0; bs * depth * k],
        topk_ids: vec![7; bs * depth * k],
        status: vec![7; bs],
    };
    let prefix: Vec<i64> = (0..bs as i64).map(|b| 100 * b).collect();
    let view = Logits3::new("x", logits, shape, [depth * vocab, vocab, 1]).unwrap();
    let bufs = TreeBuffers {
        verify: VerifyInputs {
            verify_ids: &mut t.verify_ids,
            positions: &mut t.positions,
            depths: &mut t.depths,
            parents: &mut t.parents,
            first_child: &mut t.first_child,
            next_sibling: &mut t.next_sibling,
            ancestor_bits: &mut t.ancestor_bits,
            scores: &mut t.scores,
        },
        num_nodes: &mut t.num_nodes,
        topk_logprobs: &mut t.topk_logprobs,
        topk_ids: &mut t.topk_ids,
        status: &mut t.status,
    };
    build_tree(view, roots, &prefix, budget, topk, bufs).unwrap();
    t
}
