//! The fields of a round's results — a `Tree` (stages 1–3) and an `Acceptance` (stage 4) —
//! with their element type and shape, defined once: the Python package allocates and views
//! its buffers from these lists (`ddtree._buffers`), and the slices the CPU path writes have
//! the same sizes.

use crate::emit::mask_words;

/// Element type of a result field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elem {
    I64,
    I32,
    F32,
    F64,
}

impl Elem {
    /// The name torch gives the dtype (`torch.int64` → "int64").
    pub fn name(self) -> &'static str {
        match self {
            Elem::I64 => "int64",
            Elem::I32 => "int32",
            Elem::F32 => "float32",
            Elem::F64 => "float64",
        }
    }
}

/// A field: name, element type, shape.
pub type Field = (&'static str, Elem, Vec<usize>);

/// A `Tree`'s fields for `bs` requests, depth limit `depth`, `k` candidates per row and
/// budget `budget` (`Q = budget + 1`), in the order `Tree` declares them.
pub fn tree_fields(bs: usize, depth: usize, k: usize, budget: usize) -> Vec<Field> {
    let q = budget + 1;
    let i64_q = |name| (name, Elem::I64, vec![bs, q]);
    vec![
        i64_q("verify_ids"),
        i64_q("positions"),
        i64_q("depths"),
        i64_q("parents"),
        i64_q("first_child"),
        i64_q("next_sibling"),
        ("ancestor_bits", Elem::I32, vec![bs, q, mask_words(q)]),
        ("num_nodes", Elem::I64, vec![bs]),
        ("scores", Elem::F64, vec![bs, q]),
        ("topk_logprobs", Elem::F32, vec![bs, depth, k]),
        ("topk_ids", Elem::I64, vec![bs, depth, k]),
        ("status", Elem::I32, vec![bs]),
    ]
}

/// An `Acceptance`'s fields for `bs` requests and paths of `depth + 1`. The fields a
/// readback copies come first and adjacent (one copy moves them).
pub fn acceptance_fields(bs: usize, depth: usize) -> Vec<Field> {
    let path = depth + 1;
    vec![
        ("accept_len", Elem::I64, vec![bs]),
        ("bonus", Elem::I64, vec![bs]),
        ("accepted_tokens", Elem::I64, vec![bs, path]),
        ("accepted_nodes", Elem::I64, vec![bs, path]),
        ("accept_index", Elem::I64, vec![bs, path]),
        ("status", Elem::I32, vec![bs]),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn numel(f: &Field) -> usize {
        f.2.iter().product()
    }

    #[test]
    fn tree_fields_have_the_spec_shapes() {
        let f = tree_fields(3, 5, 7, 40);
        assert_eq!(f.len(), 12);
        assert_eq!(f[0], ("verify_ids", Elem::I64, vec![3, 41]));
        assert_eq!(f[6], ("ancestor_bits", Elem::I32, vec![3, 41, 2]));
        assert_eq!(numel(&f[9]), 3 * 5 * 7);
        assert_eq!(f[11].1.name(), "int32");
    }

    #[test]
    fn the_readback_fields_lead_the_acceptance() {
        let names: Vec<_> = acceptance_fields(2, 4).iter().map(|f| f.0).collect();
        assert_eq!(&names[..3], ["accept_len", "bonus", "accepted_tokens"]);
        assert_eq!(acceptance_fields(2, 4)[2].2, vec![2, 5]);
    }
}
