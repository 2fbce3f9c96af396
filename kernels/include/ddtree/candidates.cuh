// SPEC stage 1 — candidates per depth: per (request, depth) row, the top-K tokens in
// (value desc, id asc) order and the fp32 logsumexp, straight from bf16/fp16/fp32 logits.
//
// One block per row. A row whose maximum puts its normaliser in the absolute grade
// (fixed_sum.cuh: most logits) is read once (one_read: 16-bit rows, K <= kOneReadMaxK),
// other rows twice; a one_read row read a second time (its queue overflowed, or its
// maximum is outside that grade) can be read a third where that pass's queue overflows too.
//   pass 1: NaN/+inf check, the row max, and each thread's two maxima (of its even and of
//           its odd tokens);
//   pass 2: the fixed-point sum (fixed_sum.cuh: of exp(x - max), or of exp(x) in the
//           absolute grade), and every token at or above the K-th largest of those maxima
//           (a lower bound of the row's K-th largest) into shared memory, where the top K
//           are kept (select_kept): up to a few hundred such tokens are ranked directly,
//           in rank order at once; more go through a radix select on (key, id) and a
//           sort.
// `top_k_pass` is those reads for any run of tokens: partials.cuh runs it on chunks.
// When too many tokens tie for shared memory, radix_select_row takes over: 12-bit digit
// histograms over the whole row, then the tied tokens by id (an id-ordered block scan).
// A sort of the K (key, id) pairs, where one is needed, is by rank when K is small, else
// by a bitonic network. Aligned unit-stride 16-bit rows are read in 16-byte runs (runs.cuh).
#pragma once
#include <cstddef>
#include <type_traits>

#include "common.cuh"
#include "fixed_sum.cuh"
#include "runs.cuh"

