//! SGLang's flat FULL mask for a batch, from the ancestor bits.

use crate::emit::mask_words;
use crate::error::{ensure, Result};
use rayon::prelude::*;

/// SGLang's flat FULL mask for a batch: request b's `[Q, P_b + Q]` block follows request
/// b-1's; prefix columns are written only when `write_prefix`. Returns the mask's length
/// (the rest of `out` is left untouched).
pub fn full_masks(
    ancestor_bits: &[i32],
    q: usize,
    prefix_lens: &[i64],
    write_prefix: bool,
    out: &mut [bool],
) -> Result<usize> {
    let words = mask_words(q);
    let bs = prefix_lens.len();
    ensure(ancestor_bits.len() == bs * q * words, "seq_lens", || {
        format!(
            "has {bs} entries, the tree has {} requests",
            ancestor_bits.len() / (q * words).max(1)
        )
    })?;
    ensure(prefix_lens.iter().all(|&p| p >= 0), "seq_lens", || {
        "must be ≥ 0".into()
    })?;
    let total: usize = prefix_lens.iter().map(|&p| q * (p as usize + q)).sum();
    ensure(out.len() >= total, "out", || {
        format!("holds {} elements, the mask needs {total}", out.len())
    })?;
    let mut blocks = Vec::with_capacity(bs);
    let mut rest = &mut out[..total];
    for &p in prefix_lens {
        let (block, tail) = rest.split_at_mut(q * (p as usize + q));
        blocks.push((p as usize, block));
        rest = tail;
    }
    blocks
        .into_par_iter()
        .enumerate()
        .for_each(|(b, (p, block))| {
            let bits = &ancestor_bits[b * q * words..(b + 1) * q * words];
            crate::emit::full_mask(bits, q, p, write_prefix, block);
        });
    Ok(total)
}
