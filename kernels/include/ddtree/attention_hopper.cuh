// Tree verify attention on Hopper (sm_90a): the same blocks, splits and results as
// attention.cuh's attention_block, with warpgroup MMA (wgmma) in place of mma.sync and the
// 227 KB of shared memory an H100/H200 block may have.
//
// A block has RG warpgroups of 128 threads. Warpgroup rg owns 64 query rows (rows 64 * rg
// ..) and all DVW value columns. Per tile of KT = 64 keys it computes S = Q K^T for its rows
// with Q and K both read from shared memory by the tensor cores (no ldmatrix, no register
// copy of Q), runs the online softmax in registers (RowSoftmax, the same as the portable
// kernel), and adds O += P V with P from registers and V from shared memory. It serves head
// dim 256; 64 and 128 take the warp-specialized kernel (attention_hopper_ws.cuh), MLA the
// seesaw one (attention_hopper_mla.cuh).
//
// Shared memory holds Q, K and V in the tensor cores' 128-byte swizzled layout: a matrix is
// stored as column blocks of 64 elements (128 bytes), each block rows x 128 bytes, and the
// 16-byte chunk c of row r sits at chunk position c ^ (r % 8). K/V tiles are gathered from the
// paged pool by cp.async, ST stages in flight; a key's page id comes from the page table, or
// (tiles of which an SM holds one block) from shared memory where it was staged a tile ahead.
#pragma once
#include "attention.cuh"
#include "wgmma.cuh"

namespace ddtree {

template <int D, int DVW, int RG, bool SI, int ST = 2>
struct HopperTile {
  static constexpr int KT = 64;                // keys per tile (the N of the S product)
  static constexpr int BM = 64 * RG;           // query rows per block
  static constexpr int kThreads = 128 * RG;
  static constexpr int kStages = ST;
  static constexpr size_t kQ = static_cast<size_t>(BM) * D;   // elements of each buffer
  static constexpr size_t kK = static_cast<size_t>(KT) * D;
  static constexpr size_t kV = static_cast<size_t>(KT) * DVW;
  // SI: the page-table entries of the next two tiles (8 bytes each; int32 ids use the low 4).
  static constexpr size_t kIdx = SI ? 2 * KT : 0;
  // 16-bit elements and the entries, plus 1 KB to align the buffers to the swizzle's
  // 1024-byte period.
  static constexpr size_t kSmem = 2 * (kQ + ST * (kK + kV)) + 8 * kIdx + 1024;
  static_assert(ST == 2, "the page-table entries are staged for exactly the next tile");
  static_assert(D % 64 == 0 && DVW % 64 == 0, "whole 128-byte column blocks");
  static_assert(kSmem <= 227 * 1024, "a Hopper block has at most 227 KB of shared memory");
};

// Element offset of 16-byte chunk c of row r in a swizzled matrix of `rows` rows.
__device__ __forceinline__ int swizzled(int r, int c, int rows) {
  return (c >> 3) * rows * 64 + r * 64 + (((c & 7) ^ (r & 7)) << 3);
}

// A wgmma shared-memory descriptor with 128-byte swizzle: start address, leading and stride
// byte offsets (each in 16-byte units). Adding n to it moves the start by 16 * n bytes.
__device__ __forceinline__ uint64_t smem_desc(const void* ptr, uint32_t lbo, uint32_t sbo) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
  return static_cast<uint64_t>((a & 0x3FFFF) >> 4) | (static_cast<uint64_t>(lbo >> 4) << 16) |
         (static_cast<uint64_t>(sbo >> 4) << 32) | (1ull << 62);
}
// A swizzled matrix read K-major (Q, K, P): rows 128 bytes apart, 8-row groups 1024 apart.
__device__ __forceinline__ uint64_t kmajor_desc(const void* ptr) {
  return smem_desc(ptr, 16, 1024);
}
// A swizzled tile of `keys` rows read MN-major, transposed (V): 8-key groups 1024 bytes
// apart, 64-column blocks keys * 128 apart.
__device__ __forceinline__ uint64_t mnmajor_desc(const void* ptr, int keys) {
  return smem_desc(ptr, keys * 128, 1024);
}

