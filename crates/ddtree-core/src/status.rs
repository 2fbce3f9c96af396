//! Per-request status codes: what went wrong with one request of a batch, reported in a
//! `status` output instead of an error, because on the GPU a check of input *values* would
//! need a host sync (and inside a captured graph nothing can be raised at all). A request
//! with a nonzero code gets the documented empty result of the stage that found it; the
//! other requests of the batch are unaffected.
//!
//! One list for every layer: the kernels' `kernels/include/ddtree/status.h` holds the same
//! values (checked by this crate's tests) and the Python package exports these constants.

/// The request ran normally.
pub const OK: i32 = 0;
/// Build (stage 1): NaN or `+inf` in the request's draft logits; the tree is root-only.
pub const NON_FINITE: i32 = 1;
/// Build (GPU): the root token lies outside the vocabulary; the tree is root-only.
pub const ROOT_OUT_OF_VOCAB: i32 = 2;
/// Build (GPU): a negative prefix length; the tree is root-only.
pub const NEGATIVE_PREFIX: i32 = 3;
/// Accept (stage 4): a `first_child` / `next_sibling` link outside `[-1, Q)`, a sibling
/// chain longer than `Q` (a cycle), or a matched child whose index is not above its
/// parent's (nodes are numbered best-first, so a walk only moves forward). The walk stops
/// at the root: `accept_len` 1, the bonus drawn at the root.
pub const BAD_TREE_LINK: i32 = 4;
/// Commit (stage 5): an accepted node outside `[0, Q)` (an acceptance not made by the
/// accept). Nothing is written for the request.
pub const NODE_OUT_OF_RANGE: i32 = 5;
/// Commit (stage 5): an `out_cache_loc` slot outside `[0, slots)` of the caches. Nothing
/// is written for the request (kept slots −1, nothing released, no row moved).
pub const SLOT_OUT_OF_RANGE: i32 = 6;

/// Every code with its name, in value order (for the Python constants and the tests).
pub const ALL: [(&str, i32); 7] = [
    ("OK", OK),
    ("NON_FINITE", NON_FINITE),
    ("ROOT_OUT_OF_VOCAB", ROOT_OUT_OF_VOCAB),
    ("NEGATIVE_PREFIX", NEGATIVE_PREFIX),
    ("BAD_TREE_LINK", BAD_TREE_LINK),
    ("NODE_OUT_OF_RANGE", NODE_OUT_OF_RANGE),
    ("SLOT_OUT_OF_RANGE", SLOT_OUT_OF_RANGE),
];

#[cfg(test)]
mod tests {
    use super::ALL;

    /// The kernels' header defines the same names with the same values.
    #[test]
    fn the_kernel_header_agrees() {
        let header = include_str!("../../../kernels/include/ddtree/status.h");
        for (name, value) in ALL {
            let line = format!("kStatus{} = {value};", camel(name));
            assert!(header.contains(&line), "status.h lacks `{line}`");
        }
        assert_eq!(
            header.matches("kStatus").count(),
            ALL.len(),
            "status.h has extra codes"
        );
    }

    fn camel(name: &str) -> String {
        name.split('_')
            .map(|w| w[..1].to_string() + &w[1..].to_lowercase())
            .collect()
    }
}