namespace ddtree {

constexpr int kCandThreads = 1024;
constexpr int kDigitBits = 12;
constexpr int kBins = 1 << kDigitBits;
constexpr int kMaxK = 1024;

constexpr int kTieCap = 8192;  // tokens selected among in shared memory
constexpr int kSmallBins = 256;
// Runs a loop queues for after it (fast_runs, absolute_runs): at most this many a block.
// Past it, fast_runs does the rest at once, out of line; absolute_runs queues nothing more
// and its pass is read again.
constexpr int kDeferCap = 2048;

struct CandShared {
  union {
    uint32_t hist[kBins];    // digit histograms over the row
    uint64_t ties[kTieCap];  // (key, id) of the tokens in the threshold bin, once it is known
  };
  uint64_t cand[kMaxK];  // (key << 32) | (0xffffffff - id): larger = ranked earlier
  uint32_t small_hist[kSmallBins];
  int deferred[kDeferCap];  // each queued run's first token (~it for a run queued whole)
  float fscratch[32];
  double dscratch[32];
  U128 uscratch[32];
  int iscratch[32];
  int count;      // candidates collected so far
  int tie_count;  // entries in ties
  int defer_count;  // runs a loop queued for after it (may exceed kDeferCap)
  int whole_count;  // of those, the absolute loop's runs queued whole (values of 9 or more)
  uint32_t top_key;  // kth_largest_thread_key's largest key, where asked for
  int sel_bin;    // threshold bin of the current digit
  int sel_above;  // tokens in bins above it
  uint32_t kth_above;  // warp_crossing_digit's count: entries in digits above the chosen one
#ifdef DDTREE_STAGE1_CLOCKS
  long long* clock_at;  // this row's kPhaseSlots diagnostics slots, or null
#endif
};

static_assert(offsetof(CandShared, ties) % 16 == 0 && offsetof(CandShared, cand) % 16 == 0,
              "rank_top reads its entries in 16-byte pairs");

// Dynamic shared memory every candidates launch asks for (launch.rs: CANDIDATE_SMEM).
constexpr int kCandSmem = 88 * 1024;
static_assert(sizeof(CandShared) <= kCandSmem, "CandShared outgrew its launch size");

// Diagnostics build only (DDTREE_STAGE1_CLOCKS, bench_gpu.py's stage-1 phases): thread 0
// stamps clock64 as a row passes each phase's end, so the bench can say where a row's
// cycles go. Without the macro mark_phase is empty and the kernels are the release ones.
enum CandPhase {
  kPhaseStart,        // the block begins
  kPhaseFirstFloor,   // one_read: the first batch's floor
  kPhaseOneRead,      // one_read: its loop and its queue
  kPhaseReduce,       // one_read: NaN / +inf and the maximum, block-wide
  kPhaseRowFloor,     // one_read: the whole row's floor
  kPhaseKeep,         // one_read: kept tokens under that floor dropped
  kPhaseSecondRead,   // one_read's second read (a relative-grade row or an overflow)
  kPhaseMaxPass,      // two_reads: pass 1 and its reductions
  kPhaseFloor,        // two_reads: the floor
  kPhaseSumCollect,   // two_reads: pass 2
  kPhaseSelect,       // the K kept tokens in rank order
  kPhaseNormaliser,   // the block's sum and Z
  kPhaseWrite,        // the row's outputs
  kPhaseStartNs,      // %globaltimer at the start (ns; comparable across SMs)
  kPhaseEndNs,        // %globaltimer at the end
  kPhaseSm,           // the SM the block ran on
  kPhaseSlots
};

__device__ __forceinline__ void mark_phase(CandShared& s, int phase) {
#ifdef DDTREE_STAGE1_CLOCKS
  if (s.clock_at != nullptr && threadIdx.x == 0) {
    s.clock_at[phase] = clock64();
    if (phase == kPhaseStart || phase == kPhaseWrite) {
      unsigned long long ns;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
      s.clock_at[phase == kPhaseStart ? kPhaseStartNs : kPhaseEndNs] = static_cast<long long>(ns);
    }
    if (phase == kPhaseStart) {
      unsigned sm;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
      s.clock_at[kPhaseSm] = sm;
    }
  }
#else
  (void)s;
  (void)phase;
#endif
}

// Points the block's marks at `slots` (null: none); a no-op without the macro. Every kernel
// with a CandShared calls it first: in the diagnostics build a mark through a pointer left
// unset (shared memory is not zeroed) writes anywhere. (A helper that also made the cast
// changed the release build's code: ptxas emitted 10 % less of it, untimed.)
__device__ __forceinline__ void set_phase_clocks(CandShared& s, long long* slots) {
#ifdef DDTREE_STAGE1_CLOCKS
  if (threadIdx.x == 0) s.clock_at = slots;  // thread 0 alone reads it: no barrier
  mark_phase(s, kPhaseStart);
#else
  (void)s;
  (void)slots;
#endif
}

__device__ __forceinline__ uint64_t composite(uint32_t key, int id) {
  return (static_cast<uint64_t>(key) << 32) | (0xffffffffu - static_cast<uint32_t>(id));
}

// Calls f(id, value) for every token of a row: aligned unit-stride rows in 16-byte runs
// (runs.cuh), other strides by scalar loads, eight in flight. Visit order is unspecified.
template <typename T, typename F>
__device__ __forceinline__ void for_each_in_row(const T* __restrict__ row, long long stride, int V,
                                                F&& f) {
  if (reads_in_runs(row, stride)) {
    for_each_run(
        row, V,
        [&](int id0, const uint4& v) {
          float x[kRun<T>];
          unpack_run<T>(v, x);
#pragma unroll
          for (int j = 0; j < kRun<T>; ++j) f(id0 + j, x[j]);
        },
        f);
    return;
  }
  const int step = blockDim.x;
  constexpr int kScalar = 8;
  int base = 0;
  for (; base + kScalar * step <= V; base += kScalar * step) {
    float x[kScalar];
#pragma unroll
    for (int u = 0; u < kScalar; ++u) x[u] = to_f32(row[(base + u * step + threadIdx.x) * stride]);
#pragma unroll
    for (int u = 0; u < kScalar; ++u) f(base + u * step + threadIdx.x, x[u]);
  }
  for (int id = base + threadIdx.x; id < V; id += step) f(id, to_f32(row[id * stride]));
}

__device__ __forceinline__ void hist_add(uint32_t* hist, uint32_t bin) {
  // Warp-aggregated: peaked and quantised rows put many lanes on one bin.
  const unsigned peers = __match_any_sync(__activemask(), bin);
  if ((threadIdx.x % kWarp) == __ffs(peers) - 1) atomicAdd(&hist[bin], __popc(peers));
}

// Finds the bin holding the `needed`-th largest element (1-based) of a histogram of `bins`
// bins; stores it and the count of elements in higher bins into s.sel_bin / s.sel_above.
__device__ void find_threshold(CandShared& s, const uint32_t* hist, int bins, int needed) {
  const int per = (bins + blockDim.x - 1) / blockDim.x;
  // Thread t owns `per` bins counted from the top, so thread order is descending key.
  const int hi = bins - threadIdx.x * per;
  int local = 0;
  for (int j = 0; j < per; ++j) {
    const int b = hi - 1 - j;
    if (b >= 0) local += hist[b];
  }
  int total;
  const int incl = block_inclusive_scan(local, s.iscratch, &total);
  const int before = incl - local;
  if (before < needed && needed <= incl) {
    int acc = before;
    for (int j = 0; j < per; ++j) {
      const int b = hi - 1 - j;
      const int c = hist[b];
      if (acc + c >= needed) {
        s.sel_bin = b;
        s.sel_above = acc;
        break;
      }
      acc += c;
    }
  }
  __syncthreads();
}

__device__ __forceinline__ void clear_hist(CandShared& s) {
  for (int b = threadIdx.x; b < kBins; b += blockDim.x) s.hist[b] = 0;
}

__device__ __forceinline__ void push_candidate(CandShared& s, uint64_t c) {
  s.cand[atomicAdd(&s.count, 1)] = c;
}

// The `needed` largest of s.ties[0..n) go to the candidates. The entries are distinct
// composites whose top `known` bits are equal: radix select on the remaining bits, 8 at a
// time, in shared memory.
__device__ void take_top_ties(CandShared& s, int n, int needed, int known) {
  const int free_bits = 64 - known;
  const uint64_t low_mask = (~0ull) >> known;
  uint64_t prefix = 0;  // decided bits below the known ones
  int decided = 0;
  while (needed > 0) {
    const int digit = min(8, free_bits - decided);
    const int shift = free_bits - decided - digit;
    for (int b = threadIdx.x; b < kSmallBins; b += blockDim.x) s.small_hist[b] = 0;
    __syncthreads();
    auto matches = [&](uint64_t low) { return decided == 0 || (low >> (free_bits - decided)) == prefix; };
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const uint64_t low = s.ties[i] & low_mask;
      if (matches(low)) atomicAdd(&s.small_hist[(low >> shift) & ((1u << digit) - 1)], 1u);
    }
    __syncthreads();
    if (threadIdx.x < kWarp) {  // one warp finds the threshold digit (bins above 2^digit are 0)
      warp_crossing_digit(s.small_hist, static_cast<uint32_t>(needed), &s.sel_bin, &s.kth_above);
    }
    __syncthreads();
    const uint32_t bin = s.sel_bin;
    const int rest = needed - static_cast<int>(s.kth_above);  // still needed from its bin
    const bool take_bin = static_cast<int>(s.small_hist[bin]) == rest;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const uint64_t low = s.ties[i] & low_mask;
      const uint32_t d = (low >> shift) & ((1u << digit) - 1);
      if (matches(low) && (d > bin || (take_bin && d == bin))) push_candidate(s, s.ties[i]);
    }
    __syncthreads();
    if (take_bin) return;
    prefix = (prefix << digit) | bin;
    decided += digit;
    needed = rest;
  }
}

