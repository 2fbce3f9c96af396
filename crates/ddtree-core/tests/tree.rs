//! SPEC stages 3–5 on whole batches: verify inputs, mask bits, the walk, the commit, sampling.

mod common;

use common::{build, OwnedTree, Rng};
use ddtree_core::accept::{walk, AcceptOut, TreeLinks, Walked};
use ddtree_core::batch::{
    accept_tree, full_masks, AcceptBuffers, BatchLinks, Posterior, STATUS_NON_FINITE,
};
use ddtree_core::commit::kept_slots;
use ddtree_core::emit::sees;
use ddtree_core::logits::Logits3;
use ddtree_core::sample::{sample_row, DrawKey, SamplingParams};
use ddtree_core::status;

fn random_logits(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| (rng.below(16) as f32) * 0.25 - 2.0)
        .collect()
}

fn check_invariants(t: &OwnedTree, b: usize, prefix: i64) {
    let q = t.q;
    let r = |v: &[i64], i: usize| v[b * q + i];
    let n = t.num_nodes[b] as usize;
    for i in 0..q {
        let bit = |j| sees(&t.ancestor_bits[b * q * t.words..], t.words, i, j);
        assert!(bit(i), "every row sees itself");
        if i == 0 || i > n {
            // Root and pads: self only, SPEC pad values.
            assert_eq!((0..q).filter(|&j| bit(j)).count(), 1);
            assert_eq!(r(&t.parents, i), -1);
            assert_eq!(r(&t.depths, i), 0);
            assert_eq!(r(&t.positions, i), prefix);
            continue;
        }
        let p = r(&t.parents, i) as usize;
        assert!(p < i);
        assert_eq!(r(&t.depths, i), r(&t.depths, p) + 1);
        assert_eq!(r(&t.positions, i), prefix + r(&t.depths, i));
        for j in 0..q {
            let ancestor_or_self =
                j == i || sees(&t.ancestor_bits[b * q * t.words..], t.words, p, j);
            assert_eq!(bit(j), ancestor_or_self, "row {i} col {j}");
        }
    }
    // first_child / next_sibling enumerate exactly the children, in index order.
    for i in 0..=n {
        let mut kids = vec![];
        let mut c = r(&t.first_child, i);
        while c >= 0 {
            kids.push(c as usize);
            c = r(&t.next_sibling, c as usize);
        }
        let want: Vec<usize> = (1..=n).filter(|&j| r(&t.parents, j) == i as i64).collect();
        assert_eq!(kids, want);
    }
}

#[test]
fn verify_inputs_are_consistent_on_random_batches() {
    let mut rng = Rng(7);
    for _ in 0..60 {
        let (bs, depth, vocab) = (1 + rng.below(4), 1 + rng.below(6), 2 + rng.below(40));
        let budget = 1 + rng.below(70);
        let x = random_logits(&mut rng, bs * depth * vocab);
        let roots: Vec<i64> = (0..bs).map(|_| rng.below(vocab) as i64).collect();
        let t = build(&x, [bs, depth, vocab], &roots, budget, None);
        for (b, &root) in roots.iter().enumerate() {
            assert_eq!(t.status[b], 0);
            assert_eq!(t.verify_ids[b * t.q], root);
            check_invariants(&t, b, 100 * b as i64);
        }
    }
}

#[test]
fn a_non_finite_row_empties_only_its_request() {
    let (bs, depth, vocab) = (3, 2, 5);
    let mut x: Vec<f32> = (0..bs * depth * vocab).map(|i| (i % 7) as f32).collect();
    x[depth * vocab + vocab + 2] = f32::NAN; // request 1, depth 2
    let t = build(&x, [bs, depth, vocab], &[0, 1, 2], 8, None);
    assert_eq!(t.status, vec![0, STATUS_NON_FINITE, 0]);
    assert_eq!(t.num_nodes, vec![8, 0, 8]);
    check_invariants(&t, 1, 100);
    let k = t.k;
    assert!(t.topk_ids[depth * k..2 * depth * k]
        .iter()
        .all(|&i| i == -1));
}

