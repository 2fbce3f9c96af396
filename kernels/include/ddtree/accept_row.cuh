// SPEC stage 4's rows, for accept.cuh and sample.cuh: a request's cluster of
// kAcceptCluster blocks, each owning a contiguous slice of every visited target row (read in
// place: strided, bf16/fp16/fp32), and the cluster-wide reductions through distributed
// shared memory that combine the blocks' partial results; the greedy posterior (argmax).
//
// Every token has a unique 56-bit order key, (value key << 24 | ~id): a larger key comes
// first in SPEC's order (value descending, id ascending).
#pragma once
#include <cooperative_groups.h>

#include "common.cuh"

namespace ddtree {

namespace cg = cooperative_groups;

constexpr int kAcceptThreads = 256;
constexpr int kAcceptCluster = 8;        // blocks per request (the portable cluster size)
constexpr int kLinkCap = 1024;           // trees up to this Q keep their links in shared memory
constexpr int kSliceCacheCap = 76 * 1024;  // bytes of a row slice kept in shared memory
constexpr int kMinAcceptBlocks = 4;      // per SM: 64 requests' clusters resident at once
// Vector loads a thread issues before using them. sm_120's register allocation spills the
// sampling passes under 64 registers with any batch (ptxas -v), so it loads one at a time
// there; sm_90, where this is measured, keeps 4 in flight without spilling.
// The greedy kernel's argmax (no sampling code beside it) keeps eight in flight on sm_90: a
// block's slice at V = 151936 is 9.3 loads a thread, read in two round trips, not three
// (sm_120's ptxas spills it at eight, so it keeps its one).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
constexpr int kAcceptLoadBatch = 1;
constexpr int kGreedyLoadBatch = 1;
#else
constexpr int kAcceptLoadBatch = 4;
constexpr int kGreedyLoadBatch = 8;
#endif
// Draw keys a thread, a warp, a block and a cluster keep (shortlist.cuh): every warp's fit
// one warp's lanes, as do every block's.
constexpr int kShortlist = 4;
constexpr int kShortlistSums = 3;  // near mass, tokens ahead of a listed one, their mass
static_assert(kAcceptThreads / kWarp * kShortlist <= kWarp && kAcceptCluster * kShortlist <= kWarp,
              "a shortlist merge is one warp's");
constexpr int kIdBits = 24;              // V <= 2^24
constexpr uint64_t kIdMask = (1ull << kIdBits) - 1;

// Elements of a row each block owns: a multiple of 8 keeps every slice 16-byte aligned.
__host__ __device__ constexpr int accept_slice_len(int V) {
  return (V + kAcceptCluster * 8 - 1) / (kAcceptCluster * 8) * 8;
}

// This block's slice [lo, hi) of one target row. With a cache, the first pass over the
// slice stores its raw elements in shared memory and later passes read them from there.
template <typename T>
struct Slice {
  const T* row;
  long long stride;
  int lo, hi;
  T* cache;     // null: every pass reads global memory
  bool cached;  // the cache holds this row

  // Calls f(id, value) for this thread's share of the slice.
  template <int kBatch = kAcceptLoadBatch, typename F>
  __device__ __forceinline__ void for_each(F f) const {
    visit<kBatch>(
        [&](int first, const uint4& v) {
          const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
          for (int j = 0; j < 16 / static_cast<int>(sizeof(T)); ++j) f(first + j, to_f32(e[j]));
        },
        f);
  }

