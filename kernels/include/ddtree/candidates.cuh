// SPEC stage 1 — candidates per depth: per (request, depth) row, the top-K tokens in
// (value desc, id asc) order and the fp32 logsumexp, straight from bf16/fp16/fp32 logits.
//
// One block per row, two reads of the row:
//   pass 1: NaN/+inf check, the row max, and each thread's own max;
//   pass 2: the fixed-point sum of exp(x - max) (fixed_sum.cuh), and every token at or
//           above the K-th largest thread max (a lower bound of the row's K-th largest)
//           into shared memory, where a radix select on (key, id) keeps the top K.
// `top_k_pass` is those two reads for any run of tokens: partials.cuh runs it on chunks.
// When too many tokens tie for shared memory, radix_select_row takes over: 12-bit digit
// histograms over the whole row, then the tied tokens by id (an id-ordered block scan).
// The K (key, id) pairs are sorted by a bitonic network in shared memory.
#pragma once
#include "common.cuh"
#include "fixed_sum.cuh"

namespace ddtree {

constexpr int kCandThreads = 1024;
constexpr int kDigitBits = 12;
constexpr int kBins = 1 << kDigitBits;
constexpr int kMaxK = 1024;

constexpr int kTieCap = 8192;  // tokens selected among in shared memory
constexpr int kSmallBins = 256;

struct CandShared {
  union {
    uint32_t hist[kBins];    // digit histograms over the row
    uint64_t ties[kTieCap];  // (key, id) of the tokens in the threshold bin, once it is known
  };
  uint64_t cand[kMaxK];  // (key << 32) | (0xffffffff - id): larger = ranked earlier
  uint32_t small_hist[kSmallBins];
  float fscratch[32];
  double dscratch[32];
  U128 uscratch[32];
  int iscratch[32];
  int count;      // candidates collected so far
  int tie_count;  // entries in ties
  int sel_bin;    // threshold bin of the current digit
  int sel_above;  // tokens in bins above it
};

// Dynamic shared memory every candidates launch asks for (launch.rs: CANDIDATE_SMEM).
constexpr int kCandSmem = 80 * 1024;
static_assert(sizeof(CandShared) <= kCandSmem, "CandShared outgrew its launch size");

__device__ __forceinline__ uint64_t composite(uint32_t key, int id) {
  return (static_cast<uint64_t>(key) << 32) | (0xffffffffu - static_cast<uint32_t>(id));
}

// Calls f(id, value) for every token of a row. Unit-stride rows aligned to 16 bytes take
// 16-byte loads, four in flight per thread (the row is read at memory speed, not latency);
// other strides take scalar loads, eight in flight. Visit order is unspecified.
template <typename T, typename F>
__device__ __forceinline__ void for_each_in_row(const T* __restrict__ row, long long stride, int V,
                                                F&& f) {
  constexpr int kVec = 16 / sizeof(T);
  constexpr int kUnroll = 4;
  const int step = blockDim.x;
  if (stride == 1 && (reinterpret_cast<uintptr_t>(row) & 15) == 0) {
    const int nvec = V / kVec;
    const uint4* vrow = reinterpret_cast<const uint4*>(row);
    int i = threadIdx.x;
    for (; i + (kUnroll - 1) * step < nvec; i += kUnroll * step) {
      uint4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = __ldg(vrow + i + u * step);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const T* e = reinterpret_cast<const T*>(&v[u]);
#pragma unroll
        for (int j = 0; j < kVec; ++j) f((i + u * step) * kVec + j, to_f32(e[j]));
      }
    }
    for (; i < nvec; i += step) {
      const uint4 v = __ldg(vrow + i);
      const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
      for (int j = 0; j < kVec; ++j) f(i * kVec + j, to_f32(e[j]));
    }
    for (int id = nvec * kVec + threadIdx.x; id < V; id += step) f(id, to_f32(row[id]));
    return;
  }
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
    find_threshold(s, s.small_hist, 1 << digit, needed);
    const uint32_t bin = s.sel_bin;
    const int rest = needed - s.sel_above;  // still needed from the threshold bin
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

// Bitonic sort of s.cand[0..n) descending, n <= kMaxK, padded to a power of two.
__device__ void sort_candidates(CandShared& s, int n) {
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

// The K-th largest of the block's per-thread keys (K <= blockDim.x): a bitonic sort of
// one key per thread, in the candidate buffer (unused until the final collect).
__device__ uint32_t kth_largest_thread_key(CandShared& s, uint32_t mine, int K) {
  uint32_t* keys = reinterpret_cast<uint32_t*>(s.cand);
  const int n = blockDim.x;  // a power of two
  keys[threadIdx.x] = mine;
  __syncthreads();
  for (int size = 2; size <= n; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      const int i = threadIdx.x;
      if (i < n / 2) {
        const int lo = 2 * i - (i & (stride - 1));
        const int hi = lo + stride;
        const bool desc = ((lo & size) == 0);
        const uint32_t a = keys[lo], b = keys[hi];
        if ((a < b) == desc) {
          keys[lo] = b;
          keys[hi] = a;
        }
      }
      __syncthreads();
    }
  }
  const uint32_t kth = keys[K - 1];
  __syncthreads();
  return kth;
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
    const bool finite = static_cast<uint32_t>(c >> 32) != ninf;
    // Re-read the value: the key merged -0.0 into 0.0, the subtraction must not.
    const float x = to_f32(row[static_cast<long long>(id) * stride]);
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

// Sorts the K collected candidates and writes the row's log-probs and ids.
template <typename T>
__device__ void write_candidates(const T* __restrict__ row, long long stride, int K, float z,
                                 float* __restrict__ lp, long long* __restrict__ ti,
                                 int* __restrict__ eligible, int* __restrict__ bad,
                                 CandShared& s) {
  sort_candidates(s, K);
  write_sorted(row, stride, K, z, s.cand, lp, ti, eligible, bad, s);
}

// Stage 1's two reads of `V` tokens (a row, or a chunk of one) for their top K, K <= V:
// pass 1 finds NaN / +inf and the maximum; `combine(m, bad)` may then widen both to a whole
// row that several blocks share (candidates_cluster.cuh), and *max_out gets the result;
// pass 2 calls each(x, shift, grade) on every value, shift being that maximum (0 when
// every value is -inf) and grade the row's normaliser grade as a type (fixed_sum.cuh: the
// loop is compiled once per grade, so a term pays for its own grade only), and collects
// the top K into s.cand, unsorted. Returns 1, with nothing collected, when a NaN or +inf
// was seen.
struct OneBlock {  // the default `combine`: the block reads the whole row
  __device__ void operator()(float&, int&) const {}
};

template <typename T, typename Each, typename Combine = OneBlock>
__device__ int top_k_pass(const T* __restrict__ row, long long stride, int V, int K,
                          CandShared& s, float* max_out, Each&& each,
                          Combine&& combine = Combine{}) {
  if (threadIdx.x == 0) s.count = s.tie_count = 0;
  int local_bad = 0;
  float local_max = -INFINITY;
  for_each_in_row(row, stride, V, [&](int, float x) {
    local_bad |= (isnan(x) || x == INFINITY) ? 1 : 0;
    local_max = fmaxf(local_max, x);
  });
  int bad = block_any(local_bad, s.iscratch);
  float m = block_max(local_max, s.fscratch);
  combine(m, bad);
  *max_out = m;
  if (bad) return 1;
  const float shift = (m == -INFINITY) ? 0.0f : m;  // all -inf: every term is 0

  // The K-th largest of the threads' maxima bounds the row's K-th largest from below (those
  // maxima are K of the row's tokens), so pass 2 keeps only tokens at or above it: usually a
  // few times K, selected among exactly in shared memory. Ties beyond kTieCap fall back to
  // the radix select over the whole row.
  const uint32_t floor_key = kth_largest_thread_key(s, float_key(local_max), K);
  with_grade(shift, [&](auto grade) {
    for_each_in_row(row, stride, V, [&](int id, float x) {
      each(x, shift, grade);
      const uint32_t key = float_key(x);
      if (key >= floor_key) {
        const int slot = atomicAdd(&s.tie_count, 1);
        if (slot < kTieCap) s.ties[slot] = composite(key, id);
      }
    });
  });
  __syncthreads();
  const int kept = s.tie_count;
  if (kept <= kTieCap) {
    take_top_ties(s, kept, K, 0);
  } else {
    radix_select_row(row, stride, V, K, s);
  }
  __syncthreads();
  return 0;
}

// Row outputs: lp[K], ti[K]; *eligible = finite ranks; *bad = NaN or +inf seen.
template <typename T>
__device__ void candidates_row(const T* __restrict__ row, long long stride, int V, int K,
                               float* __restrict__ lp, long long* __restrict__ ti,
                               int* __restrict__ eligible, int* __restrict__ bad,
                               CandShared& s) {
  U128 sum{0ull, 0ull};
  float m;
  const auto add_term = [&](float x, float shift, auto grade) {
    sum = add128(sum, fixed_term(x, shift, grade));
  };
  if (top_k_pass(row, stride, V, K, s, &m, add_term)) {
    write_rejected(K, lp, ti, eligible, bad);
    return;
  }
  // Normaliser: Z = fp32(m + ln(sum exp(x - m))), the sum in fixed point (fixed_sum.cuh).
  sum = block_sum128(sum, s.uscratch);
  const float z = (m == -INFINITY) ? -INFINITY : fixed_normaliser(m, sum);
  write_candidates(row, stride, K, z, lp, ti, eligible, bad, s);
}

}  // namespace ddtree