// The first `keep` of src[0..n) in descending order into dst[0..keep), in one barrier: an
// entry's place is the number of entries above it (the keys are distinct: their ids
// differ), counted by `split` adjacent lanes over a contiguous share of the others each,
// two at a time (one 16-byte load: src is 16-byte aligned); entries placed at `keep` or
// later are dropped. n * n / blockDim.x compares a thread.
__device__ void rank_top(const uint64_t* src, int n, int keep, uint64_t* dst) {
  int split = 1;  // lanes an entry, a power of two up to a warp
  while (split < kWarp && n * split * 2 <= static_cast<int>(blockDim.x)) split *= 2;
  const int per_pass = blockDim.x / split;
  const int part = threadIdx.x % split;
  const int pairs = n / 2;
  const int lo = part * pairs / split, hi = (part + 1) * pairs / split;
  const ulonglong2* src2 = reinterpret_cast<const ulonglong2*>(src);
  for (int e0 = 0; e0 < n; e0 += per_pass) {
    const int e = e0 + static_cast<int>(threadIdx.x) / split;
    const uint64_t mine = e < n ? src[e] : 0;
    int above = 0;
    if (e < n) {
#pragma unroll 4
      for (int j = lo; j < hi; ++j) {
        const ulonglong2 q = src2[j];
        above += (q.x > mine ? 1 : 0) + (q.y > mine ? 1 : 0);
      }
      if (part == 0 && (n & 1)) above += src[n - 1] > mine ? 1 : 0;
    }
    for (int o = split / 2; o > 0; o >>= 1) above += __shfl_xor_sync(0xffffffffu, above, o);
    if (e < n && part == 0 && above < keep) dst[above] = mine;
  }
  __syncthreads();
}

// Sorts s.cand[0..n) descending by rank (rank_top into s.ties, free once the candidates
// are collected, and copied back).
__device__ void rank_sort_candidates(CandShared& s, int n) {
  rank_top(s.cand, n, n, s.ties);
  for (int i = threadIdx.x; i < n; i += blockDim.x) s.cand[i] = s.ties[i];
  __syncthreads();
}

// Sorts s.cand[0..n) descending, n <= kMaxK: by rank where that is a few dozen compares a
// thread, else by a bitonic network padded to a power of two (one barrier a step: 36 for
// n = 256, 55 for 1024).
__device__ void sort_candidates(CandShared& s, int n) {
  if (n * n <= 64 * static_cast<int>(blockDim.x)) {
    rank_sort_candidates(s, n);
    return;
  }
  int p = 1;
  while (p < n) p <<= 1;
  for (int i = n + threadIdx.x; i < p; i += blockDim.x) s.cand[i] = 0;
  __syncthreads();
  for (int size = 2; size <= p; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < p / 2; i += blockDim.x) {
        const int lo = 2 * i - (i & (stride - 1));
        const int hi = lo + stride;
        const bool desc = ((lo & size) == 0);
        const uint64_t a = s.cand[lo], b = s.cand[hi];
        if ((a < b) == desc) {
          s.cand[lo] = b;
          s.cand[hi] = a;
        }
      }
      __syncthreads();
    }
  }
}

// The K largest of s.ties[0..n) (distinct, n >= K) into s.cand[0..K), in rank order.
// A few hundred entries (a row's kept tokens for K up to a few hundred) are ranked
// directly, one barrier; more go through take_top_ties' radix rounds (four barriers a
// byte of the composite, and the K-th key's ties need the id's bytes too) and a sort.
constexpr int kRankKeptCompares = 256;  // rank directly up to n * n / threads of these
__device__ void select_kept(CandShared& s, int n, int K) {
  if (n * n <= kRankKeptCompares * static_cast<int>(blockDim.x)) {
    rank_top(s.ties, n, K, s.cand);
    return;
  }
  take_top_ties(s, n, K, 0);
  __syncthreads();
  sort_candidates(s, K);
}

// The tokens tied with the threshold prefix beyond what shared memory holds (e.g. a row of
// equal values): rank them by id with a block scan per tile of the row, in id order.
template <typename T>
__device__ void collect_by_id(const T* __restrict__ row, long long stride, int V, uint32_t prefix,
                              int low, int needed, CandShared& s) {
  int tie_base = 0;
  const int tiles = (V + blockDim.x - 1) / blockDim.x;
  for (int tile = 0; tile < tiles; ++tile) {
    const int v = tile * blockDim.x + threadIdx.x;
    int is_tie = 0;
    uint32_t key = 0;
    if (v < V) {
      key = float_key(to_f32(row[v * stride]));
      if ((key >> low) > prefix) push_candidate(s, composite(key, v));
      is_tie = (key >> low) == prefix ? 1 : 0;
    }
    int total;
    const int rank = block_inclusive_scan(is_tie, s.iscratch, &total) - is_tie + tie_base;
    if (is_tie && rank < needed) push_candidate(s, composite(key, v));
    tie_base += total;
  }
}

// The K-th largest of the block's keys, two a thread (K <= 2 * blockDim.x), or a key below
// it that no value of the row's type lies between: a radix select, 8 bits a round from the
// top, until `kKeyBits` (KeyBits: the bits a key of the type can vary in) are decided; the
// undecided low bits are returned as 0. Three barriers a round. kTop: s.top_key gets the
// largest key too, found beside the first round's histogram (a warp maximum and one shared
// atomic a warp: no barrier of its own; a pointer out instead put the caller's word on the
// stack, ptxas -v).
template <int kKeyBits, bool kTop = false>
__device__ uint32_t kth_largest_thread_key(CandShared& s, const uint32_t (&mine)[2], int K) {
  uint32_t prefix = 0;  // the decided high bits
  uint32_t need = K;    // keys still needed at or above the prefix
  int decided = 0;
  for (; decided < kKeyBits; decided += 8) {
    for (int b = threadIdx.x; b < kSmallBins; b += blockDim.x) s.small_hist[b] = 0;
    if (kTop && decided == 0 && threadIdx.x == 0) s.top_key = 0;
    __syncthreads();
    const int shift = 24 - decided;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (decided == 0 || (mine[h] >> (shift + 8)) == prefix) {
        hist_add(s.small_hist, (mine[h] >> shift) & 255u);
      }
    }
    if (kTop && decided == 0) {
      const uint32_t warp_top = __reduce_max_sync(0xffffffffu, max(mine[0], mine[1]));
      if (threadIdx.x % kWarp == 0) atomicMax(&s.top_key, warp_top);
    }
    __syncthreads();
    if (threadIdx.x < kWarp) warp_crossing_digit(s.small_hist, need, &s.sel_bin, &s.kth_above);
    __syncthreads();
    prefix = (prefix << 8) | static_cast<uint32_t>(s.sel_bin);
    need -= s.kth_above;
  }
  __syncthreads();  // every thread has read sel_bin before anyone writes it again
  return prefix << (32 - decided);
}

