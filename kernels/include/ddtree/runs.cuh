// Stage 1's reads of a row in 16-byte runs (eight bf16/fp16 values, four fp32): a run is
// tested once — its maximum against the candidate floor and against the normaliser's
// "near the maximum" bound — so the common case (a run far below both) pays no per-token
// branch, and 16-bit runs are reduced as packed pairs (one instruction for two tokens).
// Every per-token result is the one the per-token code gives: the run tests only route
// tokens, and the far terms are fixed_term's bits (fixed_sum.cuh: far_term16).
#pragma once
#include "common.cuh"
#include "fixed_sum.cuh"

namespace ddtree {

// The packed pair of a 16-bit type (none for fp32: its runs are unpacked).
template <typename T> struct PairOf;
template <> struct PairOf<__nv_bfloat16> { using type = __nv_bfloat162; };
template <> struct PairOf<__half> { using type = __half2; };

template <typename T>
constexpr bool kPacked = sizeof(T) == 2;

template <typename T>
constexpr int kRun = 16 / sizeof(T);  // values in a 16-byte run

// Significant bits of a 16-bit type (the hidden bit included).
template <typename T> constexpr int kSignificand = 0;
template <> constexpr int kSignificand<__nv_bfloat16> = 8;
template <> constexpr int kSignificand<__half> = 11;

// Whether a row is read in runs: unit stride, 16-byte aligned.
template <typename T>
__device__ __forceinline__ bool reads_in_runs(const T* row, long long stride) {
  return stride == 1 && (reinterpret_cast<uintptr_t>(row) & 15) == 0;
}

// Asks L2 for runs [first, first + count) of a row of nvec runs (the part inside it): one
// bulk prefetch, no registers held while the lines come.
__device__ __forceinline__ void prefetch_runs(const uint4* vrow, int first, int count,
                                              int nvec) {
  if (first >= nvec) return;
  const int n = min(count, nvec - first);
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;"
               :
               : "l"(vrow + first), "r"(n * 16)
               : "memory");
}

// Calls run(id0, v) on every whole 16-byte run v (tokens id0 .. id0 + kRun - 1) of a row
// that reads_in_runs, kUnroll loads in flight per thread (the row is read at memory speed,
// not latency), and one(id, x) on the tokens after the last whole run. Visit order
// unspecified. Four suit a pass with work per run; a pass that only takes a maximum waits
// on memory alone and keeps eight in flight. kBatchTail: the last batch, of fewer than
// kUnroll runs a thread, is loaded at once too (predicated), not one run after another,
// each waiting a memory latency: a short row (a wide cluster block's chunk, 2.3 runs a
// thread, all in that batch) or a half block's row (5 of its 37 runs a thread in pass 1)
// paid it on every run. Pass 1 takes it; pass 2's fast loop does not (its terms' registers
// beside four more runs spilled, ptxas -v: 24 B), and loading its last runs one ahead
// instead measured slower at bs = 64 (BENCHMARKS.md session 32).
// kPrefetch: thread 0 asks L2 for the block's batch two ahead (prefetch_runs) as each
// batch starts, so the loads find it there. Taken by one_read's loop alone: stage 1 1.05x
// at bs = 64, B = 63 on the H100; in every pass it also sped up the partials 1.06x but left
// the two reads' stage 1 within 1 % and their whole build about 2 % slower (BENCHMARKS.md,
// session 41).
template <int kUnroll = 4, bool kLastRead = false, bool kBatchTail = false,
          bool kPrefetch = false, typename T, typename Run, typename One>
__device__ __forceinline__ void for_each_run(const T* __restrict__ row, int V, Run&& run,
                                             One&& one) {
  const int step = blockDim.x;
  const int nvec = V / kRun<T>;
  const uint4* vrow = reinterpret_cast<const uint4*>(row);
  // A row's last read streams (evict first): its lines are not read again, so L2 keeps
  // the rows whose second read is still to come.
  const auto load = [&](int i) { return kLastRead ? __ldcs(vrow + i) : __ldg(vrow + i); };
  int i = threadIdx.x;
  for (; i + (kUnroll - 1) * step < nvec; i += kUnroll * step) {
    if (kPrefetch && threadIdx.x == 0) {
      prefetch_runs(vrow, i + 2 * kUnroll * step, kUnroll * step, nvec);
    }
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = load(i + u * step);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) run((i + u * step) * kRun<T>, v[u]);
  }
  if constexpr (!kBatchTail) {
    for (; i < nvec; i += step) run(i * kRun<T>, load(i));
  } else if (i < nvec) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (i + u * step < nvec) v[u] = load(i + u * step);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (i + u * step < nvec) run((i + u * step) * kRun<T>, v[u]);
    }
  }
  for (int id = nvec * kRun<T> + threadIdx.x; id < V; id += step) one(id, to_f32(row[id]));
}

