// Entry points of the Hopper tree verify attention (include/ddtree/attention_hopper.cuh),
// compiled for sm_90a only (wgmma) into its own module, which the Rust crate loads on a
// compute capability 9.0 device; the index check and the merge are attention.cu's.
#include "ddtree/attention_hopper_mla.cuh"

// grid (row_tiles * dv_chunks, splits, bs * Hkv), 128 * RG threads, HopperTile::kSmem
// bytes. (D, DVW, RG, MINB): head dim, value columns, warpgroups over the rows (64 each),
// blocks an SM should hold (2 caps a thread at 128 registers); an SM that holds one block
// stages each tile's page ids in shared memory a tile ahead.
#define DDTREE_ATTENTION_HOPPER(NAME, T, D, DVW, RG, MINB)                     \
  extern "C" __global__ void __launch_bounds__(128 * RG, MINB)               \
      NAME(const __grid_constant__ ddtree::AttentionParams p) {              \
    extern __shared__ __align__(1024) unsigned char smem[];                  \
    ddtree::attention_block_hopper<T, D, DVW, RG, MINB == 1>(p, smem);       \
  }

#define DDTREE_ATTENTION_HOPPER_DTYPES(NAME, D, DVW, RG, MINB)                                   \
  DDTREE_ATTENTION_HOPPER(ddtree_attention_sm90a_bf16_##NAME, __nv_bfloat16, D, DVW, RG, MINB) \
  DDTREE_ATTENTION_HOPPER(ddtree_attention_sm90a_f16_##NAME, __half, D, DVW, RG, MINB)

// grid as above, 384 threads (a producer warpgroup, two consumers of 64 rows each),
// WsTile::kSmem bytes. (D, DV, KT, ST): head dim, value columns, keys per tile, stages.
#define DDTREE_ATTENTION_HOPPER_WS(NAME, T, D, DV, KT, ST)                        \
  extern "C" __global__ void __launch_bounds__(384, 1)                           \
      NAME(const __grid_constant__ ddtree::AttentionParams p) {                  \
    extern __shared__ __align__(1024) unsigned char smem[];                      \
    ddtree::attention_block_ws<T, D, DV, KT, ST>(p, smem);                       \
  }
#define DDTREE_ATTENTION_HOPPER_WS_DTYPES(NAME, D, DV, KT, ST)                                    \
  DDTREE_ATTENTION_HOPPER_WS(ddtree_attention_sm90a_bf16_##NAME, __nv_bfloat16, D, DV, KT, ST) \
  DDTREE_ATTENTION_HOPPER_WS(ddtree_attention_sm90a_f16_##NAME, __half, D, DV, KT, ST)

// grid as above, 384 threads (a producer warpgroup, two consumers of half the value columns
// each), MlaTile::kSmem bytes: MLA's absorbed form (head dim 576, V the first 512 columns).
#define DDTREE_ATTENTION_HOPPER_MLA(NAME, T)                                     \
  extern "C" __global__ void __launch_bounds__(384, 1)                           \
      NAME(const __grid_constant__ ddtree::AttentionParams p) {                  \
    extern __shared__ __align__(1024) unsigned char smem[];                      \
    ddtree::attention_block_mla<T>(p, smem);                                     \
  }

DDTREE_ATTENTION_HOPPER_WS_DTYPES(d64, 64, 64, 128, 4)
DDTREE_ATTENTION_HOPPER_WS_DTYPES(d128, 128, 128, 128, 3)
DDTREE_ATTENTION_HOPPER_DTYPES(d256, 256, 256, 2, 1)
DDTREE_ATTENTION_HOPPER_MLA(ddtree_attention_sm90a_bf16_d576vk, __nv_bfloat16)
DDTREE_ATTENTION_HOPPER_MLA(ddtree_attention_sm90a_f16_d576vk, __half)
