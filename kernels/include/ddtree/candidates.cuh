// SPEC stage 1 — candidates per depth: per (request, depth) row, the top-K tokens in
// (value desc, id asc) order and the fp32 logsumexp, straight from bf16/fp16/fp32 logits.
//
// One block per row. Radix select on the order-preserving fp32 key, 12-bit digits:
//   pass 1: NaN/+inf check, row max, histogram of the top digit;
//   pass 2..: histogram of the next digit among the rows still tied with the threshold
//             prefix (the first of these passes also sums exp(x - max));
//   final:  collect every token above the threshold, plus the tied ones: all of them when
//           they are exactly the ones needed, else the lowest ids (an id-ordered block scan).
// The K collected (key, id) pairs are sorted by a bitonic network in shared memory.
#pragma once
#include "common.cuh"

namespace ddtree {

constexpr int kCandThreads = 1024;
constexpr int kDigitBits = 12;
constexpr int kBins = 1 << kDigitBits;
constexpr int kMaxK = 1024;

struct CandShared {
  uint32_t hist[kBins];
  uint64_t cand[kMaxK];  // (key << 32) | (0xffffffff - id): larger = ranked earlier
  float fscratch[32];
  double dscratch[32];
  int iscratch[32];
  int count;      // candidates collected so far
  int sel_bin;    // threshold bin of the current digit
  int sel_above;  // tokens in bins above it
};

__device__ __forceinline__ void hist_add(uint32_t* hist, uint32_t bin) {
  // Warp-aggregated: peaked and quantised rows put many lanes on one bin.
  const unsigned peers = __match_any_sync(__activemask(), bin);
  if ((threadIdx.x % kWarp) == __ffs(peers) - 1) atomicAdd(&hist[bin], __popc(peers));
}

// Finds the bin holding the `needed`-th largest element (1-based) of a histogram of `bins`
// bins; stores it and the count of elements in higher bins into s.sel_bin / s.sel_above.
__device__ void find_threshold(CandShared& s, int bins, int needed) {
  const int per = (bins + blockDim.x - 1) / blockDim.x;
  // Thread t owns `per` bins counted from the top, so thread order is descending key.
  const int hi = bins - threadIdx.x * per;
  int local = 0;
  for (int j = 0; j < per; ++j) {
    const int b = hi - 1 - j;
    if (b >= 0) local += s.hist[b];
  }
  int total;
  const int incl = block_inclusive_scan(local, s.iscratch, &total);
  const int before = incl - local;
  if (before < needed && needed <= incl) {
    int acc = before;
    for (int j = 0; j < per; ++j) {
      const int b = hi - 1 - j;
      const int c = s.hist[b];
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

__device__ __forceinline__ void push_candidate(CandShared& s, uint32_t key, int id) {
  const int slot = atomicAdd(&s.count, 1);
  s.cand[slot] = (static_cast<uint64_t>(key) << 32) | (0xffffffffu - static_cast<uint32_t>(id));
}

// sum(exp(d)) for d = x - max <= 0, per thread. Terms near the max (d > -3) decide Z's last
// bits, so they take float64 exp and a float64 sum; the far terms take fp32 expf into a
// Kahan-compensated fp32 sum, whose per-term errors are tiny against the total and average
// out. Combined in float64 across the block; Z stays within SPEC's one fp32 ulp.
struct ExpSum {
  double near = 0.0;
  float far = 0.0f, comp = 0.0f;
  __device__ __forceinline__ void add(float d) {
    if (d > -3.0f) {
      near += exp(static_cast<double>(d));
      return;
    }
    const float y = expf(d) - comp;
    const float t = far + y;
    comp = (t - far) - y;
    far = t;
  }
  __device__ __forceinline__ double total() const {
    return near + (static_cast<double>(far) - comp);
  }
};

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

// Row outputs: lp[K], ti[K]; *eligible = finite ranks; *bad = NaN or +inf seen.
template <typename T>
__device__ void candidates_row(const T* __restrict__ row, long long stride, int V, int K,
                               float* __restrict__ lp, long long* __restrict__ ti,
                               int* __restrict__ eligible, int* __restrict__ bad,
                               CandShared& s) {
  // Pass 1: bad values, max, top-digit histogram.
  clear_hist(s);
  if (threadIdx.x == 0) s.count = 0;
  __syncthreads();
  int local_bad = 0;
  float local_max = -INFINITY;
  for (int v = threadIdx.x; v < V; v += blockDim.x) {
    const float x = to_f32(row[v * stride]);
    local_bad |= (isnan(x) || x == INFINITY) ? 1 : 0;
    local_max = fmaxf(local_max, x);
    hist_add(s.hist, float_key(x) >> (32 - kDigitBits));
  }
  const int row_bad = block_any(local_bad, s.iscratch);
  const float m = block_max(local_max, s.fscratch);
  if (row_bad) {
    for (int r = threadIdx.x; r < K; r += blockDim.x) {
      lp[r] = -INFINITY;
      ti[r] = -1;
    }
    if (threadIdx.x == 0) {
      *eligible = 0;
      *bad = 1;
    }
    return;
  }

  // Refine the threshold digit by digit while more tokens tie with it than are needed.
  find_threshold(s, kBins, K);
  uint32_t prefix = s.sel_bin;
  int nbits = kDigitBits;
  int needed = K - s.sel_above;
  int tied = s.hist[prefix];
  ExpSum lse;
  bool summed = false;
  const float m_shift = (m == -INFINITY) ? 0.0f : m;  // all -inf: every term is 0
  while (tied > needed && nbits < KeyBits<T>::value) {
    const int digit = min(kDigitBits, 32 - nbits);
    const int shift = 32 - nbits - digit;
    __syncthreads();
    clear_hist(s);
    __syncthreads();
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
      const float x = to_f32(row[v * stride]);
      if (!summed) lse.add(x - m_shift);
      const uint32_t key = float_key(x);
      if ((key >> (32 - nbits)) == prefix) hist_add(s.hist, (key >> shift) & ((1u << digit) - 1));
    }
    summed = true;
    __syncthreads();
    find_threshold(s, 1 << digit, needed);
    prefix = (prefix << digit) | s.sel_bin;
    nbits += digit;
    needed -= s.sel_above;
    tied = s.hist[s.sel_bin];
  }
  // Below KeyBits every key's low bits are zero: the threshold is an exact value.
  const int low = 32 - nbits;

  // Final pass: collect. Tiles in id order, so tied tokens can be ranked by id.
  int tie_base = 0;
  const bool take_all_tied = (tied == needed);
  const int tiles = (V + blockDim.x - 1) / blockDim.x;
  for (int tile = 0; tile < tiles; ++tile) {
    const int v = tile * blockDim.x + threadIdx.x;
    int is_tie = 0;
    uint32_t key = 0;
    if (v < V) {
      const float x = to_f32(row[v * stride]);
      if (!summed) lse.add(x - m_shift);
      key = float_key(x);
      const uint32_t top = key >> low;
      if (top > prefix) {
        push_candidate(s, key, v);
      } else if (top == prefix) {
        if (take_all_tied) push_candidate(s, key, v);
        else is_tie = 1;
      }
    }
    if (!take_all_tied) {  // uniform across the block
      int total;
      const int rank = block_inclusive_scan(is_tie, s.iscratch, &total) - is_tie + tie_base;
      if (is_tie && rank < needed) push_candidate(s, key, v);
      tie_base += total;
    }
  }
  __syncthreads();

  // Normaliser: Z = fp32(m + log(sum exp(x - m))), the sum combined in float64.
  const double sum = block_sum(lse.total(), s.dscratch);
  const float z = (m == -INFINITY) ? -INFINITY : static_cast<float>(static_cast<double>(m) + log(sum));

  sort_candidates(s, K);
  const uint32_t ninf = neg_inf_key();
  int local_elig = 0;
  for (int r = threadIdx.x; r < K; r += blockDim.x) {
    const uint64_t c = s.cand[r];
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

}  // namespace ddtree
