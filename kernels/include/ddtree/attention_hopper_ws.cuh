// Tree verify attention on Hopper with warp specialization (FlashAttention-3's structure),
// for the GQA/MHA head dims: the same blocks, splits and results as attention_block_hopper,
// with the gather and the math in different warpgroups.
//
// A block has three warpgroups. Warpgroup 0 (the producer, its registers given up to the
// others by setmaxnreg) gathers the K/V tiles of KT keys from the paged pool by cp.async
// into a ring of ST stages; each stage has a `full` mbarrier, which the copies themselves
// complete (cp.async.mbarrier.arrive), and an `empty` one, which the consumers' warps
// arrive on once their products have read it. Warpgroups 1 and 2 (the consumers) own 64
// query rows each. Per tile a consumer issues S = Q K^T, then O += P V for the previous
// tile, and computes this tile's softmax once S is done; the two consumers take turns at
// the tensor cores, so that one's softmax runs while the other's products do. No block
// barrier in the loop, and page-table reads and copies are off the math's path.
#pragma once
#include "attention_hopper.cuh"

namespace ddtree {

template <int D, int DV, int KT, int ST>
struct WsTile {
  static constexpr int BM = 128;            // two consumer warpgroups of 64 rows
  static constexpr int kThreads = 3 * 128;  // the producer's warpgroup first
  // setmaxnreg moves registers within the block's launch allocation (168 a lane, 65536 over
  // 384 threads): 56 + 2 * 224 = 3 * 168. A sum above it would leave setmaxnreg.inc waiting
  // for registers that never come (a hang, not an error).
  static constexpr int kProducerRegs = 56;
  static constexpr int kConsumerRegs = 224;
  static_assert(kProducerRegs + 2 * kConsumerRegs <= 3 * 168, "the block's launch registers");
  static constexpr size_t kQ = static_cast<size_t>(BM) * D;  // elements of each buffer
  static constexpr size_t kK = static_cast<size_t>(KT) * D;
  static constexpr size_t kV = static_cast<size_t>(KT) * DV;
  // Q and the ring, the full and empty mbarriers, a tile's pool slots (4 bytes each), 1 KB to
  // align to the swizzle's period.
  static constexpr size_t kSmem = 2 * (kQ + ST * (kK + kV)) + 16 * ST + 4 * KT + 1024;
  static_assert(KT == 64 || KT == 128, "S takes one m64n64 or m64n128 product per k step");
  static_assert(D % 64 == 0 && DV % 64 == 0, "whole 128-byte column blocks");
  static_assert(ST >= 2, "a stage loads while the previous tile's P V reads another");
  static_assert(kSmem <= 227 * 1024, "a Hopper block has at most 227 KB of shared memory");
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// Arrives on bar once all of this thread's earlier cp.async copies have landed (counted in
// the barrier's expected arrivals).
__device__ __forceinline__ void mbar_arrive_on_copies(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr(bar))
               : "memory");
}
// Waits until the barrier's phase of this parity has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}
template <int N>
__device__ __forceinline__ void regs_down() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void regs_up() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

__device__ __forceinline__ void st_shared_u32(uint32_t* p, uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(smem_addr(p)), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t ld_shared_u32(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(smem_addr(p)) : "memory");
  return v;
}

// What a producer thread posts for each key of a tile, a tile ahead: the key's pool slot, or
// one of these (the host keeps the pool under kRowTree slots).
constexpr uint32_t kRowTree = 0xFFFFFFFEu;  // a tree node's key: its rows are k_new's, v_new's
constexpr uint32_t kRowNone = 0xFFFFFFFFu;  // past the split: zero-filled, never read

// A producer thread's key a tile (MLA: a round) ahead: its page is loaded early, and the
// slot it posts is formed from it a tile later, once the load has long landed.
struct NextKey {
  long long t;    // the key
  uint32_t page;  // its page when it is a pool key of the split, else 0 (nothing loaded)
  __device__ __forceinline__ NextKey(const AttentionParams& p, const AttnBlock& w, long long t_,
                                     bool mine)
      : t(t_),
        page(mine && t_ < min(w.k_end, w.prefix) ? page_at(p, w.start + (t_ >> p.page_shift))
                                                 : 0u) {}
  // The key's pool slot, kRowTree or kRowNone.
  __device__ __forceinline__ uint32_t slot(const AttentionParams& p, const AttnBlock& w) const {
    if (t >= w.k_end) return kRowNone;
    if (t >= w.prefix) return kRowTree;
    return (page << p.page_shift) | (static_cast<uint32_t>(t) & ((1u << p.page_shift) - 1));
  }
};

