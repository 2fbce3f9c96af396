// The portable MLA tile: tree verify attention in MLA's absorbed form (head dim 576, V the
// first 512 columns of K), mma.sync only, for sm_120 (the RTX PRO 6000's 99 KB a block) and
// sm_90 alike.
//
// Why its own tile: every query row of a request shares each 576-wide key, so the cost is
// how often a key tile is read — from L2 (once per block of rows) and from shared memory
// (once per fragment a warp loads). A tile that holds Q in shared memory, as
// attention_block's do, leaves room under 99 KB for 32 rows of MLA's 576 columns a block
// and one ldmatrix per two products (the MLA tile this one replaced). Here a block takes 64
// rows and Q never enters a shared tile (each warp keeps its own fragments):
// * S = Q K^T: warp w takes the 16 rows of quarter w % 4 over half w / 4 of the head dim
//   (288 columns, 18 k-steps), its Q fragments held for the whole split: 16 k-steps in 64
//   registers, the last two in shared memory (a uint4 a lane, read back by the same lane),
//   which frees the registers that let the compiler load a k-step's K fragments before the
//   previous k-step's products (with all 18 in registers it had one fragment buffer, and
//   every k-step waited on its ldmatrix; session 27). Four k-steps there, with P moved into
//   the pair slots to make room, measured 2-3 % slower. A K fragment serves two products.
//   The two warps of a quarter then split its rows: each posts its partial S (fp32) for
//   the lane's row its partner weighs and adds the partner's for its own (the lower warp the
//   fragment's row gr, the upper gr + 8), runs the online softmax of that row and writes its
//   P (bf16/fp16) and rescale factor to shared memory, so that the softmax between the
//   products takes half the time it did on one warp of the two. On a whole tile of prefix
//   keys the scale goes into the weights' FFMA (score_row), and the barrier after P tells
//   every warp whether any row's maximum moved (most tiles: none, no flag read).
// * O += P V: warp w takes value columns 64w .. 64w + 63 of all 64 rows (4 x 8 m16n8
//   accumulators): per 16 keys, four P fragments and four V fragments feed 32 products.
// Per tile of 32 keys a warp loads 52 fragments for 136 products (the replaced tile: 52 for
// 68), and the block reads each key tile once per 64 rows (there: 32).
// The next tile's cp.async copies (nine 16-byte chunks a thread) go out one every other
// k-step of S rather than all at once: issued together they queued at the load unit and
// held their address registers, which the instructions after them then waited for (Nsight
// Compute put a quarter of the warps' stall samples there); spread, the tile is 1.02-1.21x
// faster on the H200 (BENCHMARKS.md, session 22). Their addresses are found without a branch
// from the block's KeySources (TileGather::next_row): the setup branched on the key's kind
// and recomputed the block's base pointers each tile, 130 instructions a warp a tile
// between the barrier and the first product (session 27). Each thread loads its key's page
// a tile ahead into a register (page_ahead), where warp 0 staged the tile's page ids in
// shared memory and the other warps waited for it at the barriers (session 28).
#pragma once
#include "attention.cuh"

