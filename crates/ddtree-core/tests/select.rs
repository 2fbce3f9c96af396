//! SPEC stage 2: hand-checked cases and a property test against brute-force enumeration.

mod common;

use common::{brute_force, Rng};
use ddtree_core::select::{select, Node, RequestCandidates};

fn run(lp: &[f32], eligible: &[usize], k: usize, budget: usize) -> Vec<Node> {
    select(RequestCandidates { lp, eligible, k }, budget)
}

/// Rank paths of the selection, rebuilt from parents and ranks.
fn paths(nodes: &[Node]) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::new();
    for n in nodes {
        let mut p = if n.parent == 0 {
            vec![]
        } else {
            out[n.parent - 1].clone()
        };
        p.push(n.rank);
        out.push(p);
    }
    out
}

#[test]
fn k1_gives_a_chain() {
    let lp = [-0.5f32, -0.25, -1.0];
    let nodes = run(&lp, &[1, 1, 1], 1, 10);
    assert_eq!(paths(&nodes), vec![vec![0], vec![0, 0], vec![0, 0, 0]]);
    assert_eq!(
        nodes[2].score,
        -0.5f32 as f64 + -0.25f32 as f64 + -1.0f32 as f64
    );
}

#[test]
fn budget_larger_than_reachable_set_takes_everything() {
    // K = 2, L = 2: 2 + 4 = 6 rank paths.
    let lp = [-0.1f32, -2.0, -0.3, -0.4];
    let nodes = run(&lp, &[2, 2], 2, 100);
    assert_eq!(nodes.len(), 6);
}

#[test]
fn all_equal_rows_order_lexicographically_prefix_first() {
    // Every LP is 0: all scores tie, so the order is pure lexicographic with prefix first.
    let lp = [0.0f32; 6];
    let nodes = run(&lp, &[3, 3], 3, 12);
    let want: Vec<Vec<usize>> = vec![
        vec![0],
        vec![0, 0],
        vec![0, 1],
        vec![0, 2],
        vec![1],
        vec![1, 0],
        vec![1, 1],
        vec![1, 2],
        vec![2],
        vec![2, 0],
        vec![2, 1],
        vec![2, 2],
    ];
    assert_eq!(paths(&nodes), want);
}

#[test]
fn ties_between_depths_take_the_lexicographically_smaller_path() {
    // (1) scores -1; (0, 0) scores -0.5 + -0.5 = -1: tie, and (0, 0) < (1).
    let lp = [-0.5f32, -1.0, -0.5, -3.0];
    let nodes = run(&lp, &[2, 2], 2, 3);
    assert_eq!(paths(&nodes), vec![vec![0], vec![0, 0], vec![1]]);
}

#[test]
fn ineligible_ranks_are_never_chosen() {
    let lp = [-0.1f32, f32::NEG_INFINITY, -0.2, -0.3];
    let nodes = run(&lp, &[1, 2], 2, 10);
    assert_eq!(paths(&nodes), vec![vec![0], vec![0, 0], vec![0, 1]]);
    assert!(run(&lp, &[0, 2], 2, 10).is_empty());
}

#[test]
fn log_prob_exactly_zero_keeps_parents_first() {
    let lp = [0.0f32, -1.0, 0.0, 0.0];
    let nodes = run(&lp, &[2, 2], 2, 6);
    assert_eq!(paths(&nodes)[..3], [vec![0], vec![0, 0], vec![0, 1]]);
}

/// Random LP rows (sorted descending, as stage 1 makes them), with many ties.
fn random_lp(rng: &mut Rng, depth: usize, k: usize) -> (Vec<f32>, Vec<usize>) {
    let mut lp = Vec::with_capacity(depth * k);
    let mut eligible = Vec::with_capacity(depth);
    let coarse = rng.below(3);
    for _ in 0..depth {
        let mut row: Vec<f32> = (0..k)
            .map(|_| match coarse {
                0 => -(rng.below(4) as f32) * 0.5, // many exact ties, some zeros
                1 => 0.0,                          // all equal
                _ => -(rng.unit() as f32) * 4.0,
            })
            .collect();
        row.sort_by(|a, b| b.partial_cmp(a).unwrap());
        let e = if rng.below(8) == 0 {
            rng.below(k + 1)
        } else {
            k
        };
        for x in &mut row[e..] {
            *x = f32::NEG_INFINITY;
        }
        lp.extend(row);
        eligible.push(e);
    }
    (lp, eligible)
}

#[test]
fn matches_brute_force_on_random_small_cases() {
    let mut rng = Rng(0x5eed);
    for case in 0..3000 {
        let depth = 1 + rng.below(4);
        let k = 1 + rng.below(4);
        let budget = 1 + rng.below(60);
        let (lp, eligible) = random_lp(&mut rng, depth, k);
        let got = run(&lp, &eligible, k, budget);
        let want = brute_force(&lp, &eligible, k);
        let want = &want[..budget.min(want.len())];
        assert_eq!(got.len(), want.len(), "case {case}");
        for (n, (p, (wp, ws))) in paths(&got).iter().zip(want).enumerate() {
            assert_eq!(p, wp, "case {case} node {}", n + 1);
            assert_eq!(
                got[n].score.to_bits(),
                ws.to_bits(),
                "case {case} node {}",
                n + 1
            );
        }
    }
}

#[test]
fn invariants_hold_on_random_cases() {
    let mut rng = Rng(42);
    for _ in 0..500 {
        let depth = 1 + rng.below(15);
        let k = 1 + rng.below(8);
        let budget = 1 + rng.below(300);
        let (lp, eligible) = random_lp(&mut rng, depth, k);
        let nodes = run(&lp, &eligible, k, budget);
        for (n, node) in nodes.iter().enumerate() {
            let i = n + 1;
            assert!(node.parent < i, "parent before child");
            let parent_depth = if node.parent == 0 {
                0
            } else {
                nodes[node.parent - 1].depth
            };
            assert_eq!(node.depth, parent_depth + 1);
            assert!(node.depth <= depth);
            if n > 0 {
                assert!(nodes[n - 1].score >= node.score, "scores never increase");
            }
        }
        // Siblings appear in rank order.
        for (a, x) in nodes.iter().enumerate() {
            for y in &nodes[a + 1..] {
                if x.parent == y.parent {
                    assert!(x.rank < y.rank);
                }
            }
        }
    }
}