// The fallback: radix select on the key, 12-bit digits over the whole row, then the
// tokens tied with the threshold by (key, id) in shared memory or, beyond that, by id.
template <typename T>
__device__ void radix_select_row(const T* __restrict__ row, long long stride, int V, int K,
                                 CandShared& s) {
  __syncthreads();
  if (threadIdx.x == 0) s.count = s.tie_count = 0;
  clear_hist(s);
  __syncthreads();
  for_each_in_row(row, stride, V, [&](int, float x) {
    hist_add(s.hist, float_key(x) >> (32 - kDigitBits));
  });
  __syncthreads();
  find_threshold(s, s.hist, kBins, K);
  uint32_t prefix = s.sel_bin;
  int nbits = kDigitBits;
  int needed = K - s.sel_above;
  int tied = s.hist[prefix];
  // Rarely (huge ties): refine the threshold with more passes until its bin fits in
  // shared memory or is an exact value. Below KeyBits every key's low bits are equal.
  while (tied > needed && tied > kTieCap && nbits < KeyBits<T>::value) {
    const int digit = min(kDigitBits, 32 - nbits);
    const int shift = 32 - nbits - digit;
    __syncthreads();
    clear_hist(s);
    __syncthreads();
    for_each_in_row(row, stride, V, [&](int, float x) {
      const uint32_t key = float_key(x);
      if ((key >> (32 - nbits)) == prefix) hist_add(s.hist, (key >> shift) & ((1u << digit) - 1));
    });
    __syncthreads();
    find_threshold(s, s.hist, 1 << digit, needed);
    prefix = (prefix << digit) | s.sel_bin;
    nbits += digit;
    needed -= s.sel_above;
    tied = s.hist[s.sel_bin];
  }
  __syncthreads();  // the histogram is dead from here: `ties` reuses its memory
  const int low = 32 - nbits;

  if (tied == needed || tied <= kTieCap) {
    // Final pass: everything above the threshold prefix is in; its own bin is either all in
    // or goes to shared memory to be resolved by (key, id) there.
    const bool take_all = tied == needed;
    for_each_in_row(row, stride, V, [&](int id, float x) {
      const uint32_t key = float_key(x);
      const uint32_t top = key >> low;
      if (top > prefix || (take_all && top == prefix)) push_candidate(s, composite(key, id));
      else if (top == prefix) s.ties[atomicAdd(&s.tie_count, 1)] = composite(key, id);
    });
    __syncthreads();
    if (!take_all) take_top_ties(s, tied, needed, nbits);
  } else {
    collect_by_id(row, stride, V, prefix, low, needed, s);
  }
}

// A row with NaN or +inf (SPEC stage 1): no eligible rank, every LP -inf, every id -1.
__device__ __forceinline__ void write_rejected(int K, float* __restrict__ lp,
                                               long long* __restrict__ ti,
                                               int* __restrict__ eligible, int* __restrict__ bad) {
  for (int r = threadIdx.x; r < K; r += blockDim.x) {
    lp[r] = -INFINITY;
    ti[r] = -1;
  }
  if (threadIdx.x == 0) {
    *eligible = 0;
    *bad = 1;
  }
}

// Writes the row's log-probs and ids from `sorted` (K candidates in rank order).
template <typename T>
__device__ void write_sorted(const T* __restrict__ row, long long stride, int K, float z,
                             const uint64_t* sorted, float* __restrict__ lp,
                             long long* __restrict__ ti, int* __restrict__ eligible,
                             int* __restrict__ bad, CandShared& s) {
  const uint32_t ninf = neg_inf_key();
  int local_elig = 0;
  for (int r = threadIdx.x; r < K; r += blockDim.x) {
    const uint64_t c = sorted[r];
    const int id = static_cast<int>(0xffffffffu - static_cast<uint32_t>(c));
    const uint32_t key = static_cast<uint32_t>(c >> 32);
    const bool finite = key != ninf;
    // The value from its key (a zero re-read: the subtraction must keep its sign).
    const float x = key_value_or(key, [&] { return to_f32(row[static_cast<long long>(id) * stride]); });
    lp[r] = finite ? x - z : -INFINITY;
    ti[r] = id;
    local_elig += finite ? 1 : 0;
  }
  int total_elig;
  block_inclusive_scan(local_elig, s.iscratch, &total_elig);
  if (threadIdx.x == 0) {
    *eligible = total_elig;
    *bad = 0;
  }
}

// Pass 1 of top_k_pass: this thread's largest value among its even tokens and among its
// odd ones (NaN ignored; -inf where it has none), and whether it saw a NaN or +inf; 16-bit
// rows in packed pairs (a pair's halves are an even and an odd token).
template <typename T>
__device__ __forceinline__ void max_pass(const T* __restrict__ row, long long stride, int V,
                                         float (&local_max)[2], int* local_bad) {
  float mx[2] = {-INFINITY, -INFINITY};
  int bad = 0;
  const auto one = [&](int id, float x) {
    bad |= bad_value(x) ? 1 : 0;
    mx[id & 1] = fmaxf(mx[id & 1], x);
  };
  bool packed_runs = false;
  if constexpr (kPacked<T>) {
    packed_runs = reads_in_runs(row, stride);
    if (packed_runs) {
      PackedMax<T> packed;
      constexpr bool kLastRead = false, kBatchTail = true;
      for_each_run<8, kLastRead, kBatchTail>(
          row, V, [&](int, const uint4& v) { packed.add(v); }, one);
      mx[0] = fmaxf(mx[0], to_f32(packed.max.x));
      mx[1] = fmaxf(mx[1], to_f32(packed.max.y));
      bad |= packed.bad() ? 1 : 0;
    }
  }
  if (!packed_runs) for_each_in_row(row, stride, V, one);
  local_max[0] = mx[0];
  local_max[1] = mx[1];
  *local_bad = bad;
}