  // This thread's share of the slice: chunk(first id, 16 bytes) for each vector load when the
  // source is contiguous and aligned, elem(id, value) for the elements read one by one.
  template <int kBatch = kAcceptLoadBatch, typename FChunk, typename FElem>
  __device__ __forceinline__ void visit(FChunk chunk, FElem elem) const {
    constexpr int kVec = 16 / sizeof(T);
    const int n = hi - lo;
    const T* src = cached ? cache : row + lo * stride;
    const bool contiguous = cached || stride == 1;
    int done = 0;
    if (contiguous && reinterpret_cast<uintptr_t>(src) % 16 == 0) {
      const uint4* vec = reinterpret_cast<const uint4*>(src);
      uint4* store = cache != nullptr && !cached ? reinterpret_cast<uint4*>(cache) : nullptr;
      if (cached)
        visit_vec<false, kBatch>(reinterpret_cast<const uint4*>(cache), nullptr, n / kVec, chunk);
      else if (store)
        visit_vec<true, kBatch>(vec, store, n / kVec, chunk);
      else
        visit_vec<true, kBatch>(vec, nullptr, n / kVec, chunk);
      done = n / kVec * kVec;
    }
    const long long step = contiguous ? 1 : stride;
    for (int i = done + threadIdx.x; i < n; i += blockDim.x) {
      const T v = src[i * step];
      if (cache != nullptr && !cached) cache[i] = v;
      elem(lo + i, to_f32(v));
    }
  }

  // The vector loop, in batches of kBatch loads issued before any is used: the walk is a
  // chain of row reads, so each read must keep many loads in flight (a store to the cache
  // between loads would otherwise order them, as the compiler cannot rule out aliasing).
  template <bool kGlobal, int kBatch, typename FChunk>
  __device__ __forceinline__ void visit_vec(const uint4* vec, uint4* store, int chunks,
                                            FChunk chunk) const {
    constexpr int kVec = 16 / sizeof(T);
    for (int base = threadIdx.x; base < chunks; base += kBatch * blockDim.x) {
      uint4 v[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int c = base + u * blockDim.x;
        if (c < chunks) v[u] = kGlobal ? __ldg(vec + c) : vec[c];
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int c = base + u * blockDim.x;
        if (c >= chunks) break;
        if (store) store[c] = v[u];
        chunk(lo + c * kVec, v[u]);
      }
    }
  }
};

__device__ __forceinline__ uint64_t order_key(float x, int id) {
  if (isnan(x)) x = -INFINITY;
  return static_cast<uint64_t>(float_key(x)) << kIdBits | (kIdMask - static_cast<uint64_t>(id));
}

__device__ __forceinline__ int key_id(uint64_t key) { return static_cast<int>(kIdMask - (key & kIdMask)); }

// The value an order key holds (float_key inverted; -0.0 comes back as 0.0).
__device__ __forceinline__ float key_value(uint64_t key) {
  return float_of_key(static_cast<uint32_t>(key >> kIdBits));
}

__device__ __forceinline__ uint64_t warp_max_u64(uint64_t v) {
  for (int o = 16; o > 0; o >>= 1) {
    const uint64_t w = __shfl_xor_sync(0xffffffffu, v, o);
    v = w > v ? w : v;
  }
  return v;
}

// Shared state of one block. `part`, `hist` and `cnt` are read by the other blocks of the
// cluster; they are double-buffered by pass parity, so one cluster barrier per pass
// suffices (a block rewrites a buffer two passes later, after every reader has passed the
// barrier in between).
struct AcceptScratch {
  uint64_t reduce[kWarp];  // block_reduce's per-warp slots
  uint64_t part[2];
  uint64_t hist[2][256];
  uint32_t cnt[2][256];
  uint64_t total[256];  // the cluster's combined histogram
  uint32_t total_cnt[256];
  uint64_t bcast;
  uint64_t need;  // a select's target, set from the first pass's total
  uint64_t pick_before;
  int pick_digit;
  int next;
  // The draw by shortlist (shortlist.cuh): the block's running floor, the warps' and the
  // block's shortlists, the cluster's; the warps' and blocks' sums, the cluster's.
  uint64_t floor;
  uint64_t warp_draws[kAcceptThreads / kWarp * kShortlist];
  uint64_t draw_part[2][kShortlist];
  uint64_t shortlist[kShortlist];
  uint64_t warp_sums[kAcceptThreads / kWarp][kShortlistSums];
  uint64_t sum_part[2][kShortlistSums];
  uint64_t sums[kShortlistSums];
};

// Cluster-wide reductions. Every block of a cluster runs the same sequence of them (all
// control flow depends only on combined values), counting passes in `phase`.
struct Cluster {
  AcceptScratch& s;
  int phase;

