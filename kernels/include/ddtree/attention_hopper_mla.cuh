// Tree verify attention on Hopper for MLA's absorbed form (head dim 576, values the first 512
// columns of the keys): the same blocks, splits and results as the portable kernel's d576vk
// tile (attention.cuh), scheduled as FlashMLA's "seesaw" so that the tensor cores rarely
// wait.
//
// A block holds 64 query rows, whose 64 x 512 fp32 output is half the register file, so it
// cannot be doubled for FlashAttention-3's ping-pong. Instead the two consumer warpgroups
// each own half of the output columns (O_L, O_R) and take alternate tiles of 64 keys: in a
// round, consumer 0 computes S for the even tile (buffer 0) and consumer 1 for the odd tile
// (buffer 1), each over all 576 dims, so that one's softmax runs while the other's products
// do. They share one running maximum through shared memory: consumer 0 moves it for its
// tile, consumer 1 moves it further for its own, and consumer 0 then rescales its weights
// to the final maximum before handing them over. Each consumer adds its own tile's P V
// from registers and the other's from shared memory (P0 in buffer 0's RoPE block, which S
// no longer needs; P1 in its own 8 KB). The third warpgroup (the producer, registers given
// up by setmaxnreg) gathers the tiles by cp.async in halves (column blocks 0-3, which are
// also O_L's values, and 4-8), each half with a `ready` mbarrier the copies complete and a
// `free` one the last warpgroup to read it arrives on, so that a half reloads as soon as it
// is read, not when the whole round is.
#pragma once
#include "attention_hopper_ws.cuh"