// A token at or above the floor into s.ties (up to kTieCap; s.tie_count counts them all).
__device__ __forceinline__ void collect_token(CandShared& s, uint32_t floor_key, int id, float x) {
  const uint32_t key = float_key(x);
  if (key >= floor_key) {
    const int slot = atomicAdd(&s.tie_count, 1);
    if (slot < kTieCap) s.ties[slot] = composite(key, id);
  }
}

// The smallest value of the type whose key is at least floor_key: a run whose packed
// maximum is below it holds no candidate (-0.0 and 0.0 share a key and compare equal).
template <typename T>
__device__ __forceinline__ T floor_value(uint32_t floor_key) {
  return from_f32_up<T>(float_of_key(floor_key));
}

// The queue's tokens (its first kDeferCap runs), one a thread: f(whole, id, x) for each
// token of each entry, id0 or, for a run queued whole, ~id0.
template <typename T, typename F>
__device__ __forceinline__ void drain_queue(const T* __restrict__ row, const CandShared& s,
                                            F&& f) {
  const int tokens = min(s.defer_count, kDeferCap) * kRun<T>;
  for (int t = threadIdx.x; t < tokens; t += blockDim.x) {
    const int entry = s.deferred[t / kRun<T>];
    const int id = (entry < 0 ? ~entry : entry) + t % kRun<T>;
    f(entry < 0, id, to_f32(row[id]));
  }
}

// Clears a pass's sum, kept tokens and queue before the row is read again.
__device__ __forceinline__ void restart_pass(TermSum& sum, CandShared& s) {
  __syncthreads();  // every thread has read the counts
  sum.total = U128{0ull, 0ull};
  if (threadIdx.x == 0) s.tie_count = s.defer_count = s.whole_count = 0;
  __syncthreads();
}

// One 16-bit run of pass 2, any route: its tokens at or above the floor collected, its
// terms into `sum` (as far terms where its maximum is 3 or more below the shift in the
// fast grade; their differences exact where every value is at least `least` in size).
template <typename T, typename Sum, typename Grade>
__device__ __forceinline__ void any_run(int id0, const uint4& v, float shift, Grade grade,
                                        uint32_t floor_key, T least, Sum& sum, CandShared& s) {
  const float top = run_max<T>(v);
  if (float_key(top) >= floor_key) {
    float x[kRun<T>];
    unpack_run<T>(v, x);
#pragma unroll
    for (int j = 0; j < kRun<T>; ++j) collect_token(s, floor_key, id0 + j, x[j]);
  }
  if (kFastGrade<Grade> && !(top - shift > kNearBelowMax)) {
    sum.template add_far<T>(v, shift, run_at_least<T>(v, {least, least}));
  } else {
    sum.template add_run<T>(v, shift, grade);
  }
}

// any_run in the fast grade, out of line, its terms returned: the runs the fast loop leaves
// (fast_runs), whose rare branches would otherwise swell the loop's code.
template <typename T>
__device__ __noinline__ U128 rare_run(int id0, uint4 v, float shift, uint32_t floor_key, T least,
                                      CandShared& s) {
  TermSum terms;
  any_run(id0, v, shift, Fast{}, floor_key, least, terms, s);
  return terms.total;
}

// Pass 2's runs in the fast grade. The loop does only the common run: under the floor,
// 3 or more below the shift, with exact differences (far_term16_exact), tested on the
// run's packed maxima against two bounds of the row's type. Any other run is queued in
// shared memory (s.deferred, up to kDeferCap; past it, done at once out of line) and done
// after the loop. Done in the loop, such a run kept the rest of its warp waiting: a quarter
// of the kernel's instructions at bs = 64 ran with 1 to 5 of 32 lanes (Nsight Compute,
// BENCHMARKS session 29). The sum is of integers and the tokens are ranked after, so the
// order does not matter: the outputs are any_run's on every run, bit for bit.
template <typename T, typename One>
__device__ __forceinline__ void fast_runs(const T* __restrict__ row, int V, float shift,
                                          uint32_t floor_key, T least, TermSum& sum,
                                          CandShared& s, One&& one) {
  using P = typename PairOf<T>::type;
  // Values below `below` have keys under the floor (the smallest value of the type at or
  // above the floor's; -0.0 and 0.0 share a key and compare equal). Values at or under
  // `far` are at least 3 below the shift however x - shift rounds: shift - 3 rounded down,
  // then down again to the type. A floor at -inf (fewer than K finite maxima) makes
  // `below` a NaN: every run is then queued (each holds candidates anyway) and, past the
  // queue, done out of line, slower than in the loop but the same outputs.
  const T below = floor_value<T>(floor_key);
  const T far = from_f32_down<T>(__fsub_rd(shift, -kNearBelowMax));
  const P below2{below, below}, far2{far, far}, least2{least, least};
  for_each_run<4, true>(
      row, V,
      [&](int id0, const uint4& v) {
        const P top = run_max2<T>(v);
        if (__hblt2(top, below2) && __hble2(top, far2) && run_at_least<T>(v, least2)) {
          sum.add_far<T>(v, shift, true);
          return;
        }
        const int slot = atomicAdd(&s.defer_count, 1);
        if (slot < kDeferCap) {
          s.deferred[slot] = id0;
        } else {
          sum.total = add128(sum.total, rare_run<T>(id0, v, shift, floor_key, least, s));
        }
      },
      one);
  __syncthreads();  // every run queued
  // The queued runs' tokens, one a thread, through `one` (the per-token term and collect,
  // fixed_term's bits, which any_run's routes give too), so the sum is the same. A run done
  // whole by one thread (eight float64 terms in a row near the maximum) held its block at
  // the next barrier: 17 % of the wide cluster's stall samples at bs = 1 (BENCHMARKS.md
  // session 32).
  drain_queue(row, s, [&](bool, int id, float x) { one(id, x); });
}

