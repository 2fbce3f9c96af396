// SPEC stage 1 with a row spread over a cluster of kCandCluster blocks: for batches too
// small to fill the GPU with one block a row (bs = 1: 15 rows for 132 SMs). Block `rank`
// reads its 1/kCandCluster of the row; the blocks exchange through distributed shared
// memory, in one launch:
//   1. each block's maximum and NaN/+inf flag, combined: the row's (top_k_pass's
//      `combine`), so every block sums in the row's grade (against its maximum, unless
//      the grade is absolute);
//   2. each block's top K of its chunk (global ids) and fixed-point sum;
//   3. block 0 merges the blocks' sorted lists (each entry ranked by binary searches in the
//      others) and adds their sums, then writes as candidates_row does.
// The rank order is comparisons only and the sum is integer (fixed_sum.cuh), so the result
// is the one-block kernel's, bit for bit.
#pragma once
#include <cooperative_groups.h>

#include "candidates.cuh"

namespace ddtree {

namespace cg = cooperative_groups;

constexpr int kCandCluster = 8;  // the portable cluster size (sm_90 and sm_120)

// What a block publishes to its cluster (static shared memory).
struct ClusterSlot {
  float max;      // the chunk's maximum, then (row_max) the row's
  int bad;        // the chunk saw NaN or +inf, then (row_bad) the row did
  float row_max;
  int row_bad;
  U128 sum;  // the chunk's fixed-point sum
  int k;     // entries of the chunk's list (s.cand)
};

// top_k_pass's `combine`: the row's maximum and flag from every block's. Two cluster
// barriers: the second keeps each slot alive until every block has read it.
struct RowOverCluster {
  ClusterSlot& slot;

  __device__ void operator()(float& m, int& bad) const {
    cg::cluster_group cluster = cg::this_cluster();
    if (threadIdx.x == 0) {
      slot.max = m;
      slot.bad = bad;
    }
    cluster.sync();
    if (threadIdx.x < kWarp) {
      float rm = -INFINITY;
      int rb = 0;
      if (threadIdx.x < kCandCluster) {
        const ClusterSlot* other = cluster.map_shared_rank(&slot, threadIdx.x);
        rm = other->max;
        rb = other->bad;
      }
      for (int o = 16; o > 0; o >>= 1) {
        rm = fmaxf(rm, __shfl_xor_sync(0xffffffffu, rm, o));
        rb |= __shfl_xor_sync(0xffffffffu, rb, o);
      }
      if (threadIdx.x == 0) {
        slot.row_max = rm;
        slot.row_bad = rb;
      }
    }
    cluster.sync();
    m = slot.row_max;
    bad = slot.row_bad;
  }
};

// The first token and length of block `rank`'s chunk: 16-token multiples, so every chunk
// of an aligned unit-stride row starts 16-byte aligned for for_each_in_row's vector loads.
// The launcher takes this path only for V >= kClusterMinVocab, where every chunk has a
// token.
constexpr int kClusterMinVocab = 4096;

__device__ __forceinline__ int2 cluster_chunk(int V, int rank) {
  const long long per = (static_cast<long long>(V) + kCandCluster - 1) / kCandCluster;
  const int chunk = static_cast<int>((per + 15) / 16 * 16);  // 64-bit: V may be near 2^31
  const int first = rank * chunk;
  return {first, max(0, min(chunk, V - first))};
}

// Block 0: every block's sorted list into s.ties (list r from at[r], at[kCandCluster] the
// total; thread 0 writes `at`, the caller's barrier publishes it) and the sum of their sums.
__device__ U128 gather_lists(ClusterSlot& slot, CandShared& s, int* at) {
  cg::cluster_group cluster = cg::this_cluster();
  U128 sum{0ull, 0ull};
  int from = 0;
  for (int r = 0; r < kCandCluster; ++r) {
    const ClusterSlot* other = cluster.map_shared_rank(&slot, r);
    const uint64_t* list = cluster.map_shared_rank(s.cand, r);
    const int k = other->k;
    for (int i = threadIdx.x; i < k; i += blockDim.x) s.ties[from + i] = list[i];
    if (threadIdx.x == 0) at[r] = from;
    from += k;
    sum = add128(sum, other->sum);
  }
  if (threadIdx.x == 0) at[kCandCluster] = from;
  return sum;
}

// Entries of the descending list [lo, hi) greater than c.
__device__ __forceinline__ int count_above(const uint64_t* list, int lo, int hi, uint64_t c) {
  const int begin = lo;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (list[mid] > c) lo = mid + 1;
    else hi = mid;
  }
  return lo - begin;
}

// The row's top K, in rank order, into s.cand: an entry's rank is its place in its own
// list plus the entries of the other lists above it (the keys are distinct), found by
// binary search; one step, no select passes.
__device__ void merge_lists(CandShared& s, const int* at, int K) {
  for (int e = threadIdx.x; e < at[kCandCluster]; e += blockDim.x) {
    int r = 0;
    while (at[r + 1] <= e) ++r;
    const uint64_t c = s.ties[e];
    int rank = e - at[r];
    for (int o = 0; o < kCandCluster && rank < K; ++o) {
      if (o != r) rank += count_above(s.ties, at[o], at[o + 1], c);
    }
    if (rank < K) s.cand[rank] = c;
  }
}

// Row outputs as candidates_row writes them, from the cluster's blocks; `row` is the
// whole row, every block of the cluster calls this.
template <typename T>
__device__ void candidates_cluster_row(const T* __restrict__ row, long long stride, int V,
                                       int K, float* __restrict__ lp,
                                       long long* __restrict__ ti, int* __restrict__ eligible,
                                       int* __restrict__ bad, CandShared& s,
                                       ClusterSlot& slot) {
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int2 part = cluster_chunk(V, rank);
  const int k = min(K, part.y);
  TermSum terms;
  float m;
  const T* chunk = row + static_cast<long long>(part.x) * stride;
  if (top_k_pass(chunk, stride, part.y, k, s, &m, terms, RowOverCluster{slot})) {
    if (rank == 0) write_rejected(K, lp, ti, eligible, bad);
    return;  // the flag is the row's: every block returns here
  }
  const U128 sum = block_sum128(terms.total, s.uscratch);
  // The list's ids are the chunk's: (key, ~id) less the chunk's first token is the global
  // (the order stays: keys with equal values keep ids ascending).
  for (int i = threadIdx.x; i < k; i += blockDim.x) s.cand[i] -= static_cast<uint64_t>(part.x);
  if (threadIdx.x == 0) {
    slot.sum = sum;
    slot.k = k;
  }
  cluster.sync();
  __shared__ int at[kCandCluster + 1];
  U128 total{0ull, 0ull};
  if (rank == 0) total = gather_lists(slot, s, at);
  cluster.sync();  // no block leaves while block 0 may read its shared memory
  if (rank != 0) return;
  merge_lists(s, at, K);  // every chunk's list holds its share of the top K
  __syncthreads();
  const float z = (m == -INFINITY) ? -INFINITY : fixed_normaliser(m, total);
  write_sorted(row, stride, K, z, s.cand, lp, ti, eligible, bad, s);
}

}  // namespace ddtree
