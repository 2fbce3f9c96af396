// SPEC stage 1's normaliser sum, exp(x - max) over a row, as a fixed-point integer: each
// term rounded to a multiple of one unit and the terms added as 128-bit integers. Integer
// addition is exact and associative, so the sum does not depend on how the row is split:
// over a block's threads, over vocabulary chunks (`partials.cuh`) or over tensor-parallel
// shards, every split gives the one-block sum bit for bit, and so the same Z.
#pragma once
#include "common.cuh"

namespace ddtree {

// A row's terms are added in one of three fixed-point grades, chosen by its maximum m
// alone (the same on every part and rank, so every split still sums the same integers):
//  * absolute, where m is in [kAbsoluteFrom, kAbsoluteTo]: units of 2^-48 of e^0, not of
//    e^m, so a term needs no maximum and the row is summed in its one read (candidates.cuh:
//    one_read); each term the hardware ex2 of a reduced argument (exp_units), above
//    kAbsoluteExpAbove a float64 exp. Each term is within 1.09 * 2^-22 of itself plus half a
//    unit; V < 2^31 halves are under 2^-18 / e^m <= 0.04 * 2^-22 of the sum (at least
//    e^m * 2^48: the maximum's term), so Z is within 1.13 * 2^-22 absolute, under 0.6 of an
//    ulp (|Z| >= m >= 6: an ulp is at least 2^-21). The sum stays under 2^128: V e^33 2^48
//    < 2^127.
//  * fast: units of 2^-52; within 3 of the max a float64 exp, further below it an fp32
//    exp of our own (exp_units) with the fp32 subtraction's rounding error folded back in.
//    Each term is then within 1.34 * 2^-22 of itself plus half a unit, and the terms at or
//    below kZeroAtOrBelow, dropped, add under e^-40 each; the sum is at least 1 (the
//    maximum's term), so for V < 2^30 the sum is within 0.47 * 2^-20 of itself,
//    relatively, and Z within 0.47 * 2^-20 absolute. Under one ulp of Z wherever |Z| >= 4
//    (an ulp there is at least 2^-21): then fp32(Z) is at most one ulp from the
//    reference's, the most SPEC allows.
//  * precise: units of 2^-80 and every term a float64 exp (1 ulp), as the Rust CPU path
//    sums; Z is then as accurate as SPEC's float64 reference.
// Z = m + ln(sum) with 1 <= sum <= V < 2^31, so Z lies in [m, m + 21.5): |Z| >= 4 is sure
// when m >= 4 or m <= -25.5. Rows in between (log-probabilities, small logits) are precise.
// (Sessions before 30 asked for half an ulp, |Z| >= 8: rows with maxima in [4, 8) summed
// float64 terms, about four times the fast grade's time a token.)
// In the relative grades the exponent x - m is taken exactly: in fp32 it rounds by up to
// 2^-24 |x - m|, an error every token of a tied row repeats, which would put Z ulps away;
// the absolute grade's x log2(e) is a float pair's product, exact to 2^-25.
constexpr int kFastUnitBits = 52;  // exp_units adds it to its result's exponent
constexpr double kFastUnit = static_cast<double>(1ull << kFastUnitBits);
constexpr double kPreciseUnit = 0x1p80;
constexpr float kFastAtOrAbove = 4.0f;
constexpr float kFastAtOrBelow = -25.5f;
// The absolute grade: its unit, its rows' maxima, and the terms it takes in float64 (above
// it, e^x * 2^48 may pass 2^64). Every term of a run under kAbsoluteRunBelow is under 2^61,
// so a run of eight sums in 64 bits.
constexpr int kAbsoluteUnitBits = 48;
constexpr double kAbsoluteUnit = static_cast<double>(1ull << kAbsoluteUnitBits);
constexpr float kAbsoluteFrom = 6.0f;
constexpr float kAbsoluteTo = 33.0f;
constexpr float kAbsoluteExpAbove = 11.0f;
constexpr float kAbsoluteRunBelow = 9.0f;

// The grades as types, so that a loop over a row is compiled once for each.
struct Fast {};
struct Precise {};
struct Absolute {};
template <typename G>
constexpr bool kFastGrade = false;
template <>
constexpr bool kFastGrade<Fast> = true;

// In the fast grade, a term within 3 of the maximum (d > kNearBelowMax) is a float64 exp,
// and a term at or below kZeroAtOrBelow is 0 (under half a unit).
constexpr float kNearBelowMax = -3.0f;
constexpr float kZeroAtOrBelow = -40.0f;

// Whether the row whose maximum is `m` sums precise terms (an all -inf row, m = 0 by its
// caller's shift, sums nothing either way).
__device__ __forceinline__ bool precise_row(float m) {
  return m < kFastAtOrAbove && m > kFastAtOrBelow;
}

// Whether the row whose maximum is `m` sums absolute terms (NaN: no).
__device__ __forceinline__ bool absolute_row(float m) {
  return m >= kAbsoluteFrom && m <= kAbsoluteTo;
}

// f(Precise{}) or f(Fast{}), the relative grade of the row whose maximum is `m` (one
// outside the absolute grade's).
template <typename F>
__device__ __forceinline__ void with_relative_grade(float m, F&& f) {
  if (precise_row(m)) {
    f(Precise{});
  } else {
    f(Fast{});
  }
}

// f(grade) for the grade of the row whose maximum is `m`: a loop over the row inside f is
// compiled once per grade.
template <typename F>
__device__ __forceinline__ void with_grade(float m, F&& f) {
  if (absolute_row(m)) {
    f(Absolute{});
  } else {
    with_relative_grade(m, f);
  }
}

struct U128 {
  unsigned long long lo, hi;
};

// One carry chain (add.cc / addc: four 32-bit adds in SASS). Written as a compare of the
// low words, the carry cost a compare, a select and two more adds: about nine instructions
// for every run of pass 2's fast loop, a twelfth of its instructions.
__device__ __forceinline__ U128 add128(U128 a, U128 b) {
  U128 r;
  asm("add.cc.u64 %0, %2, %4;\n\taddc.u64 %1, %3, %5;"
      : "=l"(r.lo), "=l"(r.hi)
      : "l"(a.lo), "l"(a.hi), "l"(b.lo), "l"(b.hi));
  return r;
}

// e in [0, 1] as a multiple of 2^-80, rounded to nearest: the high word takes e's bits
// of weight >= 2^-16 (exact: floor), the low word the rest, scaled by 2^64 (exact: a
// power of two) and rounded once.
__device__ __forceinline__ U128 precise_units(double e) {
  const double top = floor(e * 0x1p16);
  return {__double2ull_rn((e * 0x1p16 - top) * 0x1p64), static_cast<unsigned long long>(top)};
}

// The rounding error of d = fp32(x - m): x - m = d + error exactly (Knuth's TwoSum; no
// products, so no contraction into fma can change it).
__device__ __forceinline__ float two_diff_error(float x, float m, float d) {
  const float bb = d - x;
  return (x - (d - bb)) + (-m - bb);
}

// exp(x - m), x <= m (or -inf: 0), as a multiple of the grade's unit.
__device__ __forceinline__ U128 fixed_term(float x, float m, Precise) {
  const double exact = static_cast<double>(x) - static_cast<double>(m);  // exact in float64
  return exact > -60.0 ? precise_units(exp(exact)) : U128{0ull, 0ull};
}

// e^d * 2^kBits (kFastUnitBits: d <= -3, the fast grade's far terms; kAbsoluteUnitBits:
// d = x <= kAbsoluteExpAbove, the absolute grade's), from the special-function unit's ex2
// (2 ulp, as CUDA documents exp2f) of a reduced argument: j = d log2(e) rounded to an
// integer, f = d log2(e) - j in [-1/2, 1/2] by two fmas with log2(e) as a float pair
// (each rounds by at most 2^-26: 0.09 * 2^-22 relatively once raised), and 2^(j + kBits)
// added to ex2(f)'s exponent field as an integer. So each term is within 1.09 * 2^-22
// of e^d * 2^kBits. Below -64, d is taken as -64: 2^(j + kBits) stays a normal float, and
// a term there, like every fast term at or below kZeroAtOrBelow, is under half a unit
// (0.02 and 2^-44), which rounds to 0. It replaced CUDA's expf bit for bit (sessions
// 30-33): one instruction fewer a token, and two constants a run no longer rebuilt
// (102 -> 93 SASS instructions a far run of eight, sm_90); the far terms are most of
// stage 1's.
template <int kBits = kFastUnitBits>
__device__ __forceinline__ float exp_units(float d) {
  constexpr float kMagic = 12582912.0f + kBits;  // 1.5 * 2^23 + kBits
  const float c = fmaxf(d, -64.0f);
  const float jm = __fmaf_rn(c, 0x1.715476p+0f, kMagic);  // kMagic + j: j in its low bits
  const float j = __fadd_rn(jm, -kMagic);
  const float f = __fmaf_rn(c, 0x1.4ae0c0p-26f, __fmaf_rn(c, 0x1.715476p+0f, -j));
  float e;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(f));
  // jm's low bits are kBits + j (mod 2^9 once shifted: 0x400000 << 23 leaves the word).
  return __uint_as_float(__float_as_uint(e) + (__float_as_uint(jm) << 23));
}

