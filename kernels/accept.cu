// Entry points of SPEC stage 4 (see include/ddtree/accept.cuh): a cluster of
// kAcceptCluster blocks per request, grid (bs * kAcceptCluster). The sampling arguments are
// null for a greedy batch; otherwise each request's temperature decides (<= 0: greedy).
// Dynamic shared memory: each block's row slice when `cache_slice` (for the sampling
// passes), then the tree's links (3 * Q ints) when Q <= kLinkCap.
#include "ddtree/accept.cuh"

template <typename T>
__device__ void accept_entry(const T* logits, long long s0, long long s1, long long s2, int V,
                             int q, int path_len, const long long* verify_ids,
                             const long long* first_child, const long long* next_sibling,
                             long long* accepted_nodes, long long* accepted_tokens,
                             long long* accept_index, long long* accept_len, long long* bonus,
                             int* status, const float* temperature, const int* top_k, const float* top_p,
                             const long long* rng, int cache_slice) {
  __shared__ ddtree::AcceptScratch s;
  extern __shared__ uint4 dynamic_smem[];
  const int b = blockIdx.x / ddtree::kAcceptCluster;
  const int rank = static_cast<int>(cooperative_groups::this_cluster().block_rank());
  const long long row = static_cast<long long>(b) * q, path = static_cast<long long>(b) * path_len;
  const ddtree::SampleArgs args{temperature, top_k, top_p, rng};
  ddtree::accept_request<T>(
      logits + b * s0, s1, s2, V, q, path_len, b, rank,
      ddtree::AcceptTree{verify_ids + row, first_child + row, next_sibling + row},
      ddtree::AcceptOut{accepted_nodes + path, accepted_tokens + path, accept_index + path,
                        accept_len + b, bonus + b, status + b},
      temperature != nullptr ? &args : nullptr,
      cache_slice ? reinterpret_cast<T*>(dynamic_smem) : nullptr,
      reinterpret_cast<int*>(dynamic_smem) +
          (cache_slice ? ddtree::accept_slice_len(V) * sizeof(T) / sizeof(int) : 0),
      s);
}

#define DDTREE_ACCEPT(NAME, T)                                                                 \
  extern "C" __global__ void __cluster_dims__(ddtree::kAcceptCluster, 1, 1)                    \
      __launch_bounds__(ddtree::kAcceptThreads, ddtree::kMinAcceptBlocks) NAME(                                          \
          const T* logits, long long s0, long long s1, long long s2, int V, int q,             \
          int path_len, const long long* verify_ids, const long long* first_child,             \
          const long long* next_sibling, long long* accepted_nodes,                            \
          long long* accepted_tokens, long long* accept_index, long long* accept_len,          \
          long long* bonus, int* status, const float* temperature, const int* top_k,           \
          const float* top_p, const long long* rng, int cache_slice) {                         \
    accept_entry<T>(logits, s0, s1, s2, V, q, path_len, verify_ids, first_child, next_sibling, \
                    accepted_nodes, accepted_tokens, accept_index, accept_len, bonus, status,  \
                    temperature, top_k, top_p, rng, cache_slice);                              \
  }

DDTREE_ACCEPT(ddtree_accept_f32, float)
DDTREE_ACCEPT(ddtree_accept_f16, __half)
DDTREE_ACCEPT(ddtree_accept_bf16, __nv_bfloat16)

// Advances the generator's offset after a sampling accept, so that the next call (or the
// next replay of a graph that captured it) draws fresh numbers.
extern "C" __global__ void ddtree_advance_rng(long long* rng) { rng[1] += 1; }

// Scalar sampling parameters for every request and/or a new seed, in one launch
// (include/ddtree/sample.cuh).
extern "C" __global__ void ddtree_load_sampling(const __grid_constant__ ddtree::SamplingLoad a) {
  ddtree::load_sampling(a);
}