namespace ddtree {

template <typename T>
struct PortableMlaTile {
  static constexpr int D = 576;             // head dim of Q and K (dqk ≤ D, zero-filled)
  static constexpr int DV = 512;            // value columns: all of a block's (dv ≤ DV)
  static constexpr int kWarps = 8;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int BM = 64;             // query rows a block
  static constexpr int KT = 32;             // keys a tile
  static constexpr int ST = 2;              // tiles in flight
  static constexpr int NT = KT / 8;         // n8 tiles of S a warp
  static constexpr int QS = D + kAttnPad;   // shared row stride of a K tile, elements
  static constexpr int PS = KT + kAttnPad;  // of P
  static constexpr int KSTEPS = D / 2 / 16; // k-steps of a warp's half of the head dim
  static constexpr int QTAIL = 2;           // of them whose Q fragments wait in shared memory
  static constexpr int KREG = KSTEPS - QTAIL;  // and in registers
  static constexpr int VCOLS = DV / kWarps; // value columns a warp (8 n8 tiles)
  // Shared memory: the K tiles; each warp's partial S for its partner's rows (two float4 a
  // lane); P; the rows' rescale factors, final maxima and sums (fp32) and each warp's
  // "moved" flag; the gather's page-id slots (unused here: the pages come by page_ahead)
  // and the block's KeySources.
  static constexpr size_t kK = sizeof(T) * ST * KT * QS;
  static constexpr size_t kSums = sizeof(float) * 4 * kWarps * 2 * 32;
  static constexpr size_t kQTail = 16 * QTAIL * 32 * kWarps;  // a uint4 a lane a k-step
  static constexpr size_t kP = sizeof(T) * BM * PS;
  static constexpr size_t kRows = sizeof(float) * 3 * BM + sizeof(int) * kWarps;
  static constexpr size_t kIds = sizeof(long long) * ST * KT + sizeof(KeySources<T>);
  static constexpr size_t kSmem = kK + kSums + kQTail + kP + kRows + kIds;
  static_assert(kK % 16 == 0 && kSums % 16 == 0 && kP % 16 == 0 && kRows % 8 == 0,
                "regions keep 16-byte (float4) and 8-byte (page id) alignment");
};

// The A fragments of Q for rows r0 (its n8 row group) and r0 + 8 over KSTEPS k-steps from
// column c0: straight from global memory into registers (a thread's 4-byte pairs; the rows
// are 16-byte aligned and dqk a multiple of 8, so a pair lies wholly inside or past dqk),
// zeros for a missing row or past dqk.
template <typename T, int KSTEPS>
__device__ __forceinline__ void q_fragments(uint32_t (&qf)[KSTEPS][4], const T* row0,
                                            const T* row8, int c0, int dqk, uint32_t sign) {
#pragma unroll
  for (int j = 0; j < KSTEPS; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const T* row = (e & 1) ? row8 : row0;
      const int c = c0 + j * 16 + (e >> 1) * 8;
      qf[j][e] = row != nullptr && c < dqk ? *reinterpret_cast<const uint32_t*>(row + c) ^ sign
                                           : 0u;
    }
}
// The scale score_row's scores take, and the sign bits of a 16-bit pair that q_fragments
// flips in Q for it: |sm_scale_log2| on Q negated when the scale is negative (exact in
// bf16/fp16), so that the scale is never negative and the largest raw score is the largest
// scaled one.
__device__ __forceinline__ float folded_scale(const AttentionParams& p) {
  return fabsf(p.sm_scale_log2);
}
__device__ __forceinline__ uint32_t q_sign(const AttentionParams& p) {
  return p.sm_scale_log2 < 0.0f ? 0x80008000u : 0u;
}

// S = Q K^T over KSTEPS k-steps for one m16 tile and NT n8 tiles of keys: the Q fragments of
// the first KREG k-steps from registers (qf), of the rest from shared memory (qtail: this
// lane's four registers of k-step KREG + i at qtail[32 * i]), so
// that the registers those hold are free for the next k-step's K fragments. kb is this lane's
// ldmatrix address of the first key's first column, rows QS apart. at_step(j) runs before
// k-step j's products (the next tile's copies, spread over them).
template <typename T, int NT, int QS, int KSTEPS, int KREG, typename AtStep>
__device__ __forceinline__ void qk_tile_mla(float (&s)[NT][4], const uint32_t (&qf)[KREG][4],
                                            const uint4* qtail, const T* kb, AtStep at_step) {
#pragma unroll
  for (int n = 0; n < NT; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
  for (int j = 0; j < KSTEPS; ++j) {
    at_step(j);
    uint32_t a[4];
    if (j < KREG) {
#pragma unroll
      for (int e = 0; e < 4; ++e) a[e] = qf[j < KREG ? j : 0][e];  // (in range when unused)
    } else {
      const uint4 t = qtail[32 * (j - KREG)];
      a[0] = t.x;
      a[1] = t.y;
      a[2] = t.z;
      a[3] = t.w;
    }
#pragma unroll
    for (int n = 0; n < NT; n += 2) {
      uint32_t bf[4];  // keys n*8.. (k 0-7, 8-15), then keys n*8+8..
      ldmatrix_x4(bf, kb + n * 8 * QS + j * 16);
      MmaType<T>::mma(s[n], a, bf);
      MmaType<T>::mma(s[n + 1], a, bf + 2);
    }
  }
}

// score_tile for one row of the lane's two (the pair's warps split a quarter's rows, so that
// each runs half the softmax): v[n][e] is key n * 8 + 2 * gc + e of the row whose tree node's
// ancestor bits are `bits`. Returns the row's maximum over its four lanes in base 2, and in
// `mul` what the weights multiply v by: a whole tile of prefix keys keeps its raw scores (the
// scale, folded_scale's, goes into the weights' one FFMA each: a multiplication a score less),
// a tile with masked keys is scaled here, its masked keys -inf (0 * -inf would be NaN), and
// takes mul = 1.
template <int NT>
__device__ __forceinline__ float score_row(const AttentionParams& p, float (&v)[NT][2],
                                           long long kt, long long k_end, long long prefix,
                                           const int* bits, int gc, float& mul) {
  constexpr int KT = NT * 8;
  const float scale = folded_scale(p);
  float m = -INFINITY;
  if (kt + KT <= min(k_end, prefix)) {  // a whole tile of prefix keys: nothing masked
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) m = fmaxf(m, v[n][e]);
    mul = scale;
    m *= scale;  // scale >= 0: the scaled maximum (the scores are finite here)
  } else {
    const int in_split = static_cast<int>(min(static_cast<long long>(KT), k_end - kt));
    const int first_tree = static_cast<int>(max(0ll, min(static_cast<long long>(KT), prefix - kt)));
    // Key n * 8 + e of the lane's (key 2 * gc + n * 8 + e of the tile) against bounds shifted
    // by the lane's 2 * gc, so that the comparisons take immediates: with the lane's keys as
    // operands, sm_120's build kept all eight in registers across the loop.
    const int lim = in_split - 2 * gc, tree_from = first_tree - 2 * gc;
    const int node0 = static_cast<int>(kt - prefix) + 2 * gc;  // tree node of the lane's key 0
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int key = n * 8 + e;
        bool ok = key < lim;
        if (ok && key >= tree_from) {
          const int j = node0 + key;
          ok = (__ldg(bits + (j >> 5)) >> (j & 31)) & 1;
        }
        v[n][e] = ok ? v[n][e] * scale : -INFINITY;
        m = fmaxf(m, v[n][e]);
      }
    mul = 1.0f;
  }
  m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
  return fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
}