// for_each_run with the run's work compiled once: a loop of one run an iteration whose
// loads go out kAhead runs ahead through a window of registers. A pass whose work per run
// has rare branches (pass 2) keeps its code small this way: unrolled four times it outgrew
// the instruction cache (a third of its stall samples were instruction fetches, Nsight
// Compute, BENCHMARKS.md session 26); with those paths made calls instead, it ran 2.6
// times the far terms' instructions (the warps' lanes ran apart after a call).
template <int kAhead = 4, typename T, typename Run, typename One>
__device__ __forceinline__ void for_each_run_once(const T* __restrict__ row, int V, Run&& run,
                                                  One&& one) {
  const int step = blockDim.x;
  const int nvec = V / kRun<T>;
  const uint4* vrow = reinterpret_cast<const uint4*>(row);
  uint4 window[kAhead];
#pragma unroll
  for (int a = 0; a < kAhead; ++a) {
    const int i = threadIdx.x + a * step;
    if (i < nvec) window[a] = __ldg(vrow + i);
  }
#pragma unroll 1
  for (int i = threadIdx.x; i < nvec; i += step) {
    const uint4 v = window[0];
#pragma unroll
    for (int a = 0; a + 1 < kAhead; ++a) window[a] = window[a + 1];
    const int ahead = i + kAhead * step;
    if (ahead < nvec) window[kAhead - 1] = __ldg(vrow + ahead);
    run(i * kRun<T>, v);
  }
  for (int id = nvec * kRun<T> + threadIdx.x; id < V; id += step) one(id, to_f32(row[id]));
}

// The run's values, upcast, into x.
template <typename T>
__device__ __forceinline__ void unpack_run(const uint4& v, float (&x)[kRun<T>]) {
  const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
  for (int j = 0; j < kRun<T>; ++j) x[j] = to_f32(e[j]);
}

// unpack_run for the far terms' loop: bf16 is fp32's top half, so a word's two values are
// its bits shifted and masked, one instruction a value (the generic upcast took two for
// every odd token: a byte permute, then a shift). Only there: taken everywhere, it cost
// the clustered kernel a 4-byte spill (ptxas -v, sm_90).
template <typename T>
__device__ __forceinline__ void unpack_far(const uint4& v, float (&x)[kRun<T>]) {
  unpack_run<T>(v, x);
}
template <>
__device__ __forceinline__ void unpack_far<__nv_bfloat16>(const uint4& v, float (&x)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    x[2 * k] = __uint_as_float(w[k] << 16);
    x[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
  }
}

template <typename T>
__device__ __forceinline__ typename PairOf<T>::type pair_at(const uint4& v, int w) {
  const uint32_t word = w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w;
  return *reinterpret_cast<const typename PairOf<T>::type*>(&word);
}

// The largest values of a 16-bit run's even and odd tokens, as a pair (a NaN is passed over:
// pass 2 never sees one, and the one read's first batch only bounds the row's maximum).
template <typename T>
__device__ __forceinline__ typename PairOf<T>::type run_max2(const uint4& v) {
  return __hmax2(__hmax2(pair_at<T>(v, 0), pair_at<T>(v, 1)),
                 __hmax2(pair_at<T>(v, 2), pair_at<T>(v, 3)));
}

// run_max2 with NaN propagated: a run holding a NaN fails every `<` test.
template <typename T>
__device__ __forceinline__ typename PairOf<T>::type run_max2_nan(const uint4& v) {
  return __hmax2_nan(__hmax2_nan(pair_at<T>(v, 0), pair_at<T>(v, 1)),
                     __hmax2_nan(pair_at<T>(v, 2), pair_at<T>(v, 3)));
}