  template <typename WarpOp>
  __device__ uint64_t reduce(uint64_t v, WarpOp warp_op) {
    v = block_reduce(v, s.reduce, uint64_t{0}, warp_op);
    const int p = phase++ & 1;
    if (threadIdx.x == 0) s.part[p] = v;
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();
    if (threadIdx.x < kWarp) {
      uint64_t r = 0;
      if (threadIdx.x < kAcceptCluster) r = *cluster.map_shared_rank(&s.part[p], threadIdx.x);
      r = warp_op(r);
      if (threadIdx.x == 0) s.bcast = r;
    }
    __syncthreads();
    return s.bcast;
  }
  __device__ uint64_t max(uint64_t v) { return reduce(v, warp_max_u64); }

  // The local histogram buffer of the next pass, zeroed.
  __device__ int begin_histogram() {
    const int p = phase & 1;
    for (int i = threadIdx.x; i < 256; i += blockDim.x) {
      s.hist[p][i] = 0;
      s.cnt[p][i] = 0;
    }
    __syncthreads();
    return p;
  }

  // Sums the cluster's histograms of this pass into s.total / s.total_cnt.
  __device__ void combine_histogram() {
    const int p = phase++ & 1;
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();
    for (int i = threadIdx.x; i < 256; i += blockDim.x) {
      uint64_t h = 0;
      uint32_t c = 0;
      for (int r = 0; r < kAcceptCluster; ++r) {
        h += *cluster.map_shared_rank(&s.hist[p][i], r);
        c += *cluster.map_shared_rank(&s.cnt[p][i], r);
      }
      s.total[i] = h;
      s.total_cnt[i] = c;
    }
    __syncthreads();
  }
};

// Adds weight w to bin `digit`. The histograms only see tokens near the row's maximum
// (spread over many bins) or within one bin of those, so plain shared atomics suffice.
__device__ __forceinline__ void hist_add(uint64_t* hist, uint32_t* cnt, int digit, uint64_t w) {
  atomicAdd(reinterpret_cast<unsigned long long*>(&hist[digit]), w);
  atomicAdd(&cnt[digit], 1u);
}

// The greedy posterior: the largest order key of the row, or 0 when no value exceeds -inf
// (then every token ties at -inf, NaN counting as -inf, and the answer is id 0). Each thread
// keeps its first largest value (it visits ids in increasing order); a vector chunk costs
// one max per element, and is searched for its first maximum only when it beats the best.
template <typename T, int kBatch = kAcceptLoadBatch>
__device__ uint64_t row_argmax_key(const Slice<T>& slice, Cluster& cl) {
  constexpr int kVec = 16 / sizeof(T);
  float best = -INFINITY;
  int at = -1;
  slice.template visit<kBatch>(
      [&](int first, const uint4& v) {
        const T* e = reinterpret_cast<const T*>(&v);
        float top = to_f32(e[0]);
#pragma unroll
        for (int j = 1; j < kVec; ++j) top = fmaxf(top, to_f32(e[j]));  // NaN ignored
        if (!(top > best)) return;
        best = top;
#pragma unroll
        for (int j = kVec - 1; j >= 0; --j)
          if (to_f32(e[j]) == top) at = first + j;
      },
      [&](int i, float x) {
        if (x > best) {
          best = x;
          at = i;
        }
      });
  return cl.max(at < 0 ? 0 : order_key(best, at));
}

// The token of a greedy posterior key.
__device__ __forceinline__ int argmax_token(uint64_t key) { return key == 0 ? 0 : key_id(key); }

}  // namespace ddtree
