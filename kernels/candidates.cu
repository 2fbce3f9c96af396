// Entry points of SPEC stage 1 (see include/ddtree/candidates.cuh): one block per
// (request, depth) row; row r = b * L + d reads logits + b*s0 + d*s1 with vocab stride s2.
#include "ddtree/candidates.cuh"
#include "ddtree/params.h"

#define DDTREE_CANDIDATES(NAME, T)                                                          \
  extern "C" __global__ void __launch_bounds__(ddtree::kCandThreads)                      \
      NAME(const __grid_constant__ ddtree::BuildParams p) {                               \
    extern __shared__ __align__(16) char smem[];                                            \
    ddtree::CandShared& s = *reinterpret_cast<ddtree::CandShared*>(smem);                    \
    const int row = blockIdx.x;                                                             \
    const int b = row / p.L, d = row % p.L;                                                 \
    const T* r = static_cast<const T*>(p.logits) + static_cast<long long>(b) * p.s0 +       \
                 static_cast<long long>(d) * p.s1;                                          \
    const long long at = static_cast<long long>(row) * p.K;                                 \
    ddtree::candidates_row<T>(r, p.s2, p.V, p.K, p.out.topk_logprobs + at,                 \
                              p.out.topk_ids + at, p.scratch.eligible + row,                \
                              p.scratch.bad + row, s);                                      \
  }

DDTREE_CANDIDATES(ddtree_candidates_f32, float)
DDTREE_CANDIDATES(ddtree_candidates_f16, __half)
DDTREE_CANDIDATES(ddtree_candidates_bf16, __nv_bfloat16)