namespace ddtree {

struct MlaTile {
  static constexpr int D = 576, DV = 512, KT = 64, BM = 64;
  static constexpr int kThreads = 3 * 128;  // the producer's warpgroup first
  // setmaxnreg within the block's launch registers, 3 * 168 a lane (WsTile says why).
  static constexpr int kProducerRegs = 72;
  static constexpr int kConsumerRegs = 216;
  static_assert(kProducerRegs + 2 * kConsumerRegs <= 3 * 168, "the block's launch registers");
  static constexpr int kBlocks = D / 64;      // 128-byte column blocks of a row
  static constexpr int kLeft = DV / 2 / 64;   // blocks of a tile's left half (O_L's values)
  static constexpr size_t kQ = static_cast<size_t>(BM) * D;  // elements of each buffer
  static constexpr size_t kK = static_cast<size_t>(KT) * D;
  static constexpr size_t kP = static_cast<size_t>(BM) * KT;
  // Q, two tiles and P1; four ready, four free and two maximum mbarriers; the shared
  // maximum and the two warpgroups' row sums (fp32); a round's pool slots (4 bytes each);
  // 1 KB to align to the swizzle's period.
  static constexpr size_t kSmem =
      2 * (kQ + 2 * kK + kP) + 10 * 8 + 4 * 3 * BM + 4 * 2 * KT + 1024;
  static_assert(kSmem <= 227 * 1024, "a Hopper block has at most 227 KB of shared memory");
};

// Named barriers between the two consumers (0 is __syncthreads). kP0 and kP1 hand over the
// weights: each is arrived on by one and waited on by the other once a round, in an order
// that never lets one arrive twice. Both consumers wait on kSums and kQ. The maximum, which the
// consumers read with ordinary loads, goes through mbarriers instead: compute-sanitizer's
// racecheck does not see the ordering bar.arrive gives.
enum MlaBarrier : int { kP0 = 1, kP1 = 2, kSums = 3, kQ = 4, kProducer = 5 };
__device__ __forceinline__ void bar_arrive(int id) {
  asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory");
}
__device__ __forceinline__ void bar_sync(int id) {
  asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory");
}
// The producer warpgroup's own barrier (kProducer, its 128 threads).
__device__ __forceinline__ void bar_sync_producer() {
  asm volatile("bar.sync %0, 128;\n" ::"n"(static_cast<int>(kProducer)) : "memory");
}

// The producer: rounds of two tiles (keys k_begin + 128 r .., buffer 0, and 64 on, buffer
// 1), each half once the warpgroup that read it last has freed it. Thread k loads the page
// of the round's key k a round ahead and posts the key's slot (or kRowTree / kRowNone) in
// `rows` at the round's start, as ws_produce does a tile's. Eight threads take a key, 16
// keys a pass, as there: thread `part` copies chunk `part` of each of the key's column
// blocks to the same swizzled place of every pass. Keys past the split copy nothing
// (zero-filled); the consumers mask them.
template <typename T>
__device__ __forceinline__ void mla_produce(const AttentionParams& p, const AttnBlock& w,
                                            T* kbuf, uint32_t* rows, uint64_t* ready,
                                            uint64_t* free_bar, int rounds) {
  constexpr int KT = MlaTile::KT, KPP = 16, NP = KT / KPP, KB = MlaTile::kBlocks;
  static_assert(2 * KT == MlaTile::kThreads / 3, "a producer thread per key of a round");
  const int tid = threadIdx.x, part = tid % 8, key0 = tid / 8;
  const int at = key0 * 64 + ((part ^ (key0 & 7)) << 3);  // in a tile, less 1024 a pass
  bool has[KB];  // whether the rows have this thread's chunk of each block
#pragma unroll
  for (int cb = 0; cb < KB; ++cb) has[cb] = (part + 8 * cb) * 8 < p.dqk;
  const T* pool = static_cast<const T*>(p.k_cache) + w.g * p.kc_s1 + part * 8;
  const uint32_t row_bytes = static_cast<uint32_t>(p.kc_s0 * sizeof(T));  // under 4 GiB
  // This thread's chunk of the rows of its NP keys of tile `tile` of the round at kt (null:
  // past the split).
  auto locate = [&](long long kt, int tile, const T* (&src)[NP]) {
#pragma unroll
    for (int j = 0; j < NP; ++j) {
      const int key = tile * KT + key0 + j * KPP;
      const uint32_t row = ld_shared_u32(rows + key);
      if (row < kRowTree)
        src[j] = row_address(pool, row, row_bytes);
      else if (row == kRowTree)
        src[j] = key_rows_at<T>(p, w.b, w.g, w.prefix, kt + key, 0, true, 0).k + part * 8;
      else
        src[j] = nullptr;
    }
  };
  auto copy = [&](const T* const (&src)[NP], int buf, int cb0, int cb1) {
    T* dst = kbuf + buf * MlaTile::kK + at;
#pragma unroll
    for (int j = 0; j < NP; ++j)
#pragma unroll
      for (int cb = 0; cb < KB; ++cb)
        if (cb >= cb0 && cb < cb1)
          cp_async16(dst + j * KPP * 64 + cb * KT * 64,
                     src[j] != nullptr ? src[j] + cb * 64 : pool, src[j] != nullptr && has[cb]);
  };
  // Half h of buffer `buf` (h 0: blocks 0 .. kLeft, 1: the rest), once freed in round r - 1.
  auto load = [&](const T* const (&src)[NP], int r, int buf, int h) {
    if (r > 0) mbar_wait(free_bar + 2 * buf + h, (r - 1) & 1);
    if (h == 0)
      copy(src, buf, 0, MlaTile::kLeft);
    else
      copy(src, buf, MlaTile::kLeft, KB);
    mbar_arrive_on_copies(ready + 2 * buf + h);
  };
  NextKey next(p, w, w.k_begin + tid, true);
  for (int r = 0; r < rounds; ++r) {
    const long long kt = w.k_begin + 2ll * KT * r;
    // The producer warpgroup's barrier: the last round's rows are read, then these posted.
    bar_sync_producer();
    st_shared_u32(rows + tid, next.slot(p, w));
    bar_sync_producer();
    next = NextKey(p, w, kt + 2 * KT + tid, true);
    const T* src0[NP];
    const T* src1[NP];
    locate(kt, 0, src0);
    locate(kt, 1, src1);
    // In the order the consumers free them: consumer 0 reads buffer 0's left half last in
    // its own P V; consumer 1 its own right half; then the halves the other reads.
    load(src0, r, 0, 0);
    load(src1, r, 1, 1);
    load(src0, r, 0, 1);
    load(src1, r, 1, 0);
  }
  cp_async_wait<0>();  // nothing of this thread's in flight when it exits
}

// O += P V with P (64 x 64, K-major) and V (256 columns, read MN-major) from shared memory.
template <bool kHalf>
__device__ __forceinline__ void mla_pv_shared(float (&acc)[32][4], uint64_t p_desc,
                                              uint64_t v_desc) {
  wgmma::fence();
#pragma unroll
  for (int kk = 0; kk < MlaTile::KT / 16; ++kk)
    wgmma::sst_n256<kHalf>(&acc[0][0], p_desc + kk * 2, v_desc + kk * (16 * 128 / 16), 1);
  wgmma::commit();
}

// The packed weights of this thread's two rows (rows r and r + 8 of the block; 8-key
// group n, lane pair gc; RowSoftmax::pack's layout) into a 64 x 64 swizzled P block.
template <typename T>
__device__ __forceinline__ void mla_store_p(T* pbuf, const uint32_t (&pa)[8][2], int r, int gc) {
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      asm volatile("st.shared.u32 [%0], %1;\n"
                   ::"r"(smem_addr(pbuf + swizzled(r + 8 * h, n, 64) + 2 * gc)), "r"(pa[n][h]));
}

// Moves this thread's rows' maximum to m_new (never below it), scaling acc and l to it; a
// warp none of whose rows moves skips the scaling.
__device__ __forceinline__ void mla_move_max(RowSoftmax& sm, const float (&m_new)[2],
                                             float (&acc)[32][4]) {
  if (__any_sync(0xffffffffu, m_new[0] != sm.m[0] || m_new[1] != sm.m[1])) {
    float scale[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      scale[h] = m_new[h] == -INFINITY ? 1.0f : exp2f(sm.m[h] - m_new[h]);
      sm.l[h] *= scale[h];
    }
    RowSoftmax::rescale(acc, scale);
  }
  sm.m[0] = m_new[0];
  sm.m[1] = m_new[1];
}

// The online softmax step of a consumer's tile, whose scores s and maxima raw_max are still
// unscaled (score_tile<8, false>; `scale` takes them to base 2 inside the exponentials, one
// FFMA a weight): the maximum moves from m (the scale of acc and l) to m_ref, or to the
// tile's maximum where that passes m_ref by more than kLazyRescale (as RowSoftmax: weights
// stay under 2^kLazyRescale, and most tiles move no row's maximum, so that a warp skips the
// rescale of its 128 accumulators); acc and l follow; s becomes the weights
// exp2(s * scale - m), which are added to l. A row with no key yet keeps m = -inf and
// weights 0.
__device__ __forceinline__ void mla_softmax(RowSoftmax& sm, float (&s)[8][4],
                                            const float (&raw_max)[2], const float (&m_ref)[2],
                                            float scale, float (&acc)[32][4]) {
  float m_new[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float tile_max = raw_max[h] * scale;  // -inf stays -inf
    m_new[h] = tile_max > m_ref[h] + kLazyRescale ? tile_max : m_ref[h];
  }
  mla_move_max(sm, m_new, acc);
  const float base[2] = {m_new[0] == -INFINITY ? 0.0f : m_new[0],
                         m_new[1] == -INFINITY ? 0.0f : m_new[1]};
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      s[n][i] = exp2_ftz(fmaf(s[n][i], scale, -base[i >> 1]));
      sm.l[i >> 1] += s[n][i];
    }
}