// One token of the absolute grade's slow route: NaN / +inf flagged, else its term added
// and the token collected if it is at or above the floor.
__device__ __forceinline__ void absolute_token(float x, int id, uint32_t floor_key, U128& sum,
                                               int& bad, CandShared& s) {
  if (bad_value(x)) {
    bad = 1;
    return;
  }
  sum = add128(sum, fixed_term(x, 0.0f, Absolute{}));
  collect_token(s, floor_key, id, x);
}

// The one read's loop over a 16-bit row's runs: every run's packed maximum into `mx` (NaN
// kept: a NaN or +inf there is how the caller finds them, queued or not); a
// run under kAbsoluteRunBelow (NaN-free) summed at once (its eight absolute terms), and
// queued for its tokens' collection if it reaches the floor (entry id0); any other run
// (a large value, NaN or +inf) queued whole (entry ~id0). The queue is then done token by
// token, one a thread. The sum is of integers and the tokens are ranked after, so order
// does not matter. Past the queue's kDeferCap runs nothing more is queued (s.defer_count
// says so; one_read then reads the row again), so the loop calls nothing out of line: a
// call's saved registers had the loop spill its maximum every run (ptxas, sm_90).
template <bool kPrefetch = false, typename T, typename One>
__device__ __forceinline__ void absolute_runs(const T* __restrict__ row, int V,
                                              uint32_t floor_key, TermSum& sum,
                                              typename PairOf<T>::type& mx, int& bad,
                                              CandShared& s, One&& one) {
  using P = typename PairOf<T>::type;
  // Values below `below` have keys under the floor (as in fast_runs).
  const T below = floor_value<T>(floor_key);
  const T cap = from_f32<T>(kAbsoluteRunBelow);
  const P below2{below, below}, cap2{cap, cap};
  const auto queue = [&](int entry) {
    const int slot = atomicAdd(&s.defer_count, 1);
    if (slot < kDeferCap) s.deferred[slot] = entry;
  };
  // Counted apart: past kDeferCap of them no pass of this loop fits its queue.
  const auto queue_whole = [&](int id0) {
    queue(~id0);
    atomicAdd(&s.whole_count, 1);
  };
  for_each_run<4, true, false, kPrefetch>(
      row, V,
      [&](int id0, const uint4& v) {
        const P top = run_max2_nan<T>(v);
        mx = __hmax2_nan(mx, top);
        if (!__hblt2(top, cap2)) {
          queue_whole(id0);
          return;
        }
        sum.add_absolute<T>(v);
        if (!__hblt2(top, below2)) queue(id0);
      },
      one);
  __syncthreads();  // every run queued
  drain_queue(row, s, [&](bool whole, int id, float x) {
    if (whole) {
      absolute_token(x, id, floor_key, sum.total, bad, s);
    } else {
      collect_token(s, floor_key, id, x);
    }
  });
}

// absolute_runs as pass 2 of a row whose maximum is known (two_reads, and one_read's second
// read): false, with the sum and the kept tokens cleared, if its queue overflowed.
template <typename T>
__device__ bool absolute_pass(const T* __restrict__ row, int V, uint32_t floor_key,
                              TermSum& sum, CandShared& s) {
  using P = typename PairOf<T>::type;
  const T ninf = from_f32<T>(-INFINITY);
  P mx{ninf, ninf};
  int bad = 0;  // pass 1 has rejected NaN and +inf
  absolute_runs(row, V, floor_key, sum, mx, bad, s, [&](int id, float x) {
    absolute_token(x, id, floor_key, sum.total, bad, s);
  });
  if (s.defer_count <= kDeferCap) return true;
  restart_pass(sum, s);
  return false;
}

// Pass 2 of top_k_pass: every value's term into `sum` (against `shift`, in `grade`), and
// every token whose key is at least `floor_key` into s.ties (up to kTieCap; s.tie_count
// counts them all). 16-bit runs are routed whole (any_run): a run far below the shift
// (fast grade) sums as far terms, a run under the floor collects nothing.
//
// The fast and the absolute grades' sums have loops of their own (fast_runs, absolute_pass);
// `absolute_fits` false skips absolute_pass where its queue is known to overflow.
template <typename T, typename Sum, typename Grade>
__device__ __forceinline__ void sum_and_collect(const T* __restrict__ row, long long stride,
                                                int V, float shift, Grade grade,
                                                uint32_t floor_key, Sum& sum, CandShared& s,
                                                bool absolute_fits = true) {
  const auto one = [&](int id, float x) {
    sum.add(x, shift, grade);
    collect_token(s, floor_key, id, x);
  };
  if constexpr (kPacked<T>) {
    if (reads_in_runs(row, stride)) {
      // Runs whose every value is at least this in magnitude have exact differences with
      // the shift (fast grade only: |shift| >= 4).
      const T least = from_f32<T>(exact_from<kSignificand<T>>(shift));
      constexpr bool kTerms = std::is_same<Sum, TermSum>::value;
      if constexpr (kTerms && std::is_same<Grade, Absolute>::value) {
        // Past its queue, the generic loop below (rows of many large values).
        if (absolute_fits && absolute_pass(row, V, floor_key, sum, s)) return;
      }
      if constexpr (kFastGrade<Grade> && kTerms) {
        fast_runs(row, V, shift, floor_key, least, sum, s, one);
      } else {
        for_each_run_once(
            row, V,
            [&](int id0, const uint4& v) {
              any_run(id0, v, shift, grade, floor_key, least, sum, s);
            },
            one);
      }
      return;
    }
  }
  for_each_in_row(row, stride, V, one);
}

// The K largest of the s.ties entries collected (s.tie_count of them, at or above some
// floor) into s.cand, in rank order; past kTieCap the radix select over the whole row.
template <typename T>
__device__ void select_collected(const T* __restrict__ row, long long stride, int V, int K,
                                 int kept, CandShared& s) {
  if (kept <= kTieCap) {
    select_kept(s, kept, K);
  } else {
    radix_select_row(row, stride, V, K, s);
    __syncthreads();
    sort_candidates(s, K);
  }
}

