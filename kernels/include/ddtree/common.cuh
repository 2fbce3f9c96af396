// Shared device helpers: dtype upcast, order-preserving keys, warp/block reductions.
#pragma once
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "status.h"

namespace ddtree {

constexpr int kWarp = 32;

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// x rounded up and down to a 16-bit type.
template <typename T>
__device__ __forceinline__ T from_f32_up(float x);
template <>
__device__ __forceinline__ __half from_f32_up<__half>(float x) { return __float2half_ru(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32_up<__nv_bfloat16>(float x) {
  return __float2bfloat16_ru(x);
}
template <typename T>
__device__ __forceinline__ T from_f32_down(float x);
template <>
__device__ __forceinline__ __half from_f32_down<__half>(float x) { return __float2half_rd(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32_down<__nv_bfloat16>(float x) {
  return __float2bfloat16_rd(x);
}

// Significant high bits of an fp32 key for each input dtype: the low bits of an upcast
// bf16 (16) or fp16 (13 mantissa bits) value are zero, so the radix select can stop early.
template <typename T> struct KeyBits { static constexpr int value = 32; };
template <> struct KeyBits<__nv_bfloat16> { static constexpr int value = 16; };
template <> struct KeyBits<__half> { static constexpr int value = 19; };

// NaN or +inf: a value that rejects its row (SPEC stage 1).
__device__ __forceinline__ bool bad_value(float x) { return isnan(x) || x == INFINITY; }

// Larger float -> larger key; -0.0 and 0.0 share a key (they tie, SPEC: ties by id).
__device__ __forceinline__ uint32_t float_key(float x) {
  if (x == 0.0f) x = 0.0f;
  uint32_t u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ uint32_t neg_inf_key() { return float_key(-INFINITY); }

// float_key inverted (-0.0 comes back as 0.0).
__device__ __forceinline__ float float_of_key(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// The value whose float_key is k, except a zero: -0.0 and 0.0 share that key, so it is
// looked up (`lookup()`, the value itself) by a caller that must keep its sign.
template <typename F>
__device__ __forceinline__ float key_value_or(uint32_t k, F&& lookup) {
  return k == float_key(0.0f) ? lookup() : float_of_key(k);
}

// Larger double -> larger key (scores are never NaN); -0.0 and 0.0 share a key.
__device__ __forceinline__ uint64_t double_key(double x) {
  if (x == 0.0) x = 0.0;
  uint64_t u = static_cast<uint64_t>(__double_as_longlong(x));
  return (u >> 63) ? ~u : (u | 0x8000000000000000ull);
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The sum over the warp's 32 lanes (int, uint64_t, double), in a fixed order.
template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ int warp_or(int v) { return __any_sync(0xffffffffu, v) ? 1 : 0; }

// Block-wide reduction for blockDim.x a multiple of 32 (<= 1024): reduce each warp, the
// warps' results through `scratch` (32 slots), then once more. `identity` pads the slots of
// absent warps.
template <typename T, typename WarpOp>
__device__ __forceinline__ T block_reduce(T v, T* scratch, T identity, WarpOp warp_op) {
  v = warp_op(v);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / kWarp;
  return warp_op(lane < warps ? scratch[lane] : identity);
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
  return block_reduce(v, scratch, -INFINITY, warp_max);
}

__device__ __forceinline__ double block_sum(double v, double* scratch) {
  return block_reduce(v, scratch, 0.0, warp_sum<double>);
}

__device__ __forceinline__ int block_any(int v, int* scratch) {
  return block_reduce(v, scratch, 0, warp_or);
}

// Inclusive prefix sum over the warp's lanes (lane order); every lane takes part.
__device__ __forceinline__ int warp_inclusive_scan(int v) {
  const int lane = threadIdx.x % kWarp;
  for (int o = 1; o < kWarp; o <<= 1) {
    const int n = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += n;
  }
  return v;
}

// Inclusive prefix sum over the block (thread order); `scratch` holds 32 ints.
// Returns the inclusive sum; *total receives the block total.
__device__ __forceinline__ int block_inclusive_scan(int v, int* scratch, int* total) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  v = warp_inclusive_scan(v);
  __syncthreads();
  if (lane == kWarp - 1) scratch[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / kWarp;
  const int w = warp_inclusive_scan(lane < warps ? scratch[lane] : 0);
  // w (in lane i) = sum of warps 0..i.
  const int before = warp > 0 ? __shfl_sync(0xffffffffu, w, warp - 1) : 0;
  *total = __shfl_sync(0xffffffffu, w, warps - 1);
  return v + before;
}

// One step of an 8-bit radix select, run by the 32 lanes of one warp: over 256 digit bins
// taken highest digit first, the digit at which the running total first reaches `need`
// (>= 1), and the total in the higher digits, stored by the one lane that finds it. When
// rounding left `need` above every bin's total (fixed-point weights only; never for counts),
// the lowest nonempty digit, with nothing before it.
template <typename T>
__device__ void warp_crossing_digit(const T* hist, T need, int* digit_out, T* before_out) {
  const int lane = threadIdx.x % kWarp;  // lane l holds digits 255-8l down to 248-8l
  T sum = 0;
  for (int i = 0; i < 8; ++i) sum += hist[255 - 8 * lane - i];
  T incl = sum;
  for (int o = 1; o < kWarp; o <<= 1) {
    const T v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  T run = incl - sum;  // the total in higher digits than this lane's
  int found = -1;
  T before = 0;
  for (int i = 0; i < 8; ++i) {
    const int digit = 255 - 8 * lane - i;
    const T h = hist[digit];
    if (found < 0 && run < need && need <= run + h) {
      found = digit;
      before = run;
    }
    run += h;
  }
  const unsigned has = __ballot_sync(0xffffffffu, found >= 0);
  if (has != 0 && lane == __ffs(has) - 1) {
    *digit_out = found;
    *before_out = before;
  }
  if (has == 0 && lane == 0) {
    int last = 0;
    for (int d = 0; d < 256; ++d)
      if (hist[d] > 0) {
        last = d;
        break;
      }
    *digit_out = last;
    *before_out = 0;
  }
}

}  // namespace ddtree
