// SPEC stage 1's normaliser sum, exp(x - max) over a row, as a fixed-point integer: each
// term rounded to a multiple of 2^-52 and the terms added as 128-bit integers. Integer
// addition is exact and associative, so the sum does not depend on how the row is split:
// over a block's threads, over vocabulary chunks (`partials.cuh`) or over tensor-parallel
// shards, every split gives the one-block sum bit for bit, and so the same Z.
#pragma once
#include "common.cuh"

namespace ddtree {

// Terms are at most 1: at most 2^52 units each. (The Rust CPU path sums in units of 2^-80;
// each path is within SPEC's ulp of Z, but their sums are not interchangeable.)
constexpr double kSumUnit = 0x1p52;

struct U128 {
  unsigned long long lo, hi;
};

__device__ __forceinline__ U128 add128(U128 a, U128 b) {
  U128 r;
  r.lo = a.lo + b.lo;
  r.hi = a.hi + b.hi + (r.lo < a.lo ? 1ull : 0ull);
  return r;
}

// One term, d = x - max <= 0 (or -inf: 0). Near the max in float64; further than 3 below it
// in fp32, as the float64 sum this replaced did (each such term is under 5 % of the largest,
// and fp32 keeps it to 2^-23 of itself, far below an fp32 ulp of Z).
__device__ __forceinline__ U128 fixed_term(float d) {
  if (d > -3.0f) return {__double2ull_rn(exp(static_cast<double>(d)) * kSumUnit), 0ull};
  return {__float2ull_rn(expf(d) * static_cast<float>(kSumUnit)), 0ull};
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

// Z = fp32(m + ln(sum / 2^52)) for the fixed-point sum of a row whose maximum m is finite.
__device__ __forceinline__ float fixed_normaliser(float m, U128 sum) {
  const double total = static_cast<double>(sum.hi) * 0x1p64 + static_cast<double>(sum.lo);
  return static_cast<float>(static_cast<double>(m) + log(total / kSumUnit));
}

}  // namespace ddtree
