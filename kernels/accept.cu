// Entry points of SPEC stage 4 (see include/ddtree/accept.cuh): a cluster of
// kAcceptCluster blocks per request, grid (bs * kAcceptCluster). The sampling pointers are
// null for a greedy batch (the kernels without `sampled`); otherwise each request's
// temperature decides (<= 0: greedy).
// Dynamic shared memory: each block's row slice when kAcceptCacheSlice (for the sampling
// passes), then the tree's links (3 * Q ints) when Q <= kLinkCap.
#include "ddtree/accept.cuh"
#include "ddtree/accept_shard.cuh"
#include "ddtree/params.h"

template <typename T, bool kSampling>
__device__ void accept_entry(const ddtree::AcceptParams& p) {
  __shared__ ddtree::AcceptScratch s;
  extern __shared__ uint4 dynamic_smem[];
  const int b = blockIdx.x / ddtree::kAcceptCluster;
  const int rank = static_cast<int>(cooperative_groups::this_cluster().block_rank());
  const long long row = static_cast<long long>(b) * p.q, path = static_cast<long long>(b) * p.path_len;

  const T* logits = static_cast<const T*>(p.logits);
  const bool cache = (p.flags & ddtree::kAcceptCacheSlice) != 0;
  ddtree::accept_request<T, kSampling>(
      logits + b * p.s0, p.s1, p.s2, p.V, p.q, p.path_len, b, rank,
      ddtree::AcceptTree{p.tree.verify_ids + row, p.tree.first_child + row,
                         p.tree.next_sibling + row},
      ddtree::AcceptOut{p.out.accepted_nodes + path, p.out.accepted_tokens + path,
                        p.out.accept_index + path, p.out.accept_len + b, p.out.bonus + b,
                        p.out.status + b},
      p.sampling.temperature != nullptr ? &p.sampling : nullptr,
      (p.flags & ddtree::kAcceptExhaustive) != 0, cache ? reinterpret_cast<T*>(dynamic_smem) : nullptr,
      reinterpret_cast<int*>(dynamic_smem) +
          (cache ? ddtree::accept_slice_len(p.V) * sizeof(T) / sizeof(int) : 0),
      s);
}

// A greedy batch runs the kernel without the sampling code (its registers are the draw's
// to spend); a sampled batch the one with it, where a request at temperature 0 is greedy.
#define DDTREE_ACCEPT(NAME, T, SAMPLING)                                             \
  extern "C" __global__ void __cluster_dims__(ddtree::kAcceptCluster, 1, 1)          \
      __launch_bounds__(ddtree::kAcceptThreads, ddtree::kMinAcceptBlocks)            \
          NAME(const __grid_constant__ ddtree::AcceptParams p) {                     \
    accept_entry<T, SAMPLING>(p);                                                    \
  }

DDTREE_ACCEPT(ddtree_accept_f32, float, false)
DDTREE_ACCEPT(ddtree_accept_f16, __half, false)
DDTREE_ACCEPT(ddtree_accept_bf16, __nv_bfloat16, false)
DDTREE_ACCEPT(ddtree_accept_sampled_f32, float, true)
DDTREE_ACCEPT(ddtree_accept_sampled_f16, __half, true)
DDTREE_ACCEPT(ddtree_accept_sampled_bf16, __nv_bfloat16, true)

// Advances the generator's offset after a sampling accept, so that the next call (or the
// next replay of a graph that captured it) draws fresh numbers.
extern "C" __global__ void ddtree_advance_rng(const __grid_constant__ ddtree::AcceptParams p) {
  p.sampling.rng[1] += 1;
}

// Scalar sampling parameters for every request and/or a new seed, in one launch
// (include/ddtree/sample.cuh).
extern "C" __global__ void ddtree_load_sampling(const __grid_constant__ ddtree::SamplingLoad a) {
  ddtree::load_sampling(a);
}

// Vocab-parallel accept (include/ddtree/accept_shard.cuh). Grid (bs * Q): a node row of
// this rank's shard per block, its greedy and draw keys.
#define DDTREE_SHARD_KEYS(NAME, T)                                                   \
  extern "C" __global__ void __launch_bounds__(ddtree::kShardKeyThreads)             \
      NAME(const __grid_constant__ ddtree::ShardKeyParams p) {                       \
    ddtree::shard_keys<T>(p);                                                        \
  }

DDTREE_SHARD_KEYS(ddtree_shard_keys_f32, float)
DDTREE_SHARD_KEYS(ddtree_shard_keys_f16, __half)
DDTREE_SHARD_KEYS(ddtree_shard_keys_bf16, __nv_bfloat16)

// Grid (bs): the walk of a request along the gathered keys; dynamic shared memory holds
// the tree's links (3 * Q ints) when Q <= kLinkCap.
extern "C" __global__ void __launch_bounds__(ddtree::kKeyWalkThreads)
    ddtree_walk_keys(const __grid_constant__ ddtree::KeyWalkParams p) {
  extern __shared__ int walk_links[];
  ddtree::walk_keys(p, walk_links);
}
