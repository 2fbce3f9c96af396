//! SPEC stage 4 — accept: walk the tree along the target's posterior tokens.

/// The tree links the walk needs (one request, each `Q` long).
#[derive(Clone, Copy)]
pub struct TreeLinks<'a> {
    pub verify_ids: &'a [i64],
    pub first_child: &'a [i64],
    pub next_sibling: &'a [i64],
}

/// One request's accept outputs (each `L + 1` long).
pub struct AcceptOut<'a> {
    pub accepted_nodes: &'a mut [i64],
    pub accepted_tokens: &'a mut [i64],
    pub accept_index: &'a mut [i64],
}

/// The walk's result besides the path written into [`AcceptOut`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Walked {
    pub accept_len: usize,
    pub bonus: i64,
}

/// The child of `node` whose verify token is `token` (siblings carry distinct tokens).
fn matching_child(links: &TreeLinks<'_>, node: usize, token: i64) -> Option<usize> {
    let mut child = links.first_child[node];
    while child >= 0 {
        let c = child as usize;
        if links.verify_ids[c] == token {
            return Some(c);
        }
        child = links.next_sibling[c];
    }
    None
}

/// Walks from the root while some child carries the posterior token of the current node.
///
/// `posterior(node)` is asked once per visited node, so a caller can compute it lazily
/// (the greedy argmax of one target row) or look it up (tokens sampled beforehand).
/// `row_base` is `b * Q`, for SGLang's `accept_index`.
pub fn walk(
    links: TreeLinks<'_>,
    mut posterior: impl FnMut(usize) -> i64,
    row_base: i64,
    out: AcceptOut<'_>,
) -> Walked {
    out.accepted_nodes.fill(-1);
    out.accepted_tokens.fill(-1);
    out.accept_index.fill(-1);
    let mut node = 0usize;
    let mut len = 0usize;
    loop {
        out.accepted_nodes[len] = node as i64;
        out.accepted_tokens[len] = links.verify_ids[node];
        out.accept_index[len] = row_base + node as i64;
        len += 1;
        let token = posterior(node);
        match matching_child(&links, node, token) {
            Some(child) if len < out.accepted_nodes.len() => node = child,
            _ => {
                return Walked {
                    accept_len: len,
                    bonus: token,
                }
            }
        }
    }
}
