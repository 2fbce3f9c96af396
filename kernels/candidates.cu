// Entry points of SPEC stage 1 (see include/ddtree/candidates.cuh): one block per
// (request, depth) row; row r = b * L + d reads logits + b*s0 + d*s1 with vocab stride s2.
#include "ddtree/candidates.cuh"

#define DDTREE_CANDIDATES(NAME, T)                                                        \
  extern "C" __global__ void __launch_bounds__(ddtree::kCandThreads)                    \
      NAME(const T* __restrict__ logits, long long s0, long long s1, long long s2, int L, \
           int V, int K, float* __restrict__ lp, long long* __restrict__ ti,              \
           int* __restrict__ eligible, int* __restrict__ bad) {                          \
    extern __shared__ __align__(16) char smem[];                                          \
    ddtree::CandShared& s = *reinterpret_cast<ddtree::CandShared*>(smem);                  \
    const int row = blockIdx.x;                                                           \
    const int b = row / L, d = row % L;                                                   \
    const T* r = logits + static_cast<long long>(b) * s0 + static_cast<long long>(d) * s1; \
    ddtree::candidates_row<T>(r, s2, V, K, lp + static_cast<long long>(row) * K,          \
                              ti + static_cast<long long>(row) * K, eligible + row,       \
                              bad + row, s);                                              \
  }

DDTREE_CANDIDATES(ddtree_candidates_f32, float)
DDTREE_CANDIDATES(ddtree_candidates_f16, __half)
DDTREE_CANDIDATES(ddtree_candidates_bf16, __nv_bfloat16)