// base + row * bytes as one 32 x 32 -> 64-bit multiply-add (mad.wide.u32).
template <typename T>
__device__ __forceinline__ const T* row_address(const T* base, uint32_t row, uint32_t bytes) {
  unsigned long long a;
  asm("mad.wide.u32 %0, %1, %2, %3;\n" : "=l"(a) : "r"(row), "r"(bytes), "l"(base));
  return reinterpret_cast<const T*>(a);
}

// Q's copies by the two consumer warpgroups (threads 128 ..), issued before anything waits
// on the index check (Q needs none), so that they are in flight while the check runs (the
// launch lets this grid start during it) and the producer gathers the first tiles.
template <typename T, int D, int BM>
__device__ __forceinline__ void consumers_copy_q(const AttentionParams& p, const AttnBlock& w,
                                                 T* qs) {
  load_q_swizzled<T, D, BM, 256>(p, w, qs, 128);
  cp_async_commit();
}
// attn_keys for a block whose consumers have issued Q's copies: false, with nothing left in
// flight, when the request failed its check.
__device__ __forceinline__ bool attn_keys_after_q(const AttentionParams& p, AttnBlock& w) {
  if (attn_keys(p, w)) return true;
  cp_async_wait<0>();  // nothing in flight at exit
  return false;
}
// A consumer thread's wait for Q (consumers_copy_q): its own copies landed and handed to
// the tensor cores, then those of both consumers' threads (named barrier kBarrier).
template <int kBarrier>
__device__ __forceinline__ void consumers_await_q() {
  cp_async_wait<0>();
  fence_async_shared();
  asm volatile("bar.sync %0, 256;\n" ::"n"(kBarrier) : "memory");
}

// The producer: tiles of KT keys from k_begin into the ring, each once its stage is empty.
// Thread k < KT loads key k's page a tile ahead and, a tile later, once that load has long
// landed, posts the key's slot (or kRowTree / kRowNone) in `rows` for the warpgroup; so the
// slot's arithmetic is done once a key and the page-table read never stalls the copies.
// Then eight threads take a key, 16 keys a pass: thread `part` copies chunk `part` of each
// of the key's 128-byte column blocks (so that a warp reads whole lines), into the same
// swizzled place of every pass (its keys are 16 apart, so the swizzle, key % 8, stays the
// same). A pool key's row address is one 32 x 32 -> 64-bit product and add (slot times the
// row's bytes), which keeps a pass to a shared load, two products and the copies.
template <typename T, int D, int DV, int KT, int ST>
__device__ __forceinline__ void ws_produce(const AttentionParams& p, const AttnBlock& w, T* kbuf,
                                           T* vbuf, uint32_t* rows, uint64_t* full,
                                           uint64_t* empty) {
  using Tile = WsTile<D, DV, KT, ST>;
  constexpr int KPP = 16, KB = D / 64, VB = DV / 64;  // keys a pass; column blocks of K, V
  const int tid = threadIdx.x, part = tid % 8, key0 = tid / 8;
  const int at = key0 * 64 + ((part ^ (key0 & 7)) << 3);  // in a tile, less 1024 a pass
  bool k_has[KB], v_has[VB];  // whether the rows have this thread's chunk of each block
#pragma unroll
  for (int cb = 0; cb < KB; ++cb) k_has[cb] = (part + 8 * cb) * 8 < p.dqk;
#pragma unroll
  for (int cb = 0; cb < VB; ++cb) v_has[cb] = (part + 8 * cb) * 8 < w.dv_here;
  const T* k_pool = static_cast<const T*>(p.k_cache) + w.g * p.kc_s1 + part * 8;
  const T* v_pool = static_cast<const T*>(p.v_cache) + w.g * p.vc_s1 + w.col0 + part * 8;
  // Row strides in bytes (under 4 GiB: the host checks).
  const uint32_t k_row = static_cast<uint32_t>(p.kc_s0 * sizeof(T));
  const uint32_t v_row = static_cast<uint32_t>(p.vc_s0 * sizeof(T));
  NextKey next(p, w, w.k_begin + tid, tid < KT);
  int i = 0;
  for (long long kt = w.k_begin; kt < w.k_end; kt += KT, ++i) {
    const int st = i % ST;
    // The producer warpgroup's barrier: the last tile's rows are read, then these posted.
    asm volatile("bar.sync 1, 128;\n" ::: "memory");
    if (tid < KT) st_shared_u32(rows + tid, next.slot(p, w));
    asm volatile("bar.sync 1, 128;\n" ::: "memory");
    next = NextKey(p, w, kt + KT + tid, tid < KT);
    if (i >= ST) mbar_wait(empty + st, ((i / ST) & 1) ^ 1);
    T* ks = kbuf + st * Tile::kK + at;
    T* vs = vbuf + st * Tile::kV + at;
    // Key key0 + j * KPP's chunks; `valid` false zero-fills them.
    auto copy = [&](int j, const T* k_src, const T* v_src, bool valid) {
#pragma unroll
      for (int cb = 0; cb < KB; ++cb)
        cp_async16(ks + j * KPP * 64 + cb * KT * 64, k_src + cb * 64, valid && k_has[cb]);
#pragma unroll
      for (int cb = 0; cb < VB; ++cb)
        cp_async16(vs + j * KPP * 64 + cb * KT * 64, v_src + cb * 64, valid && v_has[cb]);
    };
#pragma unroll
    for (int j = 0; j < KT / KPP; ++j) {
      const uint32_t row = ld_shared_u32(rows + key0 + j * KPP);
      if (row < kRowTree) {  // a pool key: its own copies, so that their predicates stay fixed
        copy(j, row_address(k_pool, row, k_row), row_address(v_pool, row, v_row), true);
      } else {  // a tree node's rows, or none past the split (not read)
        const bool valid = row == kRowTree;
        const long long t = kt + key0 + j * KPP;
        const KeyRows<T> kv = key_rows_at<T>(p, w.b, w.g, w.prefix, t, 0, valid, w.col0);
        copy(j, kv.k + part * 8, kv.v + part * 8, valid);
      }
    }
    mbar_arrive_on_copies(full + st);
  }
  cp_async_wait<0>();  // nothing of this thread's in flight when it exits
}