// The largest value of a 16-bit run.
template <typename T>
__device__ __forceinline__ float run_max(const uint4& v) {
  const auto p = run_max2<T>(v);
  return fmaxf(to_f32(p.x), to_f32(p.y));
}

// Whether every value of a 16-bit run has a magnitude of at least `least` (a value of the
// type, as a pair): four packed absolute values and three packed minima.
template <typename T>
__device__ __forceinline__ bool run_at_least(const uint4& v, typename PairOf<T>::type least) {
  const auto a = __hmin2(__hmin2(__habs2(pair_at<T>(v, 0)), __habs2(pair_at<T>(v, 1))),
                         __hmin2(__habs2(pair_at<T>(v, 2)), __habs2(pair_at<T>(v, 3))));
  return __hbge2(a, least);
}

// Pass 1 over a 16-bit row's runs: the largest value (NaN ignored) and a NaN-propagating
// maximum (NaN once a NaN was seen), two packed instructions a pair of tokens.
template <typename T>
struct PackedMax {
  using P = typename PairOf<T>::type;
  P max, nan_max;

  __device__ __forceinline__ PackedMax() {
    const T ninf = from_f32<T>(-INFINITY);
    max = nan_max = P{ninf, ninf};
  }

  __device__ __forceinline__ void add(const uint4& v) {
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      max = __hmax2(max, pair_at<T>(v, w));
      nan_max = __hmax2_nan(nan_max, pair_at<T>(v, w));
    }
  }

  // NaN or +inf among the runs' tokens.
  __device__ __forceinline__ bool bad() const {
    return bad_value(to_f32(nan_max.x)) || bad_value(to_f32(nan_max.y));
  }
};

// A thread's share of a row's fixed-point sum (fixed_sum.cuh).
struct TermSum {
  U128 total{0ull, 0ull};

  template <typename G>
  __device__ __forceinline__ void add(float x, float m, G grade) {
    total = add128(total, fixed_term(x, m, grade));
  }

  // A 16-bit run's terms, each fixed_term's (a run near the maximum, or any run of a
  // precise-grade row).
  template <typename T, typename G>
  __device__ __forceinline__ void add_run(const uint4& v, float m, G grade) {
    float x[kRun<T>];
    unpack_run<T>(v, x);
    U128 run{0ull, 0ull};
#pragma unroll
    for (int j = 0; j < kRun<T>; ++j) run = add128(run, fixed_term(x[j], m, grade));
    total = add128(total, run);
  }

  // A 16-bit run whose every value is 3 or more below m (kNearBelowMax), in the fast
  // grade: its terms, at most 2^47.7 units each, summed in 64 bits and carried once;
  // `exact`: every x - m is exact in fp32 (far_term16_exact), else far_term16.
  template <typename T>
  __device__ __forceinline__ void add_far(const uint4& v, float m, bool exact) {
    unsigned long long run = 0;
    float x[kRun<T>];  // unpacked in each branch: hoisted, the loop compiles differently
    if (exact) {
      unpack_far<T>(v, x);
#pragma unroll
      for (int j = 0; j < kRun<T>; ++j) run += far_term16_exact(x[j], m);
    } else {
      unpack_far<T>(v, x);
#pragma unroll
      for (int j = 0; j < kRun<T>; ++j) run += far_term16(x[j], m);
    }
    total = add128(total, U128{run, 0ull});
  }

  // A 16-bit run of an absolute-grade row whose every value is under kAbsoluteRunBelow:
  // its eight terms, each under 2^61, summed in 64 bits and carried once.
  template <typename T>
  __device__ __forceinline__ void add_absolute(const uint4& v) {
    float x[kRun<T>];
    unpack_far<T>(v, x);
    unsigned long long run = 0;
#pragma unroll
    for (int j = 0; j < kRun<T>; ++j) run += absolute_term64(x[j]);
    total = add128(total, U128{run, 0ull});
  }
};

// No sum (a part's top-K pass: partials.cuh sums the parts once the row's maximum is known).
struct NoSum {
  template <typename G>
  __device__ __forceinline__ void add(float, float, G) {}
  template <typename T, typename G>
  __device__ __forceinline__ void add_run(const uint4&, float, G) {}
  template <typename T>
  __device__ __forceinline__ void add_far(const uint4&, float, bool) {}
};

}  // namespace ddtree