// Makes this thread's writes to shared memory by ordinary stores and cp.async visible to
// the tensor cores' (async proxy) reads after the next barrier.
__device__ __forceinline__ void fence_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// O += P V for one k16 step: DVW value columns from registers' P and the swizzled V block.
template <bool kHalf, int DVW>
__device__ __forceinline__ void pv_step(float* acc, const uint32_t* a, uint64_t v) {
  if constexpr (DVW == 64)
    wgmma::rs_n64<kHalf>(acc, a, v, 1);
  else if constexpr (DVW == 128)
    wgmma::rs_n128<kHalf>(acc, a, v, 1);
  else
    wgmma::rs_n256<kHalf>(acc, a, v, 1);
}

// S = Q K^T for NS * 8 keys over column blocks [B0, B1) of the head dim, four k16 steps a
// block: step kk reads bytes 32 * (kk % 4) of column block kk / 4 of Q (BM rows) and of K
// (KT rows). kFirst: the first step overwrites s. Issued, not committed.
template <bool kHalf, int NS, int BM, int KT, int B0, int B1, bool kFirst>
__device__ __forceinline__ void qk_blocks(float* s, uint64_t q_desc, uint64_t k_desc) {
  static_assert(NS == 8 || NS == 16, "one m64n64 or m64n128 product per k step");
  wgmma::fence();
#pragma unroll
  for (int kk = 4 * B0; kk < 4 * B1; ++kk) {
    const uint32_t q_at = ((kk >> 2) * BM * 128 + (kk & 3) * 32) >> 4;
    const uint32_t k_at = ((kk >> 2) * KT * 128 + (kk & 3) * 32) >> 4;
    const int scale_d = kFirst && kk == 4 * B0 ? 0 : 1;
    if constexpr (NS == 16)
      wgmma::ss_n128<kHalf>(s, q_desc + q_at, k_desc + k_at, scale_d);
    else
      wgmma::ss_n64<kHalf>(s, q_desc + q_at, k_desc + k_at, scale_d);
  }
}
// The same over the whole head dim, committed here; qk_wait waits for it, so that other
// work runs while the tensor cores do.
template <bool kHalf, int D, int NS, int BM, int KT>
__device__ __forceinline__ void qk_issue(float* s, uint64_t q_desc, uint64_t k_desc) {
  qk_blocks<kHalf, NS, BM, KT, 0, D / 64, true>(s, q_desc, k_desc);
  wgmma::commit();
}
template <int NS>
__device__ __forceinline__ void qk_wait(float* s) {
  wgmma::wait<0>();
#pragma unroll
  for (int i = 0; i < NS * 4; ++i) wgmma::fence_operand(s[i]);
}

// wgmma::fence_operand on each element of a register array.
template <typename R, int N, int M>
__device__ __forceinline__ void fence_all(R (&r)[N][M]) {
#pragma unroll
  for (int n = 0; n < N; ++n)
#pragma unroll
    for (int m = 0; m < M; ++m) wgmma::fence_operand(r[n][m]);
}

// O += P V for one tile: KT / 16 steps of 16 keys (2048 bytes of the V block each), P from
// registers. Issued and committed; the caller waits.
template <bool kHalf, int DV, int NT>
__device__ __forceinline__ void pv_issue(float* acc, const uint32_t (&pa)[NT][2], uint64_t v) {
  wgmma::fence();
#pragma unroll
  for (int kk = 0; kk < NT / 2; ++kk) {
    const uint32_t a[4] = {pa[2 * kk][0], pa[2 * kk][1], pa[2 * kk + 1][0], pa[2 * kk + 1][1]};
    pv_step<kHalf, DV>(acc, a, v + kk * (16 * 128 / 16));
  }
  wgmma::commit();
}

