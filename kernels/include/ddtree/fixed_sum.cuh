// SPEC stage 1's normaliser sum, exp(x - max) over a row, as a fixed-point integer: each
// term rounded to a multiple of one unit and the terms added as 128-bit integers. Integer
// addition is exact and associative, so the sum does not depend on how the row is split:
// over a block's threads, over vocabulary chunks (`partials.cuh`) or over tensor-parallel
// shards, every split gives the one-block sum bit for bit, and so the same Z.
#pragma once
#include "common.cuh"

namespace ddtree {

// A row's terms are added in one of two fixed-point grades, chosen by its maximum m alone
// (the same on every part and rank, so every split still sums the same integers):
//  * fast: units of 2^-52; within 3 of the max a float64 exp, further below it an fp32
//    expf (at most 2 ulp off: 2^-22 of the term). The sum is then within 2^-22 of itself,
//    so Z within 2^-22 absolute, which is under half an ulp of Z only when |Z| >= 8.
//  * precise: units of 2^-80 and every term a float64 exp (1 ulp), as the Rust CPU path
//    sums; Z is then as accurate as SPEC's float64 reference.
// Z = m + ln(sum) with 1 <= sum <= V < 2^31, so Z lies in [m, m + 21.5): |Z| >= 8 is sure
// when m >= 8 or m <= -29.5. Rows in between (log-probabilities, small logits) are precise.
constexpr double kFastUnit = 0x1p52;
constexpr double kPreciseUnit = 0x1p80;
constexpr float kFastAtOrAbove = 8.0f;
constexpr float kFastAtOrBelow = -29.5f;

// Whether the row whose maximum is `m` sums precise terms (an all -inf row, m = 0 by its
// caller's shift, sums nothing either way).
__device__ __forceinline__ bool precise_row(float m) {
  return m < kFastAtOrAbove && m > kFastAtOrBelow;
}

struct U128 {
  unsigned long long lo, hi;
};

__device__ __forceinline__ U128 add128(U128 a, U128 b) {
  U128 r;
  r.lo = a.lo + b.lo;
  r.hi = a.hi + b.hi + (r.lo < a.lo ? 1ull : 0ull);
  return r;
}

// e in [0, 1] as a multiple of 2^-80, rounded to nearest: the high word takes e's bits
// of weight >= 2^-16 (exact: floor), the low word the rest, scaled by 2^64 (exact: a
// power of two) and rounded once.
__device__ __forceinline__ U128 precise_units(double e) {
  const double top = floor(e * 0x1p16);
  return {__double2ull_rn((e * 0x1p16 - top) * 0x1p64), static_cast<unsigned long long>(top)};
}

// One term, d = x - max <= 0 (or -inf: 0), in the row's grade.
__device__ __forceinline__ U128 fixed_term(float d, bool precise) {
  if (precise) return precise_units(exp(static_cast<double>(d)));
  if (d > -3.0f) return {__double2ull_rn(exp(static_cast<double>(d)) * kFastUnit), 0ull};
  return {__float2ull_rn(expf(d) * static_cast<float>(kFastUnit)), 0ull};
}

__device__ __forceinline__ U128 warp_sum128(U128 v) {
  for (int o = 16; o > 0; o >>= 1) {
    const U128 w{__shfl_xor_sync(0xffffffffu, v.lo, o), __shfl_xor_sync(0xffffffffu, v.hi, o)};
    v = add128(v, w);
  }
  return v;
}

// The block's total (every thread gets it); `scratch` holds 32 entries.
__device__ __forceinline__ U128 block_sum128(U128 v, U128* scratch) {
  return block_reduce(v, scratch, U128{0ull, 0ull}, warp_sum128);
}

// Z = fp32(m + ln(sum / unit)) for the fixed-point sum of a row whose maximum m is finite.
__device__ __forceinline__ float fixed_normaliser(float m, U128 sum) {
  const double total = static_cast<double>(sum.hi) * 0x1p64 + static_cast<double>(sum.lo);
  const double unit = precise_row(m) ? kPreciseUnit : kFastUnit;
  return static_cast<float>(static_cast<double>(m) + log(total / unit));
}

}  // namespace ddtree
