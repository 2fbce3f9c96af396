// Entry points of SPEC stage 1 (see include/ddtree/candidates.cuh): one block per
// (request, depth) row; row r = b * L + d reads logits + b*s0 + d*s1 with vocab stride s2.
// Stage 1 as partials (include/ddtree/partials.cuh): blockIdx (row, part) for the parts
// and their sums, one block per row for the merge.
#include "ddtree/candidates.cuh"
#include "ddtree/candidates_cluster.cuh"
#include "ddtree/params.h"
#include "ddtree/partials.cuh"

namespace ddtree {

// Row `row` = b * L + d of the draft logits: logits + b*s0 + d*s1.
template <typename T>
__device__ __forceinline__ const T* row_of(const BuildParams& p, int row) {
  const int b = row / p.L, d = row % p.L;
  return static_cast<const T*>(p.logits) + static_cast<long long>(b) * p.s0 +
         static_cast<long long>(d) * p.s1;
}

// The stage-1 diagnostics slots of row `row` (one block a row: gridDim.x rows), after the
// selection's; null where the build keeps no diagnostics.
__device__ __forceinline__ long long* row_clocks(const BuildParams& p, int row) {
  if (p.scratch.stats == nullptr) return nullptr;
  const long long requests = gridDim.x / p.L;
  return p.scratch.stats + requests * kSelectStatSlots + static_cast<long long>(row) * kPhaseSlots;
}

}  // namespace ddtree

#define DDTREE_CANDIDATES(NAME, T, ONE_READ)                                                \
  extern "C" __global__ void __launch_bounds__(ddtree::kCandThreads)                      \
      NAME(const __grid_constant__ ddtree::BuildParams p) {                               \
    extern __shared__ __align__(16) char smem[];                                            \
    ddtree::CandShared& s = *reinterpret_cast<ddtree::CandShared*>(smem);                    \
    const int row = blockIdx.x;                                                             \
    ddtree::set_phase_clocks(s, ddtree::row_clocks(p, row));                                \
    const T* r = ddtree::row_of<T>(p, row);                                                 \
    const long long at = static_cast<long long>(row) * p.K;                                 \
    ddtree::candidates_row<T, ONE_READ>(r, p.s2, p.V, p.K, p.out.topk_logprobs + at,       \
                              p.out.topk_ids + at, p.scratch.eligible + row,                \
                              p.scratch.bad + row, s);                                      \
  }

DDTREE_CANDIDATES(ddtree_candidates_f32, float, true)
DDTREE_CANDIDATES(ddtree_candidates_f16, __half, true)
DDTREE_CANDIDATES(ddtree_candidates_bf16, __nv_bfloat16, true)
// The same rows for K > kOneReadMaxK: two_reads alone (top_k_pass says why). f32 rows never
// take one_read; its entry keeps the per-dtype table whole.
DDTREE_CANDIDATES(ddtree_candidates_wide_f32, float, false)
DDTREE_CANDIDATES(ddtree_candidates_wide_f16, __half, false)
DDTREE_CANDIDATES(ddtree_candidates_wide_bf16, __nv_bfloat16, false)

// The same rows, each spread over a cluster of kCandCluster blocks (candidates_cluster.cuh):
// blockIdx.x / kCandCluster is the row.
#define DDTREE_CANDIDATES_CLUSTER(NAME, T)                                                  \
  extern "C" __global__ void __cluster_dims__(ddtree::kCandCluster, 1, 1)                  \
      __launch_bounds__(ddtree::kCandThreads) NAME(const __grid_constant__ ddtree::BuildParams p) { \
    extern __shared__ __align__(16) char smem[];                                            \
    __shared__ ddtree::ClusterSlot slot;                                                    \
    ddtree::CandShared& s = *reinterpret_cast<ddtree::CandShared*>(smem);                    \
    ddtree::set_phase_clocks(s, nullptr);  /* keeps no diagnostics */                       \
    const int row = blockIdx.x / ddtree::kCandCluster;                                      \
    const T* r = ddtree::row_of<T>(p, row);                                                 \
    const long long at = static_cast<long long>(row) * p.K;                                 \
    ddtree::candidates_cluster_row<T>(r, p.s2, p.V, p.K, p.out.topk_logprobs + at,         \
                                      p.out.topk_ids + at, p.scratch.eligible + row,        \
                                      p.scratch.bad + row, s, slot);                        \
  }