// The absolute grade's term of x <= kAbsoluteExpAbove: e^x * 2^48 to the nearest integer,
// under 2^64.
__device__ __forceinline__ unsigned long long absolute_term64(float x) {
  return __float2ull_rn(exp_units<kAbsoluteUnitBits>(x));
}

// The absolute grade's term of any x (not NaN, not +inf; the maximum is not needed). Above
// kAbsoluteExpAbove a float64 exp, split exactly into two words (the low word is a multiple
// of the float64's ulp there, 2^11 or more, and below 2^64).
__device__ __forceinline__ U128 fixed_term(float x, float, Absolute) {
  if (x <= kAbsoluteExpAbove) return {absolute_term64(x), 0ull};
  const double e = exp(static_cast<double>(x)) * kAbsoluteUnit;
  const double top = floor(e * 0x1p-64);
  return {__double2ull_rn(e - top * 0x1p64), static_cast<unsigned long long>(top)};
}

__device__ __forceinline__ U128 fixed_term(float x, float m, Fast) {
  const float d = x - m;
  if (d > kNearBelowMax) {
    const double exact = static_cast<double>(x) - static_cast<double>(m);
    return {__double2ull_rn(exp(exact) * kFastUnit), 0ull};
  }
  if (!(d > kZeroAtOrBelow)) return {0ull, 0ull};  // under half a unit (and -inf)
  const float err = two_diff_error(x, m, d);
  const float t = exp_units(d);
  return {__float2ull_rn(fmaf(t, err, t)), 0ull};
}

