//! SPEC stage 3 — verify inputs: one request's row of every `Tree` output, width `Q`.

use crate::select::Node;

/// Words of ancestor bits per node: `ceil(Q / 32)`.
pub fn mask_words(q: usize) -> usize {
    q.div_ceil(32)
}

/// One request's slices of the stage-3 outputs (each `Q` long; `ancestor_bits` is `Q * W`).
pub struct VerifyInputs<'a> {
    pub verify_ids: &'a mut [i64],
    pub positions: &'a mut [i64],
    pub depths: &'a mut [i64],
    pub parents: &'a mut [i64],
    pub first_child: &'a mut [i64],
    pub next_sibling: &'a mut [i64],
    pub ancestor_bits: &'a mut [i32],
    pub scores: &'a mut [f64],
}

impl<'a> VerifyInputs<'a> {
    /// The lengths of the slices against those `n` trees of width `q` need (name, got, want).
    pub fn lens(&self, n: usize, q: usize) -> [(&'static str, usize, usize); 8] {
        let w = mask_words(q);
        [
            ("verify_ids", self.verify_ids.len(), n * q),
            ("positions", self.positions.len(), n * q),
            ("depths", self.depths.len(), n * q),
            ("parents", self.parents.len(), n * q),
            ("first_child", self.first_child.len(), n * q),
            ("next_sibling", self.next_sibling.len(), n * q),
            ("ancestor_bits", self.ancestor_bits.len(), n * q * w),
            ("scores", self.scores.len(), n * q),
        ]
    }

    /// Splits the slices of consecutive trees of width `q` into one `VerifyInputs` per tree.
    pub fn split(self, q: usize) -> Vec<VerifyInputs<'a>> {
        let w = mask_words(q);
        let mut verify_ids = self.verify_ids.chunks_mut(q);
        let mut positions = self.positions.chunks_mut(q);
        let mut depths = self.depths.chunks_mut(q);
        let mut parents = self.parents.chunks_mut(q);
        let mut first_child = self.first_child.chunks_mut(q);
        let mut next_sibling = self.next_sibling.chunks_mut(q);
        let mut bits = self.ancestor_bits.chunks_mut(q * w);
        let mut scores = self.scores.chunks_mut(q);
        std::iter::from_fn(|| {
            Some(VerifyInputs {
                verify_ids: verify_ids.next()?,
                positions: positions.next()?,
                depths: depths.next()?,
                parents: parents.next()?,
                first_child: first_child.next()?,
                next_sibling: next_sibling.next()?,
                ancestor_bits: bits.next()?,
                scores: scores.next()?,
            })
        })
        .collect()
    }
}

/// What one request's tree is made of.
pub struct RequestTree<'a> {
    pub nodes: &'a [Node],
    /// Stage-1 token ids of this request, `[L, K]` row-major.
    pub ti: &'a [i64],
    pub k: usize,
    pub root_token: i64,
    pub prefix_len: i64,
}

/// Writes every verify input of one request; pad slots get the SPEC's pad values.
pub fn emit(tree: &RequestTree<'_>, out: &mut VerifyInputs<'_>) {
    let q = out.verify_ids.len();
    let words = mask_words(q);
    write_pads(out, tree.prefix_len, words);
    out.verify_ids[0] = tree.root_token;
    out.scores[0] = 0.0;
    for (n, node) in tree.nodes.iter().enumerate() {
        let i = n + 1;
        out.verify_ids[i] = tree.ti[(node.depth - 1) * tree.k + node.rank];
        out.depths[i] = node.depth as i64;
        out.positions[i] = tree.prefix_len + node.depth as i64;
        out.parents[i] = node.parent as i64;
        out.scores[i] = node.score;
        inherit_ancestors(out.ancestor_bits, node.parent, i, words);
    }
    link_children(tree.nodes, out.first_child, out.next_sibling);
}

/// Pad values everywhere; the root and nodes overwrite their own slots afterwards.
fn write_pads(out: &mut VerifyInputs<'_>, prefix_len: i64, words: usize) {
    out.verify_ids.fill(0);
    out.positions.fill(prefix_len);
    out.depths.fill(0);
    out.parents.fill(-1);
    out.first_child.fill(-1);
    out.next_sibling.fill(-1);
    out.scores.fill(f64::NEG_INFINITY);
    out.ancestor_bits.fill(0);
    for i in 0..out.verify_ids.len() {
        set_bit(&mut out.ancestor_bits[i * words..(i + 1) * words], i);
    }
}

/// Node `i` sees what its parent sees, plus itself (already set by `write_pads`).
fn inherit_ancestors(bits: &mut [i32], parent: usize, i: usize, words: usize) {
    for w in 0..words {
        bits[i * words + w] |= bits[parent * words + w];
    }
}

fn set_bit(row: &mut [i32], j: usize) {
    row[j / 32] |= (1u32 << (j % 32)) as i32;
}

/// First child = smallest child index; next sibling = next larger index, same parent.
/// Nodes come in index order, so a single pass that remembers each parent's last child works.
fn link_children(nodes: &[Node], first_child: &mut [i64], next_sibling: &mut [i64]) {
    let mut last_child = vec![usize::MAX; nodes.len() + 1];
    for (n, node) in nodes.iter().enumerate() {
        let i = n + 1;
        match last_child[node.parent] {
            usize::MAX => first_child[node.parent] = i as i64,
            prev => next_sibling[prev] = i as i64,
        }
        last_child[node.parent] = i;
    }
}

/// Bit `j` of row `i` of a request's ancestor bits.
pub fn sees(bits: &[i32], words: usize, i: usize, j: usize) -> bool {
    (bits[i * words + j / 32] as u32 >> (j % 32)) & 1 == 1
}

/// SGLang's flat FULL mask of one request: row-major `[Q, prefix_len + Q]`, prefix columns
/// True (written only when `write_prefix`), tree columns from the ancestor bits.
pub fn full_mask(bits: &[i32], q: usize, prefix_len: usize, write_prefix: bool, out: &mut [bool]) {
    let words = mask_words(q);
    let width = prefix_len + q;
    for i in 0..q {
        let row = &mut out[i * width..(i + 1) * width];
        if write_prefix {
            row[..prefix_len].fill(true);
        }
        for j in 0..q {
            row[prefix_len + j] = sees(bits, words, i, j);
        }
    }
}