// This thread's two rows of the shared maximum (xm[64]): read, or written by the quad's
// first lane once every lane of the warp has read the last value. Shared-space accesses:
// the buffers' addresses come through an integer, so the compiler would use generic ones.
__device__ __forceinline__ float ld_shared_f32(const float* p) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(smem_addr(p)) : "memory");
  return v;
}
__device__ __forceinline__ void st_shared_f32(float* p, float v) {
  asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(smem_addr(p)), "f"(v) : "memory");
}
__device__ __forceinline__ void mla_read_max(const float* xm, int r, float (&m)[2]) {
  m[0] = ld_shared_f32(xm + r);
  m[1] = ld_shared_f32(xm + r + 8);
}
__device__ __forceinline__ void mla_post_max(float* xm, int r, int gc, const float (&m)[2]) {
  __syncwarp();
  if (gc == 0) {
    st_shared_f32(xm + r, m[0]);
    st_shared_f32(xm + r + 8, m[1]);
  }
}

template <typename T>
__device__ void attention_block_mla(const AttentionParams& p, unsigned char* smem_raw) {
  using Tile = MlaTile;
  constexpr bool kHalf = std::is_same<T, __half>::value;
  constexpr int KT = Tile::KT;
  const uintptr_t base = (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023);
  T* qs = reinterpret_cast<T*>(base);
  T* kbuf = qs + Tile::kQ;             // [2][9][KT][64]
  T* p1buf = kbuf + 2 * Tile::kK;      // [64][64]: consumer 1's weights
  T* p0buf = kbuf + 8 * KT * 64;       // buffer 0's RoPE block: consumer 0's weights
  uint64_t* ready = reinterpret_cast<uint64_t*>(p1buf + Tile::kP);  // [buffer][half]
  uint64_t* free_bar = ready + 4;                                   // [buffer][half]
  uint64_t* max_bar = free_bar + 4;  // [consumer]: its maximum is posted in xm
  float* xm = reinterpret_cast<float*>(max_bar + 2);                // [64] shared maximum
  float* xl = xm + Tile::BM;                                        // [2][64] row sums
  uint32_t* rows = reinterpret_cast<uint32_t*>(xl + 2 * Tile::BM);  // [128] a round's slots

  AttnBlock w;
  attn_place(p, Tile::BM, Tile::DV, w);
  if (threadIdx.x >= 128) consumers_copy_q<T, Tile::D, Tile::BM>(p, w, qs);
  if (!attn_keys_after_q(p, w)) return;
  const int tiles =
      w.k_end > w.k_begin ? static_cast<int>((w.k_end - w.k_begin + KT - 1) / KT) : 0;
  const int rounds = (tiles + 1) / 2;  // an odd last tile pairs with one past the split
  const int tid = threadIdx.x, wg = tid / 128;
  if (tid == 0) {
    for (int i = 0; i < 4; ++i) {
      mbar_init(ready + i, 128);  // each producer thread's copies
      mbar_init(free_bar + i, 4);  // each warp of the warpgroup that reads the half last
    }
    mbar_init(max_bar, 128);  // every thread of the consumer
    mbar_init(max_bar + 1, 128);
  }
  __syncthreads();  // the barriers' initialisation to every thread
  if (wg == 0) {
    regs_down<Tile::kProducerRegs>();
    mla_produce<T>(p, w, kbuf, rows, ready, free_bar, rounds);
    return;
  }
  regs_up<Tile::kConsumerRegs>();
  consumers_await_q<kQ>();

  const int cw = wg - 1, warp = (tid % 128) / 32, lane = tid % 32;
  const int gr = lane >> 2, gc = lane & 3, r = warp * 16 + gr;
  const int* bits_of[2];
  rows_out(p, w, r, bits_of);  // the rows' ancestor bits; where they go, at the end
  const uint64_t q_desc = kmajor_desc(qs);
  const uint64_t k0_desc = kmajor_desc(kbuf);
  const uint64_t k1_desc = kmajor_desc(kbuf + Tile::kK);
  // This consumer's value columns (its half) of each buffer.
  const uint64_t v0_desc = mnmajor_desc(kbuf + cw * Tile::kLeft * KT * 64, KT);
  const uint64_t v1_desc = mnmajor_desc(kbuf + Tile::kK + cw * Tile::kLeft * KT * 64, KT);
  const uint64_t p0_desc = kmajor_desc(p0buf);
  const uint64_t p1_desc = kmajor_desc(p1buf);
  auto acquire = [&](int buf, int h, int round) {
    mbar_wait(ready + 2 * buf + h, round & 1);
    fence_async_shared();
  };
  auto release = [&](int buf, int h) {
    __syncwarp();
    if (lane == 0) mbar_arrive(free_bar + 2 * buf + h);
  };

  RowSoftmax sm;  // m: the maximum acc and l are scaled to; l: this consumer's tiles only
  float acc[32][4];
#pragma unroll
  for (int t = 0; t < 32; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;
  float s[8][4];
  uint32_t pa[8][2];
  float tile_max[2], m_ref[2];
  if (cw == 0 && rounds > 0) {  // S of the first even tile, left half first as it loads
    acquire(0, 0, 0);
    qk_blocks<kHalf, 8, 64, KT, 0, Tile::kLeft, true>(&s[0][0], q_desc, k0_desc);
    acquire(0, 1, 0);
    qk_blocks<kHalf, 8, 64, KT, Tile::kLeft, Tile::kBlocks, false>(&s[0][0], q_desc, k0_desc);
    wgmma::commit();
    wgmma::wait<0>();
    fence_all(s);
  }
  for (int round = 0; round < rounds; ++round) {
    const long long kt = w.k_begin + 2ll * KT * round;
    if (cw == 0) {
      // The even tile: its maximum to consumer 1, O_L += P0 V0L from registers.
      score_tile<8, false>(p, s, kt, w.k_end, w.prefix, bits_of, gc, tile_max);
      const float m_own[2] = {sm.m[0], sm.m[1]};
      mla_softmax(sm, s, tile_max, m_own, p.sm_scale_log2, acc);
      mla_post_max(xm, r, gc, sm.m);
      mbar_arrive(max_bar);
      RowSoftmax::pack<T>(s, pa);
      pv_issue<kHalf, 256>(&acc[0][0], pa, v0_desc);
      // Consumer 1 has moved the maximum for the odd tile: P0 rescaled to it, for consumer 1.
      mbar_wait(max_bar + 1, round & 1);
      mla_read_max(xm, r, m_ref);
      if (__any_sync(0xffffffffu, m_ref[0] != sm.m[0] || m_ref[1] != sm.m[1])) {
        float to_m1[2];
#pragma unroll
        for (int h = 0; h < 2; ++h)
          to_m1[h] = m_ref[h] == -INFINITY ? 1.0f : exp2f(sm.m[h] - m_ref[h]);
        uint32_t scaled[8][2];
#pragma unroll
        for (int n = 0; n < 8; ++n)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            scaled[n][h] = MmaType<T>::pack(s[n][2 * h] * to_m1[h], s[n][2 * h + 1] * to_m1[h]);
        mla_store_p<T>(p0buf, scaled, r, gc);
      } else {  // no row of the warp moved: P0 as packed for this consumer's own product
        mla_store_p<T>(p0buf, pa, r, gc);
      }
      fence_async_shared();
      bar_arrive(kP0);
      wgmma::wait<0>();
      fence_all(acc);
      fence_all(pa);
      release(0, 0);  // buffer 0's left half: S and this P V have read it
      mla_move_max(sm, m_ref, acc);
      // O_L += P1 V1L from shared memory, then the next even tile's S behind it.
      bar_sync(kP1);
      mla_pv_shared<kHalf>(acc, p1_desc, v1_desc);
      if (round + 1 < rounds) {
        acquire(0, 0, round + 1);
        qk_blocks<kHalf, 8, 64, KT, 0, Tile::kLeft, true>(&s[0][0], q_desc, k0_desc);
        wgmma::commit();
        wgmma::wait<1>();
        release(1, 0);  // buffer 1's left half: consumer 1's S and this P V have read it
        acquire(0, 1, round + 1);
        qk_blocks<kHalf, 8, 64, KT, Tile::kLeft, Tile::kBlocks, false>(&s[0][0], q_desc, k0_desc);
        wgmma::commit();
        wgmma::wait<0>();
        fence_all(s);
      } else {
        wgmma::wait<0>();
        release(1, 0);
      }
      fence_all(acc);
    } else {
      // The odd tile: S (right half first, as it loads), the maximum moved past consumer
      // 0's, O_R += P1 V1R from registers and P0 V0R from shared memory.
      acquire(1, 1, round);
      qk_blocks<kHalf, 8, 64, KT, Tile::kLeft, Tile::kBlocks, true>(&s[0][0], q_desc, k1_desc);
      acquire(1, 0, round);
      qk_blocks<kHalf, 8, 64, KT, 0, Tile::kLeft, false>(&s[0][0], q_desc, k1_desc);
      wgmma::commit();
      wgmma::wait<0>();
      fence_all(s);
      score_tile<8, false>(p, s, kt + KT, w.k_end, w.prefix, bits_of, gc, tile_max);
      mbar_wait(max_bar, round & 1);
      mla_read_max(xm, r, m_ref);
      mla_softmax(sm, s, tile_max, m_ref, p.sm_scale_log2, acc);
      mla_post_max(xm, r, gc, sm.m);
      mbar_arrive(max_bar + 1);
      RowSoftmax::pack<T>(s, pa);
      pv_issue<kHalf, 256>(&acc[0][0], pa, v1_desc);
      mla_store_p<T>(p1buf, pa, r, gc);
      bar_sync(kP0);
      mla_pv_shared<kHalf>(acc, p0_desc, v0_desc);
      fence_async_shared();  // P1's stores to consumer 0's products
      bar_arrive(kP1);
      wgmma::wait<1>();
      release(1, 1);  // buffer 1's right half: S and P1 V1R have read it
      wgmma::wait<0>();
      fence_all(acc);
      fence_all(pa);
      release(0, 1);  // buffer 0's right half: consumer 0's S, P0 and P0 V0R
    }
  }
  // Each consumer summed its own tiles' weights (both scaled to the final maximum).
  sm.finish();
  if (gc == 0) {
    st_shared_f32(xl + cw * 64 + r, sm.l[0]);
    st_shared_f32(xl + cw * 64 + r + 8, sm.l[1]);
  }
  bar_sync(kSums);
  sm.l[0] += ld_shared_f32(xl + (1 - cw) * 64 + r);
  sm.l[1] += ld_shared_f32(xl + (1 - cw) * 64 + r + 8);
  write_rows<T>(p, rows_out(p, w, r, bits_of), acc, sm, cw * 256, gc);
}

}  // namespace ddtree