struct OneBlock {  // the default `combine`: the block reads the whole row
  __device__ void operator()(float&, int&) const {}
};

// Stage 1's two reads of `V` tokens (a row, or a chunk of one) for their top K, K <= V:
// pass 1 finds NaN / +inf and the maximum; `combine(m, bad)` may then widen both to a whole
// row that several blocks share (candidates_cluster.cuh), and *max_out gets the result;
// pass 2 adds every value's term to `sum` (TermSum or NoSum, runs.cuh) against the shift,
// that maximum (0 when every value is -inf), in the row's normaliser grade (fixed_sum.cuh),
// and leaves the top K in s.cand, in rank order. Returns 1, with nothing collected, when a
// NaN or +inf was seen.
template <typename T, typename Sum, typename Combine>
__device__ int two_reads(const T* __restrict__ row, long long stride, int V, int K,
                         CandShared& s, float* max_out, Sum& sum, Combine&& combine) {
  if (threadIdx.x == 0) s.count = s.tie_count = s.defer_count = s.whole_count = 0;
  int local_bad;
  float local_max[2];
  max_pass(row, stride, V, local_max, &local_bad);
  int bad = block_any(local_bad, s.iscratch);
  float m = block_max(fmaxf(local_max[0], local_max[1]), s.fscratch);
  combine(m, bad);
  *max_out = m;
  mark_phase(s, kPhaseMaxPass);
  if (bad) return 1;
  const float shift = (m == -INFINITY) ? 0.0f : m;  // all -inf: every term is 0

  // The K-th largest of the threads' maxima (two a thread: its even and its odd tokens')
  // bounds the row's K-th largest from below (those maxima are K of the row's tokens, or
  // -inf), so pass 2 keeps only tokens at or above it: usually a few times K, selected
  // among exactly in shared memory. Ties beyond kTieCap fall back to the radix select over
  // the whole row.
  const uint32_t keys[2] = {float_key(local_max[0]), float_key(local_max[1])};
  const uint32_t floor_key = kth_largest_thread_key<KeyBits<T>::value>(s, keys, K);
  mark_phase(s, kPhaseFloor);
  with_grade(shift, [&](auto grade) {
    sum_and_collect(row, stride, V, shift, grade, floor_key, sum, s);
  });
  __syncthreads();
  mark_phase(s, kPhaseSumCollect);
  select_collected(row, stride, V, K, s.tie_count, s);
  mark_phase(s, kPhaseSelect);
  return 0;
}

// The one read's first batch: each thread's first kFirstRuns runs (the loads its loop
// makes first, so the loop finds them in L2), their even and odd tokens' maxima as keys
// (-inf where it has none). Their K-th largest is a floor for the candidates, lower than
// the whole row's (fewer tokens behind each maximum) but known before the row is read.
constexpr int kFirstRuns = 8;
template <typename T>
__device__ __forceinline__ void first_batch_keys(const T* __restrict__ row, int V,
                                                 uint32_t (&keys)[2]) {
  using P = typename PairOf<T>::type;
  const int nvec = V / kRun<T>;
  const uint4* vrow = reinterpret_cast<const uint4*>(row);
  const T ninf = from_f32<T>(-INFINITY);
  P mx{ninf, ninf};
#pragma unroll
  for (int u = 0; u < kFirstRuns; ++u) {
    const int i = threadIdx.x + u * blockDim.x;
    if (i < nvec) mx = __hmax2(mx, run_max2<T>(__ldg(vrow + i)));
  }
  keys[0] = float_key(to_f32(mx.x));
  keys[1] = float_key(to_f32(mx.y));
}

// Keeps the s.ties entries [0, n) whose key is at least floor_key, in order, in place;
// returns how many. A block scan a tile: every entry of a tile is read before any of it is
// written, and an entry only moves down.
__device__ int keep_at_or_above(CandShared& s, int n, uint32_t floor_key) {
  int kept = 0;
  for (int base = 0; base < n; base += blockDim.x) {
    const int i = base + threadIdx.x;
    const uint64_t e = i < n ? s.ties[i] : 0ull;
    const int keep = (i < n && static_cast<uint32_t>(e >> 32) >= floor_key) ? 1 : 0;
    int total;
    const int incl = block_inclusive_scan(keep, s.iscratch, &total);
    if (keep) s.ties[kept + incl - 1] = e;
    kept += total;
    __syncthreads();
  }
  return kept;
}

