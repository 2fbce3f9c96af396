//! Read-only strided views of logits, in bf16, fp16 or fp32, upcast to fp32 on read.
//!
//! Logits arrive as `[rows_a, rows_b, V]` tensors that may be strided views (for example
//! `hidden[:, 1:, :] @ W.T` or a slice of a larger buffer), so every access goes through
//! element strides; the common unit-stride vocabulary takes a slice fast path.

use crate::error::{ensure, Result};
use half::{bf16, f16};

/// A logit element type that upcasts exactly to fp32.
pub trait Element: Copy + Send + Sync + 'static {
    fn to_f32(self) -> f32;
}

impl Element for f32 {
    #[inline]
    fn to_f32(self) -> f32 {
        self
    }
}

impl Element for f16 {
    #[inline]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
}

impl Element for bf16 {
    #[inline]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
}

/// A `[shape[0], shape[1], shape[2]]` tensor over `data` with element strides.
#[derive(Clone, Copy)]
pub struct Logits3<'a, T> {
    data: &'a [T],
    shape: [usize; 3],
    strides: [usize; 3],
}

impl<'a, T: Element> Logits3<'a, T> {
    /// Checks that every index of `shape` lands inside `data`.
    pub fn new(
        arg: &'static str,
        data: &'a [T],
        shape: [usize; 3],
        strides: [usize; 3],
    ) -> Result<Self> {
        ensure(shape.iter().all(|&n| n > 0), arg, || {
            format!("every dimension must be non-empty, got shape {shape:?}")
        })?;
        let last: usize = (0..3).map(|i| (shape[i] - 1) * strides[i]).sum();
        ensure(last < data.len(), arg, || {
            format!(
                "shape {shape:?} with strides {strides:?} reaches element {last}, \
                 past the {} elements given",
                data.len()
            )
        })?;
        Ok(Self {
            data,
            shape,
            strides,
        })
    }

    pub fn shape(&self) -> [usize; 3] {
        self.shape
    }

    /// Row `(i, j)`: the `shape[2]` values along the last axis.
    pub fn row(&self, i: usize, j: usize) -> Row<'a, T> {
        let base = i * self.strides[0] + j * self.strides[1];
        Row {
            data: self.data,
            base,
            stride: self.strides[2],
            len: self.shape[2],
        }
    }
}

/// One row of logits (one distribution over the vocabulary).
#[derive(Clone, Copy)]
pub struct Row<'a, T> {
    data: &'a [T],
    base: usize,
    stride: usize,
    len: usize,
}

impl<T: Element> Row<'_, T> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Calls `f(token_id, value)` for every token in id order.
    #[inline]
    pub fn for_each(&self, mut f: impl FnMut(usize, f32)) {
        if self.stride == 1 {
            let slice = &self.data[self.base..self.base + self.len];
            for (id, x) in slice.iter().enumerate() {
                f(id, x.to_f32());
            }
        } else {
            for id in 0..self.len {
                f(id, self.data[self.base + id * self.stride].to_f32());
            }
        }
    }

    /// Greedy posterior: the first (lowest-id) maximum; NaN counts as `-inf`, so a row with
    /// no value above `-inf` answers token 0.
    pub fn argmax(&self) -> usize {
        let mut best = (0usize, f32::NEG_INFINITY);
        self.for_each(|id, x| {
            if x > best.1 {
                best = (id, x);
            }
        });
        best.0
    }
}