// RowSoftmax for one row a lane: the running maximum m (base 2) and sum l, the maximum
// moved lazily (kLazyRescale) and by the warp as one, as there.
struct OneRowSoftmax {
  float m = -INFINITY;
  float l = 0.0f;

  // Moves the maximum if the warp's rows need it (true, with l scaled and `scale` the
  // accumulators' factor), then turns v (times mul: score_row's) into the weights in place
  // and adds them to l.
  template <int NT>
  __device__ __forceinline__ bool weigh(float (&v)[NT][2], float mul, float tile_max,
                                        float& scale) {
    const bool moves = __any_sync(0xffffffffu, tile_max > m + kLazyRescale);
    if (moves) {
      const float m_new = fmaxf(m, tile_max);
      scale = m_new == -INFINITY ? 1.0f : exp2f(m - m_new);
      m = m_new;
      l *= scale;
    }
    // A row with no key yet has m = -inf and scores all -inf: subtracting 0 gives weights 0.
    const float base = m == -INFINITY ? 0.0f : m;
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        v[n][e] = exp2_ftz(fmaf(v[n][e], mul, -base));
        l += v[n][e];
      }
    return moves;
  }
  // The row's sum over the four lanes that share it.
  __device__ __forceinline__ void finish() {
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
  }
};

// Named barrier `id` (1 to 4) of the 64 threads of a quarter's two warps, each of which
// reads the partial S the other posted before it. Both wait (bar.sync), so every
// shared-memory handoff stays one that racecheck can follow. The id is a register, which
// reserves all sixteen barriers for the block: an SM holds one block of this tile anyway
// (its registers), and a switch over immediate ids cost a branch tree a tile.
__device__ __forceinline__ void pair_barrier(int id) {
  asm volatile("bar.sync %0, 64;\n" ::"r"(id) : "memory");
}