#[test]
fn full_mask_has_prefix_columns_then_ancestor_bits() {
    let x = [0.0f32, -1.0, -2.0, 0.5, 0.25, 0.0];
    let t = build(&x, [1, 2, 3], &[1], 3, None);
    let mut out = vec![false; 3 * 4 * 6 + 5];
    let n = full_masks(&t.ancestor_bits, t.q, &[2], true, &mut out).unwrap();
    assert_eq!(n, 4 * 6);
    for i in 0..4 {
        let row = &out[i * 6..(i + 1) * 6];
        assert!(row[0] && row[1], "prefix columns");
        for j in 0..4 {
            assert_eq!(row[2 + j], sees(&t.ancestor_bits, t.words, i, j));
        }
    }
    assert!(
        out[n..].iter().all(|&v| !v),
        "nothing past the mask is written"
    );
    assert!(full_masks(&t.ancestor_bits, t.q, &[100], true, &mut out).is_err());
}

/// Greedy accept through target logits that point at chosen tokens.
fn accept_with_target(
    t: &OwnedTree,
    bs: usize,
    depth: usize,
    want_token: &[i64],
    vocab: usize,
) -> (Vec<i64>, Vec<i64>, Vec<i64>) {
    let q = t.q;
    let mut target = vec![0f32; bs * q * vocab];
    for (row, &tok) in want_token.iter().enumerate() {
        target[row * vocab + tok as usize] = 5.0;
    }
    let view = Logits3::new("t", &target, [bs, q, vocab], [q * vocab, vocab, 1]).unwrap();
    let w = depth + 1;
    let (mut nodes, mut toks, mut idx) = (vec![0; bs * w], vec![0; bs * w], vec![0; bs * w]);
    let (mut len, mut bonus, mut status) = (vec![0; bs], vec![0; bs], vec![-1; bs]);
    let links = BatchLinks {
        verify_ids: &t.verify_ids,
        first_child: &t.first_child,
        next_sibling: &t.next_sibling,
        q,
    };
    let out = AcceptBuffers {
        accepted_nodes: &mut nodes,
        accepted_tokens: &mut toks,
        accept_index: &mut idx,
        accept_len: &mut len,
        bonus: &mut bonus,
        status: &mut status,
    };
    accept_tree(links, Posterior::Greedy(view), out).unwrap();
    assert!(status.iter().all(|&s| s == 0));
    assert_eq!(
        toks.iter().filter(|&&v| v >= 0).count() as i64,
        len.iter().sum::<i64>()
    );
    (nodes, len, bonus)
}

#[test]
fn greedy_walk_follows_a_non_first_sibling_to_the_leaf() {
    let (depth, vocab) = (3, 6);
    let x: Vec<f32> = (0..depth * vocab).map(|i| -((i % vocab) as f32)).collect();
    let t = build(&x, [1, depth, vocab], &[5], 20, Some(2));
    // Posterior at every node: the rank-1 token (id 1), so the walk goes 0 → (1) → (1,1) → (1,1,1).
    let want = vec![1i64; t.q];
    let (nodes, len, bonus) = accept_with_target(&t, 1, depth, &want, vocab);
    assert_eq!(len, vec![4]);
    assert_eq!(bonus, vec![1]);
    let path: Vec<i64> = nodes[..4].to_vec();
    for w in path.windows(2) {
        assert_eq!(t.parents[w[1] as usize], w[0]);
        assert_eq!(t.verify_ids[w[1] as usize], 1);
    }
}

#[test]
fn greedy_walk_stops_at_once_when_no_child_matches() {
    let x = [0.0f32, -1.0, -2.0];
    let t = build(&x, [1, 1, 3], &[0], 2, None);
    let (nodes, len, bonus) = accept_with_target(&t, 1, 1, &[2, 2, 2], 3);
    assert_eq!((len[0], bonus[0]), (1, 2));
    assert_eq!(nodes, vec![0, -1]);
}

#[test]
fn commit_keeps_accepted_slots_in_path_order() {
    let slots = [10, 11, 12, 13, 14];
    let (mut kept, mut release) = (vec![0; 3], vec![false; 5]);
    kept_slots(&slots, &[0, 3, -1], &mut kept, &mut release);
    assert_eq!(kept, vec![10, 13, -1]);
    assert_eq!(release, vec![false, true, true, false, true]);
}