// fixed_term(x, m, Fast{}).lo for a bf16 or fp16 value x with fp32(x - m) <= -3, in fewer
// instructions and no branch, bit for bit:
//  * the subtraction's error by Fast2Sum, x - (d + m) (2 adds for TwoSum's 5). Fast2Sum is
//    exact when |m| >= |x|. Otherwise x < -|m| and, in the fast grade (|m| >= 4), d itself
//    is exact (then both give 0) unless x's exponent exceeds m's by 16 (bf16; 13 for fp16),
//    where d < -2^15 * 4 and the term is 0 anyway.
//  * the term at or below kZeroAtOrBelow selected to 0 after it is computed, where
//    fixed_term returns early (a -inf x makes the error NaN, which the select drops).
__device__ __forceinline__ unsigned long long far_term16(float x, float m) {
  const float d = x - m;
  const float err = x - (d + m);
  const float t = exp_units(d);
  const float units = fmaf(t, err, t);
  return __float2ull_rn(d > kZeroAtOrBelow ? units : 0.0f);
}

// far_term16 where fp32(x - m) is exact (then d + m is x, the error 0 and fmaf(t, 0, t) is
// t), in 3 fewer instructions and no select: at or below kZeroAtOrBelow, and for -inf, the
// units are under one half (e^-40 * 2^52 < 0.02), which rounds to the select's 0.
__device__ __forceinline__ unsigned long long far_term16_exact(float x, float m) {
  return __float2ull_rn(exp_units(x - m));
}

// A magnitude from which every value x of a 16-bit type (P significant bits) whose term
// counts (x - m > -40) has an exact fp32 difference with m (m's exponent e, |m| >= 4):
// 2^(e - (21 - P)). Such a difference is under 40 < 2^(e + 4) in size and a multiple of
// the smaller operand's unit, 2^(e' - P + 1) for x's exponent e' < e (m's own, 2^(e - P + 1),
// when e' >= e): at most e - e' + P + 3 <= 24 significant bits, as many as fp32 holds
// (e = 2, |m| in [4, 8), is the one exponent that needs the 24th). A run with a value below
// it (zero included) takes far_term16; a difference of -40 or less rounds to a difference
// of -40 or less either way, whose term both give as 0.
template <int P>
__device__ __forceinline__ float exact_from(float m) {
  const int e = static_cast<int>((__float_as_uint(m) >> 23) & 0xffu) - 127;
  return __uint_as_float(static_cast<uint32_t>(e - (21 - P) + 127) << 23);
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

// Z = fp32(m + ln(sum / unit)) for the fixed-point sum of a row whose maximum m is finite
// (fp32(ln(sum / unit)) in the absolute grade, whose unit is of e^0).
__device__ __forceinline__ float fixed_normaliser(float m, U128 sum) {
  const double total = static_cast<double>(sum.hi) * 0x1p64 + static_cast<double>(sum.lo);
  if (absolute_row(m)) return static_cast<float>(log(total / kAbsoluteUnit));
  const double unit = precise_row(m) ? kPreciseUnit : kFastUnit;
  return static_cast<float>(static_cast<double>(m) + log(total / unit));
}

}  // namespace ddtree