// One block of PortableMlaTile: rows [row0, row0 + 64) of (request b, KV head g), all value
// columns, keys [k_begin, k_end) of the request's P + Q (see the top of this file).
template <typename T>
__device__ void attention_mla_block(const AttentionParams& p, unsigned char* smem) {
  using Tile = PortableMlaTile<T>;
  using Mma = MmaType<T>;
  constexpr int KT = Tile::KT, ST = Tile::ST, QS = Tile::QS, PS = Tile::PS, NT = Tile::NT;
  constexpr int KSTEPS = Tile::KSTEPS, VT = Tile::VCOLS / 8;
  T* kbuf = reinterpret_cast<T*>(smem);
  float4* pair_sums = reinterpret_cast<float4*>(smem + Tile::kK);
  uint4* qtail_all = reinterpret_cast<uint4*>(smem + Tile::kK + Tile::kSums);
  T* pbuf = reinterpret_cast<T*>(smem + Tile::kK + Tile::kSums + Tile::kQTail);
  float* row_scale =
      reinterpret_cast<float*>(smem + Tile::kK + Tile::kSums + Tile::kQTail + Tile::kP);
  float* row_m = row_scale + Tile::BM;
  float* row_l = row_m + Tile::BM;
  int* moved = reinterpret_cast<int*>(row_l + Tile::BM);
  long long* ids = reinterpret_cast<long long*>(smem + Tile::kSmem - Tile::kIds);

  AttnBlock w;
  if (!attn_block(p, Tile::BM, Tile::DV, w)) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int quarter = warp % 4, upper = warp / 4;  // S: rows 16 * quarter.., head-dim half
  const int gr = lane >> 2, gc = lane & 3;         // fragment row group and column pair
  const int mi = lane >> 3, mr = lane & 7;         // ldmatrix: matrix and row of the lane

  using Gather = TileGather<T, KT, ST, Tile::kThreads, QS, QS, Tile::D / 8, 0>;
  const Gather gather{p, w, kbuf, kbuf, ids};
  gather.template prologue<false>();
  uint32_t page = gather.page_ahead(w.k_begin + KT);  // of the thread's key a tile ahead

  // The quarter's rows: their Q fragments (this warp's half of the head dim); the ancestor
  // bits of the lane's row whose softmax this warp runs (the lower warp the fragment's row
  // gr, the upper gr + 8).
  const int my_row = 16 * quarter + gr + 8 * upper;
  const int* bits;
  {
    const int* bits_of[2];
    rows_out(p, w, 16 * quarter + gr, bits_of);
    bits = upper ? bits_of[1] : bits_of[0];  // a select: an index would use local memory
  }
  // The last QTAIL k-steps' fragments go to this lane's slots in shared memory (read back by
  // the same lane only: no barrier).
  constexpr int KREG = Tile::KREG;
  uint32_t qf[KREG][4];
  uint4* qtail = qtail_all + warp * Tile::QTAIL * 32 + lane;  // k-step KREG + i at [32 * i]
  {
    const int r = w.row0 + 16 * quarter + gr;
    uint32_t q_all[KSTEPS][4];
    q_fragments<T, KSTEPS>(q_all, query_row<T>(p, w.b, w.g, r, w.group, w.m_rows),
                           query_row<T>(p, w.b, w.g, r + 8, w.group, w.m_rows),
                           upper * (Tile::D / 2) + 2 * gc, p.dqk, q_sign(p));
#pragma unroll
    for (int j = 0; j < KREG; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) qf[j][e] = q_all[j][e];
#pragma unroll
    for (int i = 0; i < Tile::QTAIL; ++i)
      qtail[32 * i] = make_uint4(q_all[KREG + i][0], q_all[KREG + i][1], q_all[KREG + i][2],
                                 q_all[KREG + i][3]);
  }
  // ldmatrix addresses of this lane: K (the warp's half of the head dim), V (the warp's
  // value columns of the same tile) and P.
  const int k_off = (mr + (mi >> 1) * 8) * QS + (mi & 1) * 8 + upper * (Tile::D / 2);
  const int v_off = (mr + (mi & 1) * 8) * QS + (mi >> 1) * 8 + warp * Tile::VCOLS;
  const T* pa = pbuf + (mr + (mi & 1) * 8) * PS + (mi >> 1) * 8;

  OneRowSoftmax sm;  // the lane's row this warp weighs
  float acc[4][VT][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int t = 0; t < VT; ++t) acc[i][t][0] = acc[i][t][1] = acc[i][t][2] = acc[i][t][3] = 0.0f;

  int st = 0;
  for (long long kt = w.k_begin; kt < w.k_end; kt += KT, st = st + 1 == ST ? 0 : st + 1) {
    gather.wait_tile();
    // The next tile's copies go out one chunk every other k-step of this tile's S.
    const typename Gather::RowChunks copies = gather.next_row(kt, st, page);
    const T* ks = kbuf + st * KT * QS;
    float s[NT][4];
    static_assert(2 * Gather::kChunks == KSTEPS, "a chunk every other k-step, every chunk");
    qk_tile_mla<T, NT, QS, KSTEPS, KREG>(s, qf, qtail, ks + k_off, [&](int j) {
      if (j % 2 == 1) gather.issue_chunk(copies, j / 2);
    });
    cp_async_commit();
    // The pair's two halves of S added up: each warp posts its partial for its partner's row
    // of the lane's two, then adds the partner's for its own (the same sum both ways). The
    // halves are picked by a branch the warp takes as one (a select per value otherwise).
    float v[NT][2];
    float4* mine = pair_sums + (2 * quarter + upper) * 2 * 32 + lane;
    if (upper) {
      mine[0] = make_float4(s[0][0], s[0][1], s[1][0], s[1][1]);
      mine[32] = make_float4(s[2][0], s[2][1], s[3][0], s[3][1]);
#pragma unroll
      for (int n = 0; n < NT; ++n) v[n][0] = s[n][2], v[n][1] = s[n][3];
    } else {
      mine[0] = make_float4(s[0][2], s[0][3], s[1][2], s[1][3]);
      mine[32] = make_float4(s[2][2], s[2][3], s[3][2], s[3][3]);
#pragma unroll
      for (int n = 0; n < NT; ++n) v[n][0] = s[n][0], v[n][1] = s[n][1];
    }
    pair_barrier(quarter + 1);
    {
      const float4* theirs = pair_sums + (2 * quarter + 1 - upper) * 2 * 32 + lane;
      const float4 o0 = theirs[0], o1 = theirs[32];
      v[0][0] += o0.x;
      v[0][1] += o0.y;
      v[1][0] += o0.z;
      v[1][1] += o0.w;
      v[2][0] += o1.x;
      v[2][1] += o1.y;
      v[3][0] += o1.z;
      v[3][1] += o1.w;
    }
    float mul;
    const float tile_max = score_row(p, v, kt, w.k_end, w.prefix, bits, gc, mul);
    float scale;
    const bool moves = sm.weigh(v, mul, tile_max, scale);
    if (moves && gc == 0) row_scale[my_row] = scale;
    if (lane == 0) moved[warp] = moves;
    T* prow = pbuf + my_row * PS + 2 * gc;
#pragma unroll
    for (int n = 0; n < NT; ++n)
      *reinterpret_cast<uint32_t*>(prow + n * 8) = Mma::pack(v[n][0], v[n][1]);
    // P, the factors and the flags of every warp; and whether any warp's rows moved (most
    // tiles move none, and then skip reading the eight flags).
    const bool any_moved = __syncthreads_or(moves);

    // O += P V over the tile's keys, after the rescale of the rows whose maximum moved (the
    // flags of the quarter's two warps, which the whole warp reads alike).
    if (any_moved) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int lo = moved[i], hi = moved[i + 4];
        if (lo | hi) {
          const float f[2] = {lo ? row_scale[16 * i + gr] : 1.0f,
                              hi ? row_scale[16 * i + gr + 8] : 1.0f};
          RowSoftmax::rescale(acc[i], f);
        }
      }
    }
    const T* vb = ks + v_off;
