// Entry point of SPEC stage 2: one block of kSelectThreads per request runs the parallel
// threshold selection (include/ddtree/select_parallel.cuh); when ties defeat it, or when
// asked (`best_first`: the launcher's choice up to B = 31, or forced for benchmarks and
// tests), warp 0 runs the best-first frontier (include/ddtree/select.cuh) on the same shared
// memory. Both give SPEC's order exactly.
// Also decides each request's status (status.h: NaN/+inf draft logits, a root token outside
// the vocabulary, a negative prefix length); a rejected request gets the root only.
#include "ddtree/params.h"
#include "ddtree/select_parallel.cuh"

static_assert(ddtree::kStatSlots == ddtree::kSelectStatSlots,
              "the stage-1 diagnostics start after the selection's slots");

extern "C" __global__ void __launch_bounds__(ddtree::kSelectThreads, 1)
    ddtree_select(const __grid_constant__ ddtree::BuildParams p) {
  float* __restrict__ lp = p.out.topk_logprobs;
  long long* __restrict__ ti = p.out.topk_ids;
  const int* __restrict__ eligible = p.scratch.eligible;
  const int* __restrict__ bad = p.scratch.bad;
  const long long* __restrict__ roots = p.roots;
  const long long* __restrict__ prefix = p.prefix;
  const int L = p.L, K = p.K, V = p.V, budget = p.budget;
  extern __shared__ __align__(16) char smem[];
  __shared__ int s_eligible[ddtree::kMaxSelectDepth];
  __shared__ ddtree::BlockScratch bs;
  bs.reset_stats();
  const int b = blockIdx.x;
  const int q = budget + 1;
  // Every input the status and the selection start from, loaded together: one round trip
  // to memory, not one per condition.
  const long long root = roots[b], prefix_len = prefix[b];
  for (int d = threadIdx.x; d < L; d += blockDim.x) s_eligible[d] = min(eligible[b * L + d], K);
  int code = 0;
#pragma unroll
  for (int d = 0; d < ddtree::kMaxSelectDepth; ++d)
    if (d < L && bad[b * L + d]) code = ddtree::kStatusNonFinite;
  if (code == 0 && (root < 0 || root >= V)) code = ddtree::kStatusRootOutOfVocab;
  if (code == 0 && prefix_len < 0) code = ddtree::kStatusNegativePrefix;
  __syncthreads();
  const long long row = static_cast<long long>(b) * q;
  const long long cand = static_cast<long long>(b) * L * K;
  const ddtree::TreePtrs& t = p.out;
  ddtree::SelectOut out{t.verify_ids + row,  t.depths + row,       t.parents + row,
                        t.first_child + row, t.next_sibling + row, t.scores + row};
  int n = -1;
  if (code == 0 && !p.best_first)
    n = ddtree::select_parallel(lp + cand, ti + cand, s_eligible, L, K, budget, out,
                                ddtree::Store::carve(smem), bs);
  if (n < 0) {
    __syncthreads();  // the parallel attempt's shared memory is reused
    if (threadIdx.x == 0) bs.stat[ddtree::kStatPath] = 2;
    if (threadIdx.x < ddtree::kWarp) {
      ddtree::SelectSmem s = ddtree::SelectSmem::carve(smem, budget, L, K, p.cache_lp != 0);
      n = ddtree::select_request(lp + cand, ti + cand, eligible + b * L, L, K, budget,
                                 code != 0, out, s);
    }
    __syncthreads();
  }
  if (code != 0) {  // as on the CPU: a rejected request shows no candidates
    for (int i = threadIdx.x; i < L * K; i += blockDim.x) {
      lp[cand + i] = -INFINITY;
      ti[cand + i] = -1;
    }
  }
  if (threadIdx.x == 0) {
    t.num_nodes[b] = n;
    t.status[b] = code;
  }
  __syncthreads();
  if (p.scratch.stats != nullptr)  // diagnostics only (null on every real build)
    for (int i = threadIdx.x; i < ddtree::kStatSlots; i += blockDim.x)
      p.scratch.stats[b * ddtree::kStatSlots + i] = bs.stat[i];
}