// The block's BM query rows (rows w.row0 .. of M) into Q's swizzled buffer by kThreads
// threads (threads first .. of the block) in 16-byte cp.async copies, zero past M and past
// dqk: every copy of a thread is in flight at once (a load-and-store loop would wait for
// each in turn: its stores could alias the next load). Not committed; the caller commits,
// waits and fences before the tensor cores read Q.
template <typename T, int D, int BM, int kThreads>
__device__ __forceinline__ void load_q_swizzled(const AttentionParams& p, const AttnBlock& w,
                                                T* qs, int first = 0) {
  constexpr int KC = D / 8;  // 16-byte chunks of a row
  for (int i = threadIdx.x - first; i < BM * KC; i += kThreads) {
    const int r = i / KC, c = i % KC;
    const T* src = query_row<T>(p, w.b, w.g, w.row0 + r, w.group, w.m_rows);
    const bool valid = src != nullptr && c * 8 < p.dqk;
    cp_async16(qs + swizzled(r, c, BM), valid ? src + c * 8 : static_cast<const T*>(p.q), valid);
  }
}

template <typename T, int D, int DVW, int RG, bool SI, int ST = 2>
__device__ void attention_block_hopper(const AttentionParams& p, unsigned char* smem_raw) {
  using Tile = HopperTile<D, DVW, RG, SI, ST>;
  constexpr bool kHalf = std::is_same<T, __half>::value;
  constexpr int KT = Tile::KT, BM = Tile::BM, NT = KT / 8, VT = DVW / 8;
  constexpr int KC = D / 8, VC = DVW / 8;  // 16-byte chunks of a K row, a V row
  const uintptr_t base = (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023);
  T* qs = reinterpret_cast<T*>(base);
  T* kbuf = qs + Tile::kQ;         // [ST][D / 64][KT][64]
  T* vbuf = kbuf + ST * Tile::kK;  // [ST][DVW / 64][KT][64]
  long long* idx = reinterpret_cast<long long*>(vbuf + ST * Tile::kV);  // [2][KT] page ids

  AttnBlock w;
  if (!attn_block(p, BM, DVW, w)) return;
  const int b = w.b, g = w.g, col0 = w.col0, dv_here = w.dv_here;
  const long long prefix = w.prefix, k_begin = w.k_begin, k_end = w.k_end, start = w.start;
  const int tid = threadIdx.x, rg = tid / 128;
  const int warp = (tid % 128) / 32, lane = tid % 32;
  const int gr = lane >> 2, gc = lane & 3;

  // SI: the page-table entries a tile's prefix keys use (entries kt >> shift ..), copied
  // into idx[ib] by cp.async a tile before the tile's rows are gathered, so that a thread
  // reads its key's page id from shared memory, not from global memory on the tile's path.
  // That pays where an SM holds one block (head dim 256; it paid for session 8's MLA tile);
  // with two, the other block hides the read and staging measured slower (BENCHMARKS.md).
  auto stage_pages = [&](long long kt, int ib) {
    if constexpr (SI) stage_page_ids<KT>(p, idx + ib * KT, kt, k_end, prefix, start, tid);
  };
  // Loads of the tile at key kt into stage st: TPK threads per key find its row once (its
  // page id staged in idx[ib]) and copy its chunks to their swizzled places.
  constexpr int TPK = Tile::kThreads / KT;
  static_assert(Tile::kThreads % KT == 0 && KC % TPK == 0 && VC % TPK == 0,
                "a tile's keys split evenly over the threads, and their rows over a key's");
  const int my_key = tid / TPK, my_part = tid % TPK;
  auto issue = [&](long long kt, int st, int ib) {
    T* ks = kbuf + st * Tile::kK;
    T* vs = vbuf + st * Tile::kV;
    const long long t = kt + my_key;
    const bool valid = t < k_end;
    long long slot = 0;
    if (valid && t < prefix) {
      if constexpr (SI) {
        slot = staged_slot(p, idx + ib * KT, kt, t);
      } else {
        slot = prefix_slot(p, start, t);
      }
    }
    const KeyRows<T> rows = key_rows_at<T>(p, b, g, prefix, t, slot, valid, col0);
#pragma unroll
    for (int i = 0; i < KC / TPK; ++i) {
      const int c = my_part + i * TPK;
      cp_async16(ks + swizzled(my_key, c, KT), rows.k + c * 8, valid && c * 8 < p.dqk);
    }
#pragma unroll
    for (int i = 0; i < VC / TPK; ++i) {
      const int c = my_part + i * TPK;
      cp_async16(vs + swizzled(my_key, c, KT), rows.v + c * 8, valid && c * 8 < dv_here);
    }
  };
  // The first tile's page ids, then its gather with the second tile's page ids in flight.
  if constexpr (SI) {
    stage_pages(k_begin, 0);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
  }
  if (k_begin < k_end) issue(k_begin, 0, 0);
  stage_pages(k_begin + KT, 1);
  cp_async_commit();
  load_q_swizzled<T, D, BM, Tile::kThreads>(p, w, qs);
  cp_async_commit();  // the first tile's wait (all groups) covers Q's copies too

  // This thread's two rows (the m64 accumulator layout: warp w of the warpgroup holds rows
  // 16 w .. 16 w + 15, as mma.sync's m16 per warp) and their tree nodes.
  const int* bits_of[2];
  const RowsOut out = rows_out(p, w, rg * 64 + warp * 16 + gr, bits_of);
  // Descriptors: Q's rows of this warpgroup and stage 0's K and V.
  const uint64_t q_desc = kmajor_desc(qs + rg * 64 * 64);
  const uint64_t k_desc = kmajor_desc(kbuf);
  const uint64_t v_desc = mnmajor_desc(vbuf, KT);
  constexpr uint32_t kStageK = Tile::kK * 2 / 16, kStageV = Tile::kV * 2 / 16;

  RowSoftmax sm;
  float acc[VT][4];
#pragma unroll
  for (int t = 0; t < VT; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;

  int st = 0;
  for (long long kt = k_begin; kt < k_end; kt += KT, st = st + 1 == ST ? 0 : st + 1) {
    cp_async_wait<ST - 2>();
    fence_async_shared();  // this thread's copies (and Q's stores) to the tensor cores
    __syncthreads();
    // S = Q K^T for this warpgroup's rows and the tile's KT keys. While the tensor cores
    // compute it, this thread issues its share of the next tile's gather (a page-table read
    // and cp.async copies).
    float s[NT][4];
    qk_issue<kHalf, D, NT, BM, KT>(&s[0][0], q_desc, k_desc + st * kStageK);
    {
      // Tile t + 1 into the stage tile t - 1 used, with its page ids (staged last tile,
      // idx[1 - st] now that st counts tiles mod 2), and tile t + 2's page ids.
      const long long ahead = kt + KT;
      if (ahead < k_end) issue(ahead, 1 - st, 1 - st);
      stage_pages(ahead + KT, st);
      cp_async_commit();
    }
    qk_wait<NT>(&s[0][0]);
    float tile_max[2];
    score_tile(p, s, kt, k_end, prefix, bits_of, gc, tile_max);
    uint32_t pa[NT][2];
    sm.update<T>(s, tile_max, acc, pa);

    // O += P V: KT / 16 steps of 16 keys (2048 bytes of the V block each).
    pv_issue<kHalf, DVW>(&acc[0][0], pa, v_desc + st * kStageV);
    wgmma::wait<0>();  // the stage is free for the refill after the next barrier
    fence_all(acc);
  }
  cp_async_wait<0>();  // nothing in flight at exit (Q's copies, when the split had no tile)
  sm.finish();
  write_rows<T>(p, out, acc, sm, 0, gc);
}

}  // namespace ddtree