#pragma unroll
    for (int kk = 0; kk < KT / 16; ++kk) {
      uint32_t a[4][4];
#pragma unroll
      for (int i = 0; i < 4; ++i) ldmatrix_x4(a[i], pa + i * 16 * PS + kk * 16);
#pragma unroll
      for (int t = 0; t < VT; t += 2) {
        uint32_t bf[4];  // columns t*8.. (keys 0-7, 8-15), then columns t*8+8..
        ldmatrix_x4_trans(bf, vb + kk * 16 * QS + t * 8);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          Mma::mma(acc[i][t], a[i], bf);
          Mma::mma(acc[i][t + 1], a[i], bf + 2);
        }
      }
    }
  }
  cp_async_wait<0>();  // nothing in flight at exit
  // Each warp's row maxima and sums, to every warp's columns.
  sm.finish();
  if (gc == 0) {
    row_m[my_row] = sm.m;
    row_l[my_row] = sm.l;
  }
  __syncthreads();
  // The block's request and KV head again from %ctaid.z, read anew (a volatile read stays
  // here): kept across the loop instead, sm_120's build spilled it to local memory.
  AttnBlock at = w;
  int z;
  asm volatile("mov.u32 %0, %%ctaid.z;\n" : "=r"(z));
  attn_request(p, z, at);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int* unused[2];
    const RowsOut out = rows_out(p, at, 16 * i + gr, unused);
    RowSoftmax rows;
    rows.m[0] = row_m[16 * i + gr];
    rows.m[1] = row_m[16 * i + gr + 8];
    rows.l[0] = row_l[16 * i + gr];
    rows.l[1] = row_l[16 * i + gr + 8];
    write_rows<T>(p, out, acc[i], rows, warp * Tile::VCOLS, gc);
  }
}

}  // namespace ddtree
