// Entry points of the tree verify attention (include/ddtree/attention.cuh): the per-request
// index check, the attention blocks per (dtype, head-dim tile) and the split merge. Every
// kernel takes the one AttentionParams struct by value (__grid_constant__).
#include "ddtree/attention.cuh"
#include "ddtree/attention_mla.cuh"

// grid (blocks per request, bs), 256 threads; status already kStatusOk.
extern "C" __global__ void __launch_bounds__(256)
    ddtree_attention_check(const __grid_constant__ ddtree::AttentionParams p) {
  ddtree::attention_check(p, blockIdx.y);
}

// grid (row_tiles * dv_chunks, splits, bs * Hkv), 32 * W threads, AttnTile::kSmem bytes.
// (D, DVC, W, KT, ST, MT): head dim, value columns, warps, keys per tile, tiles in flight,
// m16 row tiles per warp — each under the 99 KB of shared memory a block may have on sm_120
// (asserted here at compile time, and by crates/ddtree-cuda's tests).
#define DDTREE_ATTENTION(NAME, T, D, DVC, W, KT, ST, MT)                                \
  extern "C" __global__ void __launch_bounds__(32 * W)                                  \
      NAME(const __grid_constant__ ddtree::AttentionParams p) {                         \
    static_assert(ddtree::AttnTile<T, D, DVC, W, KT, ST, MT>::kSmem <= 99 * 1024,       \
                  "over the 99 KB of shared memory a block may have on sm_120");        \
    extern __shared__ __align__(16) unsigned char smem[];                               \
    ddtree::attention_block<T, D, DVC, W, KT, ST, MT>(p, smem);                         \
  }

DDTREE_ATTENTION(ddtree_attention_bf16_d64, __nv_bfloat16, 64, 64, 4, 64, 2, 1)
DDTREE_ATTENTION(ddtree_attention_bf16_d128, __nv_bfloat16, 128, 128, 4, 32, 2, 2)
DDTREE_ATTENTION(ddtree_attention_bf16_d256, __nv_bfloat16, 256, 128, 4, 32, 2, 1)
DDTREE_ATTENTION(ddtree_attention_bf16_d576, __nv_bfloat16, 576, 256, 2, 16, 2, 1)
DDTREE_ATTENTION(ddtree_attention_f16_d64, __half, 64, 64, 4, 64, 2, 1)
DDTREE_ATTENTION(ddtree_attention_f16_d128, __half, 128, 128, 4, 32, 2, 2)
DDTREE_ATTENTION(ddtree_attention_f16_d256, __half, 256, 128, 4, 32, 2, 1)
DDTREE_ATTENTION(ddtree_attention_f16_d576, __half, 576, 256, 2, 16, 2, 1)

// MLA's absorbed form (V the first dv ≤ 512 columns of K, head dim ≤ 576): PortableMlaTile,
// 64 rows and every value column a block. grid (row_tiles, splits, bs * Hkv), 256 threads,
// PortableMlaTile::kSmem bytes.
#define DDTREE_ATTENTION_MLA(NAME, T)                                                   \
  extern "C" __global__ void __launch_bounds__(ddtree::PortableMlaTile<T>::kThreads)    \
      NAME(const __grid_constant__ ddtree::AttentionParams p) {                         \
    static_assert(ddtree::PortableMlaTile<T>::kSmem <= 99 * 1024,                       \
                  "over the 99 KB of shared memory a block may have on sm_120");        \
    extern __shared__ __align__(16) unsigned char smem[];                               \
    ddtree::attention_mla_block<T>(p, smem);                                            \
  }
DDTREE_ATTENTION_MLA(ddtree_attention_bf16_d576vk, __nv_bfloat16)
DDTREE_ATTENTION_MLA(ddtree_attention_f16_d576vk, __half)

// grid (M, bs * Hkv), 128 threads: the splits' partials of each query row merged.
extern "C" __global__ void __launch_bounds__(128)
    ddtree_attention_merge_bf16(const __grid_constant__ ddtree::AttentionParams p) {
  ddtree::attention_merge<__nv_bfloat16>(p);
}
extern "C" __global__ void __launch_bounds__(128)
    ddtree_attention_merge_f16(const __grid_constant__ ddtree::AttentionParams p) {
  ddtree::attention_merge<__half>(p);
}