// two_reads in one read of an aligned unit-stride 16-bit row, for rows of the absolute
// grade (fixed_sum.cuh), whose terms need no maximum: the floor from the first batch
// (first_batch_keys), then one loop that sums every term and collects the tokens at or
// above that floor, and finds the maximum, NaN / +inf and the threads' even and odd
// maxima. Then `combine`; if the row is absolute its sum is done, and the kept tokens under
// the whole row's floor (the K-th largest of those maxima, two_reads' floor) are dropped
// before the selection. Else (a row of a relative grade, or a queue past its cap) a second
// read sums the row as two_reads' pass 2 (the same floor, so the same kept tokens); that
// pass skips absolute_pass where more runs were queued whole than its queue holds (it
// would overflow too: a third read). A row whose first batch's maximum is outside the
// absolute grade's range takes two_reads at once: above kAbsoluteTo the row's maximum is
// too, and below kAbsoluteFrom it likely is (log-probabilities: every value at most 0), so
// the one read would be a wasted third: one_read returns kTwoReads, having written nothing
// but its counts (top_k_pass calls two_reads once: called twice, it was not inlined and the
// row's sum went to the stack, ptxas -v). Either way the outputs are two_reads', bit for bit.
constexpr int kTwoReads = -1;
template <typename T, typename Combine>
__device__ int one_read(const T* __restrict__ row, int V, int K, CandShared& s, float* max_out,
                        TermSum& sum, Combine&& combine) {
  using P = typename PairOf<T>::type;
  if (threadIdx.x == 0) s.count = s.tie_count = s.defer_count = s.whole_count = 0;
  uint32_t keys[2];
  first_batch_keys(row, V, keys);
  constexpr bool kTop = true;
  const uint32_t first_floor = kth_largest_thread_key<KeyBits<T>::value, kTop>(s, keys, K);
  mark_phase(s, kPhaseFirstFloor);
  if (!absolute_row(float_of_key(s.top_key))) return kTwoReads;
  const T ninf = from_f32<T>(-INFINITY);
  P mx{ninf, ninf};
  float tail[2] = {-INFINITY, -INFINITY};  // the tokens after the last whole run
  int local_bad = 0;
  constexpr bool kPrefetch = true;  // for_each_run says why here alone
  absolute_runs<kPrefetch>(row, V, first_floor, sum, mx, local_bad, s, [&](int id, float x) {
    tail[id & 1] = fmaxf(tail[id & 1], x);
    absolute_token(x, id, first_floor, sum.total, local_bad, s);
  });
  mark_phase(s, kPhaseOneRead);
  const float even = fmaxf(to_f32(mx.x), tail[0]), odd = fmaxf(to_f32(mx.y), tail[1]);
  if (bad_value(to_f32(mx.x)) || bad_value(to_f32(mx.y))) local_bad = 1;
  // Flag 1: NaN or +inf; flag 2: the queue overflowed (a cluster's `combine` would OR them;
  // top_k_pass gives one_read whole rows only).
  int flags = block_any(local_bad, s.iscratch) | (s.defer_count > kDeferCap ? 2 : 0);
  float m = block_max(fmaxf(even, odd), s.fscratch);
  combine(m, flags);
  *max_out = m;
  mark_phase(s, kPhaseReduce);
  if (flags & 1) return 1;
  const uint32_t row_keys[2] = {float_key(even), float_key(odd)};
  const uint32_t floor_key = kth_largest_thread_key<KeyBits<T>::value>(s, row_keys, K);
  mark_phase(s, kPhaseRowFloor);
  if (absolute_row(m) && !(flags & 2)) {
    int kept = s.tie_count;
    if (kept <= kTieCap) kept = keep_at_or_above(s, kept, floor_key);
    mark_phase(s, kPhaseKeep);
    select_collected(row, 1, V, K, kept, s);
    mark_phase(s, kPhaseSelect);
    return 0;
  }
  // A relative-grade row, or a queue past its cap: two_reads' pass 2 (its floor).
  const bool absolute_fits = s.whole_count <= kDeferCap;
  restart_pass(sum, s);
  const float shift = (m == -INFINITY) ? 0.0f : m;
  with_grade(shift, [&](auto grade) {
    sum_and_collect(row, 1, V, shift, grade, floor_key, sum, s, absolute_fits);
  });
  __syncthreads();
  mark_phase(s, kPhaseSecondRead);
  select_collected(row, 1, V, K, s.tie_count, s);
  mark_phase(s, kPhaseSelect);
  return 0;
}

// Stage 1's reads of `V` tokens (a row, or a chunk of one) for their top K: one_read where
// it applies (a whole aligned unit-stride 16-bit row summed into a TermSum, K at most
// kOneReadMaxK), else two_reads. Measured on the H200 (BENCHMARKS.md, session 35): a
// cluster block's chunk (2.3 runs a thread) waits on the same chain of latencies either
// way and one_read's extra floor made bs = 1 slower; at K = 255 (bs = 8 and 64) one_read
// was 1.10-1.13x slower than two_reads: the lower the first batch's floor, the more runs wait
// in the queue for their tokens' collection.
// kOneRead false compiles two_reads alone (the kernel for K > kOneReadMaxK): with one_read's
// code beside it, stage 1 at K = 255 ran 4.6 % slower on the H200 (BENCHMARKS.md, session
// 36) though it never takes one_read, 19 % slower with two_reads out of line (H100,
// session 37); alone it spills nothing and ran 1.07x faster than with (H100, session 37).
constexpr int kOneReadMaxK = 128;
template <typename T, typename Sum, typename Combine = OneBlock, bool kOneRead = true>
__device__ int top_k_pass(const T* __restrict__ row, long long stride, int V, int K,
                          CandShared& s, float* max_out, Sum& sum,
                          Combine&& combine = Combine{}) {
  constexpr bool kWholeRow = std::is_same<std::decay_t<Combine>, OneBlock>::value;
  if constexpr (kOneRead && kPacked<T> && std::is_same<Sum, TermSum>::value && kWholeRow) {
    if (reads_in_runs(row, stride) && K <= kOneReadMaxK) {
      const int rejected = one_read(row, V, K, s, max_out, sum, combine);
      if (rejected != kTwoReads) return rejected;
    }
  }
  return two_reads(row, stride, V, K, s, max_out, sum, combine);
}

// Row outputs: lp[K], ti[K]; *eligible = finite ranks; *bad = NaN or +inf seen. kOneRead:
// top_k_pass's.
template <typename T, bool kOneRead = true>
__device__ void candidates_row(const T* __restrict__ row, long long stride, int V, int K,
                               float* __restrict__ lp, long long* __restrict__ ti,
                               int* __restrict__ eligible, int* __restrict__ bad,
                               CandShared& s) {
  TermSum terms;
  float m;
  if (top_k_pass<T, TermSum, OneBlock, kOneRead>(row, stride, V, K, s, &m, terms)) {
    write_rejected(K, lp, ti, eligible, bad);
    return;
  }
  // Normaliser: Z = fp32(m + ln(sum exp(x - m))), the sum in fixed point (fixed_sum.cuh).
  const U128 sum = block_sum128(terms.total, s.uscratch);
  const float z = (m == -INFINITY) ? -INFINITY : fixed_normaliser(m, sum);
  mark_phase(s, kPhaseNormaliser);
  write_sorted(row, stride, K, z, s.cand, lp, ti, eligible, bad, s);
  mark_phase(s, kPhaseWrite);
}

}  // namespace ddtree