#[test]
fn sampler_matches_the_filtered_distribution() {
    // logits ln(4), ln(3), ln(2), ln(1), with temperature 1: p = .4 .3 .2 .1.
    let x: Vec<f32> = [4f32, 3.0, 2.0, 1.0].iter().map(|v| v.ln()).collect();
    let view = Logits3::new("x", &x, [1, 1, 4], [4, 4, 1]).unwrap();
    let draws = 200_000;
    let freq = |p: SamplingParams| {
        let mut c = [0f64; 4];
        for n in 0..draws {
            let key = DrawKey {
                seed: 9,
                request: 0,
                node: n,
            };
            c[sample_row(view.row(0, 0), &p, key)] += 1.0;
        }
        c.map(|v| v / draws as f64)
    };
    let close = |got: [f64; 4], want: [f64; 4]| {
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 0.006, "{got:?} vs {want:?}");
        }
    };
    close(
        freq(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
        }),
        [0.4, 0.3, 0.2, 0.1],
    );
    close(
        freq(SamplingParams {
            temperature: 1.0,
            top_k: 2,
            top_p: 1.0,
        }),
        [4.0 / 7.0, 3.0 / 7.0, 0.0, 0.0],
    );
    // top_p = 0.7: {.4} is short of .7, {.4, .3} reaches it.
    close(
        freq(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.7,
        }),
        [4.0 / 7.0, 3.0 / 7.0, 0.0, 0.0],
    );
    close(
        freq(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.71,
        }),
        [4.0 / 9.0, 3.0 / 9.0, 2.0 / 9.0, 0.0],
    );
    // Temperature 2: p ∝ sqrt(4, 3, 2, 1).
    let s: [f64; 4] = [2.0, 3f64.sqrt(), 2f64.sqrt(), 1.0];
    let tot: f64 = s.iter().sum();
    close(
        freq(SamplingParams {
            temperature: 2.0,
            top_k: 0,
            top_p: 1.0,
        }),
        s.map(|v| v / tot),
    );
    assert_eq!(
        sample_row(
            view.row(0, 0),
            &SamplingParams {
                temperature: 0.0,
                top_k: 0,
                top_p: 1.0
            },
            DrawKey {
                seed: 1,
                request: 2,
                node: 3
            }
        ),
        0
    );
}

/// Root 0 → children 1 (token 7) and 2 (token 8); node 2 → child 3 (token 9).
fn small_links() -> (Vec<i64>, Vec<i64>, Vec<i64>) {
    (vec![5, 7, 8, 9], vec![1, -1, 3, -1], vec![-1, 2, -1, -1])
}

fn walk_small(first_child: &[i64], next_sibling: &[i64], post: [i64; 4]) -> (Vec<i64>, Walked) {
    let (ids, _, _) = small_links();
    let (mut nodes, mut toks, mut idx) = (vec![0; 4], vec![0; 4], vec![0; 4]);
    let links = TreeLinks {
        verify_ids: &ids,
        first_child,
        next_sibling,
    };
    let out = AcceptOut {
        accepted_nodes: &mut nodes,
        accepted_tokens: &mut toks,
        accept_index: &mut idx,
    };
    let w = walk(links, |i| post[i], 0, out);
    (nodes, w)
}

#[test]
fn corrupt_links_give_the_root_only_walk_and_a_status() {
    let (_, fc, ns) = small_links();
    let post = [8, 0, 9, 4];
    let (nodes, w) = walk_small(&fc, &ns, post);
    assert_eq!(
        (nodes, w.accept_len, w.bonus, w.status),
        (vec![0, 2, 3, -1], 3, 4, status::OK)
    );
    // A link past Q, anywhere in the tree (here off the path), rejects the tree.
    let mut bad = fc.clone();
    bad[1] = 1_000_000_000;
    let (nodes, w) = walk_small(&bad, &ns, post);
    assert_eq!((nodes, w.accept_len, w.bonus), (vec![0, -1, -1, -1], 1, 8));
    assert_eq!(w.status, status::BAD_TREE_LINK);
    // A sibling cycle met on the walk (node 2's sibling is node 1 again).
    let mut cyc = ns.clone();
    cyc[2] = 1;
    let (nodes, w) = walk_small(&fc, &cyc, [6, 0, 9, 4]);
    assert_eq!((nodes, w.accept_len, w.bonus), (vec![0, -1, -1, -1], 1, 6));
    assert_eq!(w.status, status::BAD_TREE_LINK);
}
