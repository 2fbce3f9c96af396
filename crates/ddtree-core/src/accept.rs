//! SPEC stage 4 — accept: walk the tree along the target's posterior tokens.

use crate::status;

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
    /// [`status::OK`], or [`status::BAD_TREE_LINK`] when the links were corrupt.
    pub status: i32,
}

/// A link found outside `[-1, Q)`, or a sibling chain longer than `Q` (a cycle).
struct BadLink;

/// A link read as a node index: `Ok(None)` for −1 (no node).
fn node_of(link: i64, q: usize) -> Result<Option<usize>, BadLink> {
    match link {
        -1 => Ok(None),
        l if (0..q as i64).contains(&l) => Ok(Some(l as usize)),
        _ => Err(BadLink),
    }
}

/// The child of `node` whose verify token is `token` (siblings carry distinct tokens).
fn matching_child(
    links: &TreeLinks<'_>,
    node: usize,
    token: i64,
) -> Result<Option<usize>, BadLink> {
    let q = links.first_child.len();
    let mut child = node_of(links.first_child[node], q)?;
    for _ in 0..q {
        let Some(c) = child else { return Ok(None) };
        if links.verify_ids[c] == token {
            // Nodes are numbered in best-first order: a child comes after its parent, so a
            // walk never revisits a node (and stays within Q entries).
            return if c > node { Ok(Some(c)) } else { Err(BadLink) };
        }
        child = node_of(links.next_sibling[c], q)?;
    }
    Err(BadLink)
}

/// Walks from the root while some child carries the posterior token of the current node.
/// Corrupt links — any link of the tree outside `[-1, Q)`, or a sibling cycle met on the
/// walk — give the root-only result (status [`status::BAD_TREE_LINK`], the root's
/// posterior as the bonus), as the GPU does.
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
    let q = links.first_child.len() as i64;
    let in_range = |l: &i64| (-1..q).contains(l);
    let links_ok =
        links.first_child.iter().all(in_range) && links.next_sibling.iter().all(in_range);
    let mut node = 0usize;
    let mut len = 0usize;
    loop {
        out.accepted_nodes[len] = node as i64;
        out.accepted_tokens[len] = links.verify_ids[node];
        out.accept_index[len] = row_base + node as i64;
        len += 1;
        let token = posterior(node);
        if !links_ok {
            return walked(1, token, status::BAD_TREE_LINK);
        }
        match matching_child(&links, node, token) {
            Ok(Some(child)) if len < out.accepted_nodes.len() => node = child,
            Ok(_) => return walked(len, token, status::OK),
            Err(BadLink) => {
                out.accepted_nodes[1..].fill(-1);
                out.accepted_tokens[1..].fill(-1);
                out.accept_index[1..].fill(-1);
                let root_token = if len == 1 { token } else { posterior(0) };
                return walked(1, root_token, status::BAD_TREE_LINK);
            }
        }
    }
}

fn walked(accept_len: usize, bonus: i64, status: i32) -> Walked {
    Walked {
        accept_len,
        bonus,
        status,
    }
}