// The consumers' turns at the tensor cores (see attention_block_ws). Every wait of one
// consumer is matched by one arrival of the other: consumer 0 waits tiles + 1 times and gets
// the start's arrival and one per turn of consumer 1 but its last.
struct Turns {
  int cw, tiles;
  __device__ __forceinline__ void start() const {
    if (cw == 1) asm volatile("bar.arrive 2, 256;\n" ::: "memory");
  }
  __device__ __forceinline__ void wait() const {
    if (cw == 0)
      asm volatile("bar.sync 2, 256;\n" ::: "memory");
    else
      asm volatile("bar.sync 3, 256;\n" ::: "memory");
  }
  // After turn `turn` (0 .. tiles) has issued its products.
  __device__ __forceinline__ void pass(int turn) const {
    if (cw == 0)
      asm volatile("bar.arrive 3, 256;\n" ::: "memory");
    else if (turn < tiles)
      asm volatile("bar.arrive 2, 256;\n" ::: "memory");
  }
};

template <typename T, int D, int DV, int KT, int ST>
__device__ void attention_block_ws(const AttentionParams& p, unsigned char* smem_raw) {
  using Tile = WsTile<D, DV, KT, ST>;
  constexpr bool kHalf = std::is_same<T, __half>::value;
  constexpr int BM = Tile::BM, NT = KT / 8, VT = DV / 8;
  const uintptr_t base = (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023);
  T* qs = reinterpret_cast<T*>(base);
  T* kbuf = qs + Tile::kQ;         // [ST][D / 64][KT][64]
  T* vbuf = kbuf + ST * Tile::kK;  // [ST][DV / 64][KT][64]
  uint64_t* full = reinterpret_cast<uint64_t*>(vbuf + ST * Tile::kV);
  uint64_t* empty = full + ST;
  uint32_t* rows = reinterpret_cast<uint32_t*>(empty + ST);  // [KT] a tile's pool slots

  AttnBlock w;
  attn_place(p, BM, DV, w);
  const int tid = threadIdx.x, wg = tid / 128;
  if (wg > 0) consumers_copy_q<T, D, BM>(p, w, qs);
  if (!attn_keys_after_q(p, w)) return;
  if (tid == 0) {
    for (int s = 0; s < ST; ++s) {
      mbar_init(full + s, 128);  // each producer thread's copies
      mbar_init(empty + s, 8);   // each consumer warp
    }
  }
  __syncthreads();  // the barriers' initialisation to every thread
  if (wg == 0) {
    regs_down<Tile::kProducerRegs>();
    ws_produce<T, D, DV, KT, ST>(p, w, kbuf, vbuf, rows, full, empty);
    return;
  }
  regs_up<Tile::kConsumerRegs>();
  consumers_await_q<4>();

  const int cw = wg - 1, warp = (tid % 128) / 32, lane = tid % 32;
  const int gr = lane >> 2, gc = lane & 3;
  const int* bits_of[2];
  const RowsOut out = rows_out(p, w, cw * 64 + warp * 16 + gr, bits_of);
  // Descriptors: Q's rows of this warpgroup, stage 0's K and V; a stage is kStageK /
  // kStageV 16-byte units on.
  const uint64_t q_desc = kmajor_desc(qs + cw * 64 * 64);
  const uint64_t k_desc = kmajor_desc(kbuf);
  const uint64_t v_desc = mnmajor_desc(vbuf, KT);
  constexpr uint32_t kStageK = Tile::kK * 2 / 16, kStageV = Tile::kV * 2 / 16;
  // Waits for tile i's stage; then makes its copies visible to this thread's products.
  auto acquire = [&](int i) {
    mbar_wait(full + i % ST, (i / ST) & 1);
    fence_async_shared();
  };
  // Tile i's stage is read by this warp for the last time (its P V has completed).
  auto release = [&](int i) {
    __syncwarp();
    if (lane == 0) mbar_arrive(empty + i % ST);
  };

  RowSoftmax sm;
  float acc[VT][4];
#pragma unroll
  for (int t = 0; t < VT; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;
  const int tiles = w.k_end > w.k_begin ? static_cast<int>((w.k_end - w.k_begin + KT - 1) / KT) : 0;
  float s[NT][4];
  uint32_t pa[NT][2];
  float scale[2], tile_max[2];
  // Ping-pong: the two consumers take turns to issue their products (named barriers 2 and
  // 3, each waited on by one warpgroup and arrived on by the other), so that one's softmax
  // runs while the tensor cores do the other's products. Consumer 0 goes first; a turn is
  // a tile's issue, tiles + 1 of them (the last tile's P V alone at the end).
  const Turns turns{cw, tiles};
  if (tiles > 0) {
    turns.start();
    acquire(0);
    turns.wait();
    qk_issue<kHalf, D, NT, BM, KT>(&s[0][0], q_desc, k_desc);
    turns.pass(0);
    qk_wait<NT>(&s[0][0]);
    score_tile(p, s, w.k_begin, w.k_end, w.prefix, bits_of, gc, tile_max);
    sm.weigh(s, tile_max, scale);  // the accumulators are zero: nothing to rescale
    RowSoftmax::pack<T>(s, pa);
  }
  bool moves = false;
  for (int i = 1; i < tiles; ++i) {
    // S of tile i, then O += P V of tile i - 1 behind it (O first rescaled for tile i - 1's
    // maximum, as FlashAttention-3 orders it); tile i's softmax runs while the tensor cores
    // do the second.
    acquire(i);
    if (moves) RowSoftmax::rescale(acc, scale);
    turns.wait();
    qk_issue<kHalf, D, NT, BM, KT>(&s[0][0], q_desc, k_desc + (i % ST) * kStageK);
    pv_issue<kHalf, DV>(&acc[0][0], pa, v_desc + ((i - 1) % ST) * kStageV);
    turns.pass(i);
    wgmma::wait<1>();
    fence_all(s);
    const long long kt = w.k_begin + static_cast<long long>(i) * KT;
    score_tile(p, s, kt, w.k_end, w.prefix, bits_of, gc, tile_max);
    moves = sm.weigh(s, tile_max, scale);
    wgmma::wait<0>();
    fence_all(pa);
    fence_all(acc);
    release(i - 1);
    RowSoftmax::pack<T>(s, pa);
  }
  if (tiles > 0) {
    if (moves) RowSoftmax::rescale(acc, scale);
    turns.wait();
    pv_issue<kHalf, DV>(&acc[0][0], pa, v_desc + ((tiles - 1) % ST) * kStageV);
    turns.pass(tiles);
    wgmma::wait<0>();
    fence_all(pa);
    fence_all(acc);
  }
  sm.finish();
  write_rows<T>(p, out, acc, sm, 0, gc);
}

}  // namespace ddtree