DDTREE_CANDIDATES_CLUSTER(ddtree_candidates_cluster_f32, float)
DDTREE_CANDIDATES_CLUSTER(ddtree_candidates_cluster_f16, __half)
DDTREE_CANDIDATES_CLUSTER(ddtree_candidates_cluster_bf16, __nv_bfloat16)

namespace ddtree {

// The tokens of this launch's part `part` of row `row`: (first token, count, address).
template <typename T>
struct Part {
  long long first;
  int len;
  const T* ptr;
  long long at;  // the part's index in the [rows, parts] arrays

  __device__ Part(const PartialParams& p, int part, int row) {
    const int b = row / p.L, d = row % p.L;
    first = static_cast<long long>(part) * p.chunk;
    len = static_cast<int>(min(static_cast<long long>(p.chunk), p.V - first));
    ptr = static_cast<const T*>(p.logits) + static_cast<long long>(b) * p.s0 +
          static_cast<long long>(d) * p.s1 + first * p.s2;
    at = static_cast<long long>(row) * p.parts + p.part_base + part;
  }
};

}  // namespace ddtree

#define DDTREE_PARTIALS(NAME, SUMS, T)                                                      \
  extern "C" __global__ void __launch_bounds__(ddtree::kCandThreads)                      \
      NAME(const __grid_constant__ ddtree::PartialParams p) {                             \
    extern __shared__ __align__(16) char smem[];                                            \
    ddtree::CandShared& s = *reinterpret_cast<ddtree::CandShared*>(smem);                    \
    ddtree::set_phase_clocks(s, nullptr);  /* keeps no diagnostics */                       \
    const ddtree::Part<T> part(p, blockIdx.y, blockIdx.x);                                   \
    ddtree::partial_row<T>(part.ptr, p.s2, part.len, p.K, p.id0 + part.first,               \
                           p.values + part.at * p.K, p.ids + part.at * p.K,                 \
                           p.maxima + part.at, p.bad + part.at, s);                         \
  }                                                                                         \
  extern "C" __global__ void __launch_bounds__(ddtree::kSumThreads)                       \
      SUMS(const __grid_constant__ ddtree::PartialParams p) {                             \
    __shared__ ddtree::U128 scratch[32];                                                    \
    __shared__ float max_scratch[32];                                                       \
    const ddtree::Part<T> part(p, blockIdx.y, blockIdx.x);                                   \
    const long long row0 = static_cast<long long>(blockIdx.x) * p.parts;                    \
    const float m = ddtree::parts_max(p.maxima + row0, p.parts, max_scratch);               \
    ddtree::partial_sum_row<T>(part.ptr, p.s2, part.len, m,                                 \
                               reinterpret_cast<ddtree::U128*>(p.sums) + part.at, scratch); \
  }

DDTREE_PARTIALS(ddtree_partials_f32, ddtree_partial_sums_f32, float)
DDTREE_PARTIALS(ddtree_partials_f16, ddtree_partial_sums_f16, __half)
DDTREE_PARTIALS(ddtree_partials_bf16, ddtree_partial_sums_bf16, __nv_bfloat16)

extern "C" __global__ void __launch_bounds__(ddtree::kCandThreads)
    ddtree_merge_partials(const __grid_constant__ ddtree::PartialParams p) {
  extern __shared__ __align__(16) char smem[];
  ddtree::CandShared& s = *reinterpret_cast<ddtree::CandShared*>(smem);
  ddtree::set_phase_clocks(s, nullptr);  // keeps no diagnostics
  const long long row = blockIdx.x, at = row * p.parts;
  ddtree::merge_row(p.values + at * p.K, p.ids + at * p.K, p.maxima + at, p.bad + at,
                    reinterpret_cast<const ddtree::U128*>(p.sums) + at, p.parts, p.K,
                    p.lp + row * p.K, p.ti + row * p.K, p.eligible + row, p.row_bad + row, s);
}
