// Tree verify attention (the verify forward's attention over a paged KV pool). Query row
// (b, i) attends to all P_b prefix tokens of request b and to the tree nodes j whose bit is
// set in tree.ancestor_bits[b, i] (read as bits, never expanded to a mask).
//
// The work of one request and KV head is a matrix of M = Q * group query rows, (node, head
// of the group) pairs: every query head of a group shares each KV tile, so the prefix is
// read once per row tile rather than once per query head. A block takes BM = 16 * kWarps of
// those rows, one chunk of DVC value columns and one split of the key range [0, P + Q)
// (flash-decoding: the splits fill the GPU at bs = 1; a second kernel merges their partial
// results by their log-sum-exp). Each warp owns 16 rows and runs mma.sync m16n8k16 (bf16 or
// fp16 in, fp32 accumulate) for S = Q K^T and O += P V with an online softmax in base 2.
// K/V tiles of KT keys are gathered from the pool by cp.async into ST stages (the next
// tiles load while this one computes), each key's row located once by the threads copying
// it; fragments come from shared memory by ldmatrix (transposed for V); shared rows are
// padded by 16 bytes against bank conflicts.
#pragma once
#include <cstddef>
#include <type_traits>

#include "common.cuh"

namespace ddtree {

// Arguments of the three attention kernels, passed by value; the Rust launcher builds its
// #[repr(C)] twin (crates/ddtree-cuda/src/attention.rs asserts the same size and offsets).
struct AttentionParams {
  const void* q;
  const void* k_new;
  const void* v_new;
  const void* k_cache;
  const void* v_cache;
  const void* kv_indptr;   // [bs + 1], int32 or int64 (index64)
  const void* kv_indices;  // page ids (slots when page_size == 1)
  const long long* prefix_lens;
  const int* ancestor_bits;  // [bs, Q, words]
  void* out;
  float* lse;     // [bs*Q, Hq] or null
  float* part;    // splits > 1: [splits, bs*Hkv, M, dv + 2] partial (o, m, l)
  int* status;    // [bs]: 0, or kStatusSlotOutOfRange (nothing written for the request)
  long long q_s0, q_s1, kn_s0, kn_s1, vn_s0, vn_s1;  // strides in elements (last dim 1)
  long long kc_s0, kc_s1, vc_s0, vc_s1, o_s0, o_s1;
  long long num_indices;
  long long num_slots;
  float sm_scale_log2;  // sm_scale * log2(e): scores in base 2
  int index64;
  int bs, q_nodes, hq, hkv;
  int dqk, dv, page_shift, words;
  int splits, row_tiles, dv_chunks, reserved;
};
static_assert(sizeof(AttentionParams) == 272, "AttentionParams layout");
static_assert(offsetof(AttentionParams, q_s0) == 104, "AttentionParams layout");
static_assert(offsetof(AttentionParams, sm_scale_log2) == 216, "AttentionParams layout");
static_assert(offsetof(AttentionParams, splits) == 256, "AttentionParams layout");

constexpr int kAttnPad = 8;  // elements of padding per shared-memory row (16 bytes)
constexpr float kLazyRescale = 8.0f;  // how far (base 2) a tile may pass the running max

// One m16n8k16 tensor-core product (bf16 or fp16 in, fp32 accumulate) and the packing of two
// fp32 values into its 16-bit operand pair.
template <typename T>
struct MmaType {
  static constexpr bool kHalf = std::is_same<T, __half>::value;
  static __device__ __forceinline__ void mma(float* c, const uint32_t* a, const uint32_t* b) {
    if constexpr (kHalf) {
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
          "{%8,%9}, {%0,%1,%2,%3};\n"
          : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    } else {
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
          "{%8,%9}, {%0,%1,%2,%3};\n"
          : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    if constexpr (kHalf) {
      __half2 v = __floats2half2_rn(lo, hi);
      return *reinterpret_cast<uint32_t*>(&v);
    } else {
      __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
      return *reinterpret_cast<uint32_t*>(&v);
    }
  }
};

__device__ __forceinline__ long long attn_index(const AttentionParams& p, long long i) {
  return p.index64 ? static_cast<const long long*>(p.kv_indices)[i]
                   : static_cast<const int*>(p.kv_indices)[i];
}
__device__ __forceinline__ long long attn_indptr(const AttentionParams& p, int b) {
  return p.index64 ? static_cast<const long long*>(p.kv_indptr)[b]
                   : static_cast<const int*>(p.kv_indptr)[b];
}

// Programmatic dependent launch (the launcher's attribute on the attention and the merge):
// a grid so launched may start while the grid before it in the stream runs, and must wait
// here before it reads what that grid writes. A plain launch returns at once.
__device__ __forceinline__ void wait_prior_grid() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}
// Lets the next grid in the stream (launched as above) start now: it waits for this one's
// results itself.
__device__ __forceinline__ void start_next_grid() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

// Stage 0, gridDim.x blocks per request: every page the prefix uses lies in the request's
// list and in kv_indices, and every slot it addresses in the pool; else
// kStatusSlotOutOfRange, and the attention kernels skip the request (its output rows keep
// their values). The launcher sets status to kStatusOk first; a block that finds a bad page
// among its share (pages blockIdx.x * blockDim.x + threadIdx.x, a grid's width apart)
// overwrites it, so that a long prefix's pages are checked by many blocks at once.
__device__ void attention_check(const AttentionParams& p, int b) {
  start_next_grid();  // the attention's blocks may start (and some copy their queries)
  const long long len = p.prefix_lens[b];
  const int ps = 1 << p.page_shift;
  const long long start = attn_indptr(p, b), end = attn_indptr(p, b + 1);
  const long long pages = len > 0 ? ((len - 1) >> p.page_shift) + 1 : 0;
  int bad = len < 0 || start < 0 || start + pages > end || start + pages > p.num_indices;
  if (!bad) {
    const long long width = static_cast<long long>(gridDim.x) * blockDim.x;
#pragma unroll 2  // a thread's two pages (check_blocks) in one round trip
    for (long long i = blockIdx.x * blockDim.x + threadIdx.x; i < pages; i += width) {
      const long long used = i + 1 < pages ? ps : len - (i << p.page_shift);
      const long long page = attn_index(p, start + i);
      // page * ps + used <= slots, compared without forming a product that could overflow.
      bad |= page < 0 || p.num_slots < used || page > ((p.num_slots - used) >> p.page_shift);
    }
  }
  bad = __syncthreads_or(bad);
  if (threadIdx.x == 0 && bad) p.status[b] = kStatusSlotOutOfRange;
}

// The low 32 bits of page-table entry i: the page, which the check bounded by the pool's
// slots (< 2^32). One 32-bit load, so that nothing has to wait for it to widen the value.
__device__ __forceinline__ uint32_t page_at(const AttentionParams& p, long long i) {
  return static_cast<const uint32_t*>(p.kv_indices)[p.index64 ? 2 * i : i];
}

// The pool slot of prefix token t of request b (checked by attention_check).
__device__ __forceinline__ long long prefix_slot(const AttentionParams& p, long long start,
                                                 long long t) {
  const long long page = attn_index(p, start + (t >> p.page_shift));
  return (page << p.page_shift) | (t & ((1ll << p.page_shift) - 1));
}

// Page-table staging: the entries of the pages the prefix keys of the tile of KT keys at
// kt use, copied by threads 0 .. KT - 1 into `ids` (KT 8-byte slots) by cp.async, not
// committed (they join the caller's group). A tile gathered later finds its keys' page ids
// there (`staged_slot`, `TileGather::staged_row`) instead of waiting on a page-table read
// from global memory.
template <int KT>
__device__ __forceinline__ void stage_page_ids(const AttentionParams& p, long long* ids,
                                               long long kt, long long k_end, long long prefix,
                                               long long start, int tid) {
  const long long last = min(k_end, prefix) - 1;  // the tile's last prefix key, if any
  const long long page = (kt >> p.page_shift) + tid;
  if (tid < KT && kt <= last && page <= (last >> p.page_shift)) {
    const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(ids + tid));
    if (p.index64)
      asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(dst),
                   "l"(static_cast<const long long*>(p.kv_indices) + start + page));
    else
      asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst),
                   "l"(static_cast<const int*>(p.kv_indices) + start + page));
  }
}
// The pool slot of prefix key t of the tile at kt, from the tile's staged page ids.
__device__ __forceinline__ long long staged_slot(const AttentionParams& p, const long long* ids,
                                                 long long kt, long long t) {
  const long long* e = ids + ((t >> p.page_shift) - (kt >> p.page_shift));
  const long long page = p.index64 ? *e : *reinterpret_cast<const int*>(e);
  return (page << p.page_shift) | (t & ((1ll << p.page_shift) - 1));
}

// Where a block's keys come from, by kind ([0] the tree's rows of k_new / v_new, [1] the
// pool), at its KV head g (V from value column col0), with each kind's row stride: written
// once by the block's first thread and read per key thereafter, so that a tile's copies
// find their source with two loads instead of recomputing these per tile (TileGather).
template <typename T>
struct KeySources {
  const T* k[2];
  const T* v[2];
  long long ks[2];
  long long vs[2];
};
static_assert(sizeof(KeySources<__half>) == 64, "KeySources: the 64 bytes the tiles reserve");

// A block's tile: kWarps warps over the query rows (16 * MT each: MT m16 tiles a warp, which
// share every K and V fragment the warp loads, so a tile's shared-memory reads serve MT
// times the products), DVC value columns, KT keys per K/V tile, ST tiles in flight. (MLA's
// absorbed form, V a view of K, has its own tile: attention_mla.cuh.)
template <typename T, int D, int DVC, int kWarps, int KT, int ST = 2, int MT = 1>
struct AttnTile {
  static constexpr int WM = 16 * MT;           // query rows per warp
  static constexpr int BM = WM * kWarps;       // query rows per block
  static constexpr int QS = D + kAttnPad;      // shared row stride of Q and K, elements
  static constexpr int VS = DVC + kAttnPad;    // of V
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kStages = ST;  // K/V tiles in flight: the next loads while this computes
  // Q, the stages' K and V rows, then each stage's staged page ids (KT 8-byte entries) and
  // the block's KeySources.
  static constexpr size_t kSmem =
      sizeof(T) * (static_cast<size_t>(BM) * QS + kStages * KT * (QS + VS)) +
      sizeof(long long) * kStages * KT + sizeof(KeySources<T>);
  static_assert(MT >= 1 && MT <= 2, "one or two m16 tiles a warp");
};

// 16 bytes global -> shared without a register round trip; zero-filled when !valid.
// (cp_async16_at: the same to a shared-space address already converted.)
__device__ __forceinline__ void cp_async16_at(unsigned dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  cp_async16_at(static_cast<unsigned>(__cvta_generic_to_shared(dst)), src, valid);
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Four 8x8 b16 matrices from shared memory (lane l addresses a row of matrix l / 8).
__device__ __forceinline__ void ldmatrix_x4(uint32_t* r, const void* p) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t* r, const void* p) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

// A row of n valid elements (zeros past them, and the whole row when src is null) into dst,
// `width` elements, by `lanes` threads from `lane`, as 16-byte cp.async copies: all of a
// thread's in flight at once (a load-and-store loop waits for each). Not committed.
template <typename T>
__device__ __forceinline__ void copy_row_async(T* dst, const T* src, const T* any, int n,
                                               int width, int lane, int lanes) {
  for (int c = lane * 8; c < width; c += lanes * 8) {
    const bool valid = src != nullptr && c < n;
    cp_async16(dst + c, valid ? src + c : any, valid);  // any: an address never read
  }
}

// Rows of key t of the request's P + Q: a prefix token's at its pool slot `slot`, or a tree
// node's row of k_new/v_new (slot unused). V starts at value column col0. Never read (the
// copy is zero-size) when !valid.
template <typename T>
struct KeyRows {
  const T* k;
  const T* v;
};
template <typename T>
__device__ __forceinline__ KeyRows<T> key_rows_at(const AttentionParams& p, int b, int g,
                                                  long long prefix, long long t, long long slot,
                                                  bool valid, int col0) {
  const T* k_new = static_cast<const T*>(p.k_new);
  const T* v_new = static_cast<const T*>(p.v_new);
  if (!valid) return {k_new, v_new};
  if (t < prefix)
    return {static_cast<const T*>(p.k_cache) + slot * p.kc_s0 + g * p.kc_s1,
            static_cast<const T*>(p.v_cache) + slot * p.vc_s0 + g * p.vc_s1 + col0};
  const long long row = static_cast<long long>(b) * p.q_nodes + (t - prefix);
  return {k_new + row * p.kn_s0 + g * p.kn_s1, v_new + row * p.vn_s0 + g * p.vn_s1 + col0};
}
// The query row of M (a (node, head) pair) of request b and KV head g; null past M.
template <typename T>
__device__ __forceinline__ const T* query_row(const AttentionParams& p, int b, int g, int row,
                                              int group, int m_rows) {
  if (row >= m_rows) return nullptr;
  const int node = row / group, h = g * group + row % group;
  return static_cast<const T*>(p.q) + (static_cast<long long>(b) * p.q_nodes + node) * p.q_s0 +
         h * p.q_s1;
}

// What a block of BM rows and DVB value columns works on (blockIdx): request b and KV head
// g (z = b * Hkv + g), rows row0 .. of the request's M = Q * group, value columns col0 ..
// (dv_here of them real), and its split's keys [k_begin, k_end) of the request's P + Q.
struct AttnBlock {
  int z, b, g, group, m_rows, col0, row0, dv_here;
  long long prefix, k_begin, k_end, start;
};
// w's request b and KV head g from z = b * Hkv + g (blockIdx.z).
__device__ __forceinline__ void attn_request(const AttentionParams& p, int z, AttnBlock& w) {
  w.z = z;
  w.b = z / p.hkv;
  w.g = z % p.hkv;
}
// The block's place in the call (from blockIdx and the shapes alone, nothing read): w's
// request, KV head, rows and value columns. The merge may launch from here on: it only
// starts once every block has passed this point (so it never holds an SM a block of this
// grid still needs) and waits for the partials itself.
__device__ __forceinline__ void attn_place(const AttentionParams& p, int bm, int dvb,
                                           AttnBlock& w) {
  start_next_grid();
  attn_request(p, blockIdx.z, w);
  w.group = p.hq / p.hkv;
  w.m_rows = p.q_nodes * w.group;
  w.col0 = (blockIdx.x % p.dv_chunks) * dvb;
  w.row0 = (blockIdx.x / p.dv_chunks) * bm;
  w.dv_here = min(dvb, p.dv - w.col0);
}
// The rest of w, once the index check's status is visible: the request's prefix, page list
// and this split's keys [k_begin, k_end) of its P + Q. The three reads go out together.
// False when the request failed its check (the block has nothing to do).
__device__ __forceinline__ bool attn_keys(const AttentionParams& p, AttnBlock& w) {
  wait_prior_grid();
  const int status = p.status[w.b];
  w.prefix = p.prefix_lens[w.b];
  w.start = attn_indptr(p, w.b);
  if (status != kStatusOk) return false;
  const long long total = w.prefix + p.q_nodes;
  const long long per = (total + p.splits - 1) / p.splits;
  w.k_begin = blockIdx.y * per;
  w.k_end = min(total, w.k_begin + per);
  return true;
}
// Both of the above: false (and w half-filled) when the request failed its index check.
__device__ __forceinline__ bool attn_block(const AttentionParams& p, int bm, int dvb,
                                           AttnBlock& w) {
  attn_place(p, bm, dvb, w);
  return attn_keys(p, w);
}

// Scores of one tile of NT * 8 keys starting at key kt, in the m16n8 accumulator layout
// (this thread's rows 0 and 1 of its fragment; key n * 8 + 2 * gc + (e & 1)): scaled to base
// 2, keys past the split and tree nodes that are no ancestor of the row set to -inf, and
// each row's maximum over its four lanes. !kScale: the scores stay unscaled (the caller
// folds the scale into its exponentials), as does the maximum.
template <int NT, bool kScale = true>
__device__ __forceinline__ void score_tile(const AttentionParams& p, float (&s)[NT][4],
                                           long long kt, long long k_end, long long prefix,
                                           const int* const (&bits_of)[2], int gc,
                                           float (&tile_max)[2]) {
  constexpr int KT = NT * 8;
  tile_max[0] = tile_max[1] = -INFINITY;
  if (kt + KT <= min(k_end, prefix)) {  // a whole tile of prefix keys: nothing masked
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if constexpr (kScale) s[n][e] *= p.sm_scale_log2;
        tile_max[e >> 1] = fmaxf(tile_max[e >> 1], s[n][e]);
      }
  } else {
    const int in_split = static_cast<int>(min(static_cast<long long>(KT), k_end - kt));
    const int first_tree = static_cast<int>(max(0ll, min(static_cast<long long>(KT), prefix - kt)));
    const int node0 = static_cast<int>(kt - prefix);  // tree node of the tile's key 0
#pragma unroll
    for (int n = 0; n < NT; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e >> 1, key = n * 8 + gc * 2 + (e & 1);
        bool ok = key < in_split;
        if (ok && key >= first_tree) {
          const int j = node0 + key;
          ok = (bits_of[h][j >> 5] >> (j & 31)) & 1;
        }
        s[n][e] = ok ? (kScale ? s[n][e] * p.sm_scale_log2 : s[n][e]) : -INFINITY;
        tile_max[h] = fmaxf(tile_max[h], s[n][e]);
      }
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
    tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
  }
}

// 2^x by the special function unit alone (denormal results flush to zero: a weight below
// 2^-126 of the row's largest is lost in the bf16/fp16 P anyway).
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// The online softmax of this thread's two rows: the running maximum m (base 2) and sum l.
// The maximum moves (and the accumulators are rescaled) only when a row's tile maximum
// passes it by more than kLazyRescale: below that the weights exp2(s - m) stay under
// 2^kLazyRescale, exact enough in fp32 and bf16/fp16 alike, and the rescale of every
// accumulator is skipped on most tiles. A warp decides as one, so its rows' m and l stay
// consistent with its accumulators; warps that hold the same scores decide alike.
struct RowSoftmax {
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.0f, 0.0f};

  // Moves the maximum to the tile's where a row's passes it by more than kLazyRescale (the
  // warp decides as one): true, with l scaled and `scale` the factor for the accumulators.
  __device__ __forceinline__ bool move_max(const float (&tile_max)[2], float (&scale)[2]) {
    const bool grows = tile_max[0] > m[0] + kLazyRescale || tile_max[1] > m[1] + kLazyRescale;
    const bool moves = __any_sync(0xffffffffu, grows);
    if (moves) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float m_new = fmaxf(m[h], tile_max[h]);
        scale[h] = m_new == -INFINITY ? 1.0f : exp2f(m[h] - m_new);
        m[h] = m_new;
        l[h] *= scale[h];
      }
    }
    return moves;
  }

  // Rescales acc if the maximum moves, then writes the weights P (as 16-bit pairs, [n][row
  // half]) and adds them to l.
  template <typename T, int NT, int VT>
  __device__ __forceinline__ void update(const float (&s)[NT][4], const float (&tile_max)[2],
                                         float (&acc)[VT][4], uint32_t (&pa)[NT][2]) {
    float scale[2];
    if (move_max(tile_max, scale)) rescale(acc, scale);
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      float e[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int h = i >> 1;
        e[i] = m[h] == -INFINITY ? 0.0f : exp2_ftz(s[n][i] - m[h]);
        l[h] += e[i];
      }
      pa[n][0] = MmaType<T>::pack(e[0], e[1]);
      pa[n][1] = MmaType<T>::pack(e[2], e[3]);
    }
  }

  // update in three steps, for a caller whose O += P V of the previous tile is still
  // running (the Hopper warp-specialized kernel): weigh moves the maximum (true when the
  // accumulators must be scaled, by `scale`) and turns s into the weights in place, adding
  // them to l; once that product is done, rescale scales the accumulators and pack writes P.
  template <int NT>
  __device__ __forceinline__ bool weigh(float (&s)[NT][4], const float (&tile_max)[2],
                                        float (&scale)[2]) {
    const bool moves = move_max(tile_max, scale);
    // A row with no key yet has m = -inf and scores all -inf: subtracting 0 gives weights 0.
    const float base[2] = {m[0] == -INFINITY ? 0.0f : m[0], m[1] == -INFINITY ? 0.0f : m[1]};
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int h = i >> 1;
        s[n][i] = exp2_ftz(s[n][i] - base[h]);
        l[h] += s[n][i];
      }
    return moves;
  }
  template <int VT>
  static __device__ __forceinline__ void rescale(float (&acc)[VT][4], const float (&scale)[2]) {
#pragma unroll
    for (int t = 0; t < VT; ++t) {
      acc[t][0] *= scale[0];
      acc[t][1] *= scale[0];
      acc[t][2] *= scale[1];
      acc[t][3] *= scale[1];
    }
  }
  template <typename T, int NT>
  static __device__ __forceinline__ void pack(const float (&w)[NT][4], uint32_t (&pa)[NT][2]) {
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      pa[n][0] = MmaType<T>::pack(w[n][0], w[n][1]);
      pa[n][1] = MmaType<T>::pack(w[n][2], w[n][3]);
    }
  }

  // The row sums over the four lanes that share a row.
  __device__ __forceinline__ void finish() {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
      l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    }
  }
};

// Where a block's results go: request b, KV head g (z = b * Hkv + g), value columns
// [col0, col0 + dv_here) of the block, this thread's two rows of M.
struct RowsOut {
  int z, b, g, group, m_rows, col0, dv_here;
  int rows_of[2];
};
// The block's RowsOut for this thread's rows r and r + 8 of the block, and the ancestor bits
// of their tree nodes (a row past M takes the last row's).
__device__ __forceinline__ RowsOut rows_out(const AttentionParams& p, const AttnBlock& w,
                                            int r, const int* (&bits_of)[2]) {
  const RowsOut out{w.z, w.b, w.g, w.group, w.m_rows, w.col0, w.dv_here,
                    {w.row0 + r, w.row0 + r + 8}};
  for (int h = 0; h < 2; ++h) {
    const int node = min(out.rows_of[h], w.m_rows - 1) / w.group;
    bits_of[h] = p.ancestor_bits + (static_cast<long long>(w.b) * p.q_nodes + node) * p.words;
    // Into L2 now, so that the tile of tree keys (the last) does not wait on memory for them.
    asm volatile("prefetch.L2 [%0];\n" ::"l"(bits_of[h]));
  }
  return out;
}

// This thread's results: the normalised rows (and LSE) when the call has one split, else
// the split's partial (o, m, l) for the merge. `wcol`: the warp's first value column in the
// block; gc: the lane's column pair.
template <typename T, int VT>
__device__ __forceinline__ void write_rows(const AttentionParams& p, const RowsOut& w,
                                           const float (&acc)[VT][4], const RowSoftmax& sm,
                                           int wcol, int gc) {
  // Unrolled (h indexes acc) with guards, not a break or continue: a loop with a runtime
  // exit would index acc dynamically and move it to local memory.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = w.rows_of[h];
    if (row >= w.m_rows) continue;
    const int node = row / w.group, head = w.g * w.group + row % w.group;
    const long long qrow = static_cast<long long>(w.b) * p.q_nodes + node;
    if (p.splits == 1) {
      T* o = static_cast<T*>(p.out) + qrow * p.o_s0 + head * p.o_s1 + w.col0;
      const float inv = sm.l[h] > 0.0f ? 1.0f / sm.l[h] : 0.0f;
#pragma unroll
      for (int t = 0; t < VT; ++t) {
        const int c = wcol + t * 8 + gc * 2;
        if (c < w.dv_here) {
          o[c] = from_f32<T>(acc[t][2 * h] * inv);
          o[c + 1] = from_f32<T>(acc[t][2 * h + 1] * inv);
        }
      }
      if (p.lse != nullptr && w.col0 == 0 && wcol == 0 && gc == 0)
        p.lse[qrow * p.hq + head] = (sm.m[h] + log2f(sm.l[h])) * 0.69314718055994531f;
    } else {
      const long long at =
          ((static_cast<long long>(blockIdx.y) * p.bs * p.hkv + w.z) * w.m_rows + row) *
          (p.dv + 2);
      float* part = p.part + at;
      // A pair a store: a partial row (dv + 2 floats) starts 8-byte aligned, and col0 + c
      // is even.
#pragma unroll
      for (int t = 0; t < VT; ++t) {
        const int c = wcol + t * 8 + gc * 2;
        if (c < w.dv_here)
          *reinterpret_cast<float2*>(part + w.col0 + c) =
              make_float2(acc[t][2 * h], acc[t][2 * h + 1]);
      }
      if (w.col0 == 0 && wcol == 0 && gc == 0) {
        part[p.dv] = sm.m[h];
        part[p.dv + 1] = sm.l[h];
      }
    }
  }
}

// How many independent chains of products S = Q K^T is summed in: a warp's MN = MT * NT
// accumulators take one product per k-step each, and an m16n8k16 product waits for the
// previous one into its accumulator (a fixed latency of tens of cycles); the d576 tile has
// two per k-step and 36 k-steps, so it splits the k-steps over up to 8 / MN chains, added
// up at the end. The largest of 4, 3, 2 that divides the k-steps, or 1.
__host__ __device__ constexpr int qk_chains(int mn, int ksteps) {
  for (int r = 4; r > 1; --r)
    if (ksteps % r == 0 && mn * r <= 8) return r;
  return 1;
}

// S = Q K^T, unscaled, into s for the warp's MT m16 tiles and the tile's NT * 8 keys over
// KSTEPS k-steps of 16: qa and kb are this lane's ldmatrix addresses of Q's and K's first
// columns (Q's m16 tile i 16 * i rows further), rows QS elements apart. Each K fragment
// serves the MT tiles; the k-steps go round `qk_chains` accumulator sets.
template <typename T, int MT, int NT, int QS, int KSTEPS>
__device__ __forceinline__ void qk_tile(float (&s)[MT][NT][4], const T* qa, const T* kb) {
  constexpr int R = qk_chains(MT * NT, KSTEPS);
  float c[R][MT][NT][4];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int n = 0; n < NT; ++n) c[r][i][n][0] = c[r][i][n][1] = c[r][i][n][2] = c[r][i][n][3] = 0.0f;
#pragma unroll
  for (int j0 = 0; j0 < KSTEPS; j0 += R) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int kk = (j0 + r) * 16;
      uint32_t a[MT][4];
#pragma unroll
      for (int i = 0; i < MT; ++i) ldmatrix_x4(a[i], qa + i * 16 * QS + kk);
#pragma unroll
      for (int n = 0; n < NT; n += 2) {
        uint32_t bf[4];  // keys n*8.. (k 0-7, 8-15), then keys n*8+8.. (k 0-7, 8-15)
        ldmatrix_x4(bf, kb + n * 8 * QS + kk);
#pragma unroll
        for (int i = 0; i < MT; ++i) {
          MmaType<T>::mma(c[r][i][n], a[i], bf);
          MmaType<T>::mma(c[r][i][n + 1], a[i], bf + 2);
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float sum = c[0][i][n][e];
#pragma unroll
        for (int r = 1; r < R; ++r) sum += c[r][i][n][e];
        s[i][n][e] = sum;
      }
}

// A block's gather of its split's keys into ST stages of KT keys (K rows QS elements apart
// in kbuf, V rows VS apart in vbuf; KC and VC 16-byte chunks of each), pipelined through
// cp.async: `prologue` puts the first ST - 1 tiles in flight, `next` waits for the tile at
// kt (stage st) and refills the stage computed before it with the tile ST - 1 ahead. Each
// key of a tile has kThreads / KT threads, which copy its rows in neighbouring 16-byte
// chunks (coalesced); a tile's page ids are staged in shared memory (ids, KT a stage) a
// tile before its rows are gathered, so no gather waits on a page-table read (the MLA tile
// loads each thread's page a tile ahead into a register instead: page_ahead, next_row),
// and the block's KeySources follow them (written once by `prologue`).
template <typename T, int KT, int ST, int kThreads, int QS, int VS, int KC, int VC>
struct TileGather {
  static constexpr int TPK = kThreads / KT;
  static_assert(kThreads % KT == 0 && KC % TPK == 0 && VC % TPK == 0,
                "a tile's keys split evenly over the threads, and their rows over a key's");
  const AttentionParams& p;
  const AttnBlock& w;
  T* kbuf;
  T* vbuf;
  long long* ids;

  __device__ __forceinline__ int my_key() const { return threadIdx.x / TPK; }
  __device__ __forceinline__ int my_part() const { return threadIdx.x % TPK; }

  // Where this thread's key of the tile at kt goes in stage st (its K and V rows) and where
  // it comes from (`slot`: its pool slot, when a prefix token); `valid` false past the split.
  struct KeyCopy {
    T* k;
    T* v;
    KeyRows<T> src;
    bool valid;
  };
  __device__ __forceinline__ KeyCopy key_copy(long long kt, int st, long long slot) const {
    const long long t = kt + my_key();
    const bool valid = t < w.k_end;
    return {kbuf + (st * KT + my_key()) * QS, vbuf + (st * KT + my_key()) * VS,
            key_rows_at<T>(p, w.b, w.g, w.prefix, t, slot, valid, w.col0), valid};
  }
  // 16-byte chunk i (< KC / TPK) of this thread's K row.
  __device__ __forceinline__ void copy_k_chunk(const KeyCopy& c, int i) const {
    const int col = (my_part() + i * TPK) * 8;
    cp_async16(c.k + col, c.src.k + col, c.valid && col < p.dqk);
  }
  // Issues (and commits) the loads of the tile at key kt into stage `st`, this thread's
  // key's prefix rows from pool slot `slot`.
  __device__ __forceinline__ void issue(long long kt, int st, long long slot) const {
    issue_copy(key_copy(kt, st, slot));
  }
  // Issues (and commits) this thread's copies of its key's K and V rows.
  __device__ __forceinline__ void issue_copy(const KeyCopy& c) const {
#pragma unroll
    for (int i = 0; i < KC / TPK; ++i) copy_k_chunk(c, i);
#pragma unroll
    for (int i = 0; i < VC / TPK; ++i) {
      const int col = (my_part() + i * TPK) * 8;
      cp_async16(c.v + col, c.src.v + col, c.valid && col < w.dv_here);
    }
    cp_async_commit();
  }
  // This thread's key of the tile at `ahead` (stage `fill`, its page ids staged there): which
  // row of the pool or of the tree it is, found without a branch, so that its copies' setup
  // is a few instructions rather than a tree of them (every source is computed and the right
  // one selected). `valid` false past the split or when `any` is (no tile to load).
  struct StagedRow {
    long long row;  // the pool slot of a prefix key, else the tree node's row of k_new
    bool in_prefix, valid;
  };
  __device__ __forceinline__ StagedRow staged_row(long long ahead, int fill, bool any) const {
    const int key = my_key();
    const long long t = ahead + key;
    // The key's page id among the tile's staged ones: entry (t >> s) - (ahead >> s), found in
    // 32 bits (below KT). A tree key's entry is read too and selected away.
    const int mask = (1 << p.page_shift) - 1;
    const long long* entry =
        ids + fill * KT + (((static_cast<int>(ahead) & mask) + key) >> p.page_shift);
    const long long page = p.index64 ? *entry : *reinterpret_cast<const int*>(entry);
    const long long slot = (page << p.page_shift) | (static_cast<int>(t) & mask);
    const long long node = static_cast<long long>(w.b) * p.q_nodes + (t - w.prefix);
    const bool in_prefix = t < w.prefix;
    return {in_prefix ? slot : node, in_prefix, any && t < w.k_end};
  }
  // The K row (and V row, from value column col0) of a StagedRow, from the block's
  // KeySources.
  __device__ __forceinline__ const T* k_row(const StagedRow& r) const {
    const KeySources<T>& s = *sources();
    return s.k[r.in_prefix] + r.row * s.ks[r.in_prefix];
  }
  __device__ __forceinline__ const T* v_row(const StagedRow& r) const {
    const KeySources<T>& s = *sources();
    return s.v[r.in_prefix] + r.row * s.vs[r.in_prefix];
  }
  // The block's KeySources: after the stages' page ids.
  __device__ __forceinline__ KeySources<T>* sources() const {
    return reinterpret_cast<KeySources<T>*>(ids + ST * KT);
  }
  // Written by the first thread before the first tile's barrier (`prologue`).
  __device__ __forceinline__ void write_sources() const {
    if (threadIdx.x != 0) return;
    KeySources<T>& s = *sources();
    s.k[0] = static_cast<const T*>(p.k_new) + w.g * p.kn_s1;
    s.k[1] = static_cast<const T*>(p.k_cache) + w.g * p.kc_s1;
    s.v[0] = static_cast<const T*>(p.v_new) + w.g * p.vn_s1 + w.col0;
    s.v[1] = static_cast<const T*>(p.v_cache) + w.g * p.vc_s1 + w.col0;
    s.ks[0] = p.kn_s0;
    s.ks[1] = p.kc_s0;
    s.vs[0] = p.vn_s0;
    s.vs[1] = p.vc_s0;
  }
  // A tile's K rows issued chunk by chunk between other work (the MLA tile spreads them over
  // its products, so the copies neither queue up at once nor hold the registers the
  // instructions after them need). `n`: how many of the thread's chunks are real (0 past
  // the split or with no tile to load); the rest are zero-filled.
  struct RowChunks {
    unsigned dst;  // shared address of the thread's first chunk
    const T* src;  // global address of the same
    int n;
  };
  static constexpr int kChunks = KC / TPK;  // a thread's 16-byte chunks of a K row
  // The page of this thread's key of the tile at t0 (0 for a tree key or one past the
  // split: nothing is loaded), loaded a tile before next_row forms the key's row from it,
  // so that the load has long landed by then. Every warp loads its own keys' pages (where
  // page ids staged in shared memory took warp 0 alone a page-table condition and a copy
  // a tile, on the path every other warp then waited for at the barriers).
  __device__ __forceinline__ uint32_t page_ahead(long long t0) const {
    const long long t = t0 + my_key();
    return t < min(w.k_end, w.prefix) ? page_at(p, w.start + (t >> p.page_shift)) : 0u;
  }
  // `next` without its wait (`wait_tile`, before) and its K copies, for the MLA tile: the
  // chunks of this thread's key of the tile ST - 1 ahead of the tile at kt (stage st),
  // whose page `page` holds (page_ahead a tile ago), which then takes the page of the
  // thread's key of the tile after. Issue every chunk, then commit.
  __device__ __forceinline__ RowChunks next_row(long long kt, int st, uint32_t& page) const {
    static_assert(VC == 0 && ST == 2, "K rows only, one tile ahead");
    const long long ahead = kt + KT;
    const int fill = st ^ 1;
    const long long t = ahead + my_key();
    const bool in_prefix = t < w.prefix;
    // A pool slot is under 2^32 (the launcher's check_pool), a tree node's row too.
    const uint32_t slot =
        (page << p.page_shift) | (static_cast<uint32_t>(t) & ((1u << p.page_shift) - 1));
    const long long node = static_cast<long long>(w.b) * p.q_nodes + (t - w.prefix);
    const StagedRow r{in_prefix ? static_cast<long long>(slot) : node, in_prefix, t < w.k_end};
    page = page_ahead(ahead + KT);
    const T* k_new = static_cast<const T*>(p.k_new);
    const int col = my_part() * 8;
    // Chunk i covers columns col + 8 * TPK * i ..: real while below dqk (a multiple of 8).
    const int real = min(kChunks, max(0, (p.dqk - col + 8 * TPK - 1) / (8 * TPK)));
    const T* dst = kbuf + (fill * KT + my_key()) * QS + col;
    return {static_cast<unsigned>(__cvta_generic_to_shared(dst)),
            (r.valid ? k_row(r) : k_new) + col, r.valid ? real : 0};
  }
  // Chunk i (< kChunks) of this thread's K row.
  __device__ __forceinline__ void issue_chunk(const RowChunks& c, int i) const {
    cp_async16_at(c.dst + i * TPK * 16, c.src + i * TPK * 8, i < c.n);
  }
  // The pool slot of this thread's key in the tile at kt (0 for a tree node or a key past
  // the split), read from the page table: the prologue's tiles, whose page ids were not
  // staged (later tiles find theirs by staged_row, or the MLA tile's by page_ahead).
  __device__ __forceinline__ long long slot_of(long long kt) const {
    const long long t = kt + my_key();
    if (t >= w.prefix || t >= w.k_end) return 0;
    return prefix_slot(p, w.start, t);
  }
  // The tile ST - 1 ahead of the tile at kt (in stage st) has its page ids staged in the
  // same commit group as this one's rows: they land by the time that tile is issued.
  // (The threads past KT branch away first, before any of the 64-bit arithmetic.)
  __device__ __forceinline__ void stage_ahead(long long kt, int st) const {
    if (threadIdx.x >= KT) return;
    const long long later = kt + static_cast<long long>(ST - 1) * KT;
    stage_page_ids<KT>(p, ids + (st + ST - 1) % ST * KT, later, w.k_end, w.prefix, w.start,
                       threadIdx.x);
  }
  // The first ST - 1 tiles in flight (an empty commit group keeps the count uniform), their
  // slots read from the page table here, once. kStaged: whether later tiles find their page
  // ids staged (`next`), else the caller loads them (page_ahead; the MLA tile).
  template <bool kStaged = true>
  __device__ __forceinline__ void prologue() const {
    write_sources();
#pragma unroll
    for (int i = 0; i < ST - 1; ++i) {
      const long long kt = w.k_begin + static_cast<long long>(i) * KT;
      if (kt < w.k_end) {
        if (kStaged) stage_ahead(kt, i);
        issue(kt, i, slot_of(kt));
      } else {
        cp_async_commit();
      }
    }
  }
  // Waits until the tile at kt (stage st) has landed for every thread (and whatever the
  // block copied before its first tile), then refills the stage computed last iteration
  // (every warp has passed the barrier, so it is free) with the tile ST - 1 ahead; an empty
  // group past the end.
  __device__ __forceinline__ void next(long long kt, int st) const {
    long long ahead;
    int fill;
    if (refill(kt, st, ahead, fill))
      issue_staged(ahead, fill);
    else
      cp_async_commit();
  }
  // `issue` for a tile whose page ids are staged (stage `fill`), its rows found by
  // staged_row.
  __device__ __forceinline__ void issue_staged(long long ahead, int fill) const {
    const StagedRow r = staged_row(ahead, fill, true);
    const KeyRows<T> src = {r.valid ? k_row(r) : static_cast<const T*>(p.k_new),
                            r.valid ? v_row(r) : static_cast<const T*>(p.v_new)};
    issue_copy({kbuf + (fill * KT + my_key()) * QS, vbuf + (fill * KT + my_key()) * VS, src,
                r.valid});
  }
  // next's first half: waits for the tile at kt (stage st), then `ahead_of`.
  __device__ __forceinline__ bool refill(long long kt, int st, long long& ahead,
                                         int& fill) const {
    wait_tile();
    return ahead_of(kt, st, ahead, fill);
  }
  // Waits until the tile this iteration computes has landed for every thread (and every
  // warp is done with the stage the iteration refills).
  __device__ __forceinline__ void wait_tile() const {
    cp_async_wait<ST - 2>();
    __syncthreads();
  }
  // Unless the tile ST - 1 ahead of the tile at kt (stage st) is past the split (false),
  // sets it and the stage it refills and stages the page ids of the tile after it.
  __device__ __forceinline__ bool ahead_of(long long kt, int st, long long& ahead,
                                           int& fill) const {
    ahead = kt + static_cast<long long>(ST - 1) * KT;
    fill = st == 0 ? ST - 1 : st - 1;
    if (ahead >= w.k_end) return false;
    stage_ahead(ahead, fill);
    return true;
  }
};

// One block: rows [row0, row0 + BM) of (request b, KV head g), value columns
// [col0, col0 + DVC), keys [k_begin, k_end) of the request's P + Q, in tiles of KT keys
// pipelined through cp.async (the next ST - 1 tiles load while one computes). Warp w takes
// rows WM * w .. + WM (MT m16 tiles) and all of the block's value columns.
template <typename T, int D, int DVC, int kWarps, int KT, int ST = 2, int MT = 1>
__device__ void attention_block(const AttentionParams& p, unsigned char* smem) {
  using Tile = AttnTile<T, D, DVC, kWarps, KT, ST, MT>;
  using Mma = MmaType<T>;
  constexpr int BM = Tile::BM, WM = Tile::WM, QS = Tile::QS, VS = Tile::VS, NT = KT / 8;
  constexpr int VT = DVC / 8;  // value column tiles of a warp
  constexpr int KC = D / 8, VC = DVC / 8;  // 16-byte chunks of a K row, a V row
  T* qs = reinterpret_cast<T*>(smem);
  T* kbuf = qs + BM * QS;                    // [kStages][KT][QS]
  T* vbuf = kbuf + Tile::kStages * KT * QS;  // [kStages][KT][VS]
  long long* ids = reinterpret_cast<long long*>(vbuf + Tile::kStages * KT * VS);  // [kStages][KT]

  AttnBlock w;
  if (!attn_block(p, BM, DVC, w)) return;
  const long long prefix = w.prefix, k_begin = w.k_begin, k_end = w.k_end;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int gr = lane >> 2, gc = lane & 3;  // fragment row group and column pair

  // The K/V tiles' gather into the ST stages.
  using Gather = TileGather<T, KT, ST, Tile::kThreads, QS, VS, KC, VC>;
  const Gather gather{p, w, kbuf, vbuf, ids};

  // The block's query rows: (node, head) pairs, zero rows past M; their copies go in the
  // first tile's group.
  for (int r = warp; r < BM; r += kWarps)
    copy_row_async(qs + r * QS, query_row<T>(p, w.b, w.g, w.row0 + r, w.group, w.m_rows),
                   static_cast<const T*>(p.q), p.dqk, D, lane, 32);
  gather.prologue();
  // This thread's two rows of each of the warp's m16 tiles and their tree nodes (for the
  // ancestor bits).
  const int* bits_of[MT][2];
  RowsOut out[MT];
#pragma unroll
  for (int i = 0; i < MT; ++i) out[i] = rows_out(p, w, warp * WM + i * 16 + gr, bits_of[i]);
  // ldmatrix row addresses: lane l serves row l % 8 of matrix l / 8.
  const int mi = lane >> 3, mr = lane & 7;
  // m16 tile i: 16 * i rows further.
  const T* qa = qs + (warp * WM + mr + (mi & 1) * 8) * QS + (mi >> 1) * 8;
  RowSoftmax sm[MT];
  float acc[MT][VT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int t = 0; t < VT; ++t) acc[i][t][0] = acc[i][t][1] = acc[i][t][2] = acc[i][t][3] = 0.0f;

  int st = 0;
  for (long long kt = k_begin; kt < k_end; kt += KT, st = st + 1 == ST ? 0 : st + 1) {
    gather.next(kt, st);
    const T* ks = kbuf + st * KT * QS;
    const T* vs = vbuf + st * KT * VS;

    // S = Q K^T for the warp's WM rows and the tile's KT keys: each K fragment serves the
    // warp's MT m16 tiles.
    float s[MT][NT][4];
    const T* kb = ks + (mr + (mi >> 1) * 8) * QS + (mi & 1) * 8;
    qk_tile<T, MT, NT, QS, D / 16>(s, qa, kb);
    uint32_t pa[MT][NT][2];  // P as bf16/fp16 pairs: [m16 tile][n][row half]
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      float tile_max[2];
      score_tile(p, s[i], kt, k_end, prefix, bits_of[i], gc, tile_max);
      sm[i].template update<T>(s[i], tile_max, acc[i], pa[i]);
    }
    // O += P V: keys are the k dimension, 16 per step; V fragments by transposing loads,
    // each serving the warp's MT m16 tiles.
    const T* vb = vs + (mr + (mi & 1) * 8) * VS + (mi >> 1) * 8;
#pragma unroll
    for (int kk = 0; kk < KT / 16; ++kk) {
#pragma unroll
      for (int t = 0; t < VT; t += 2) {
        uint32_t bf[4];  // columns t*8.. (keys 0-7, 8-15), then columns t*8+8..
        ldmatrix_x4_trans(bf, vb + kk * 16 * VS + t * 8);
#pragma unroll
        for (int i = 0; i < MT; ++i) {
          const uint32_t a[4] = {pa[i][2 * kk][0], pa[i][2 * kk][1], pa[i][2 * kk + 1][0],
                                 pa[i][2 * kk + 1][1]};
          Mma::mma(acc[i][t], a, bf);
          Mma::mma(acc[i][t + 1], a, bf + 2);
        }
      }
    }
  }
  cp_async_wait<0>();  // nothing in flight at exit (Q's copies, when the split had no tile)
#pragma unroll
  for (int i = 0; i < MT; ++i) {
    sm[i].finish();
    write_rows<T>(p, out[i], acc[i], sm[i], 0, gc);
  }
}

// Warps a block of the merge has: each merges 64 value columns of one query row.
constexpr int kMergeWarps = 4;

// A float2 of the workspace, loaded whatever is done with it: a plain load whose value is
// only used under a condition may be turned into a load under that condition, which would
// wait for what the condition waits for.
__device__ __forceinline__ float2 load_float2(const float* p) {
  float2 v;
  asm volatile("ld.global.cg.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "l"(p));
  return v;
}

// The splits' partial results merged by their log-sum-exp into out (and lse). Warp item
// blockIdx.x * kMergeWarps + warp takes 64 value columns (a pair per lane) of one row of M
// (blockIdx.y: b*Hkv+g), so that a long row still spreads over many warps. Lane s reads
// split s's (m, l), so the weights take one round trip; the lanes then sum their pairs over
// the splits, eight splits a batch. The status, the (m, l) pairs and the first batch's
// partials are loaded together, one round trip to memory, before anything waits on them.
// A split with m = -inf (no key) has weight 0.
template <typename T>
__device__ void attention_merge(const AttentionParams& p) {
  const int z = blockIdx.y, b = z / p.hkv, g = z % p.hkv;
  const int group = p.hq / p.hkv, m_rows = p.q_nodes * group, chunks = (p.dv + 63) / 64;
  const int item = blockIdx.x * kMergeWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = item / chunks, c = (item % chunks) * 64 + 2 * lane;
  if (row >= m_rows) return;
  const long long stride = static_cast<long long>(p.bs) * p.hkv * m_rows * (p.dv + 2);
  const float* part = p.part + (static_cast<long long>(z) * m_rows + row) * (p.dv + 2);
  wait_prior_grid();  // the attention's partials
  const int status = p.status[b];
  const float ms = lane < p.splits ? part[lane * stride + p.dv] : -INFINITY;
  const float ls = lane < p.splits ? part[lane * stride + p.dv + 1] : 0.0f;
  constexpr int kBatch = 8;
  // A batch of splits' pairs of this lane's columns (a split's rows lie in the workspace, so
  // any split below p.splits may be read; a weight-0 split's stale values are selected away).
  float2 x[kBatch];
  auto load_batch = [&](int s0) {
#pragma unroll
    for (int j = 0; j < kBatch; ++j)
      x[j] = c < p.dv && s0 + j < p.splits ? load_float2(part + (s0 + j) * stride + c)
                                           : make_float2(0.0f, 0.0f);
  };
  load_batch(0);
  if (status != kStatusOk) return;
  float m = ms;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  const float w = ms == -INFINITY ? 0.0f : exp2f(ms - m);
  float l = w * ls;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
  float2 v = make_float2(0.0f, 0.0f);
  for (int s0 = 0; s0 < p.splits; s0 += kBatch) {  // at most 32 splits: lanes s0 + j < 32
    if (s0 > 0) load_batch(s0);
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const float ws = __shfl_sync(0xffffffffu, w, s0 + j);  // 0 past the splits
      v.x = ws > 0.0f ? fmaf(ws, x[j].x, v.x) : v.x;
      v.y = ws > 0.0f ? fmaf(ws, x[j].y, v.y) : v.y;
    }
  }
  const int node = row / group, head = g * group + row % group;
  const long long qrow = static_cast<long long>(b) * p.q_nodes + node;
  if (c < p.dv) {  // a pair of columns (a partial row is dv + 2 floats: 8-byte aligned)
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    T* o = static_cast<T*>(p.out) + qrow * p.o_s0 + head * p.o_s1;
    o[c] = from_f32<T>(v.x * inv);
    o[c + 1] = from_f32<T>(v.y * inv);
  }
  if (p.lse != nullptr && lane == 0 && item % chunks == 0)
    p.lse[qrow * p.hq + head] = (m + log2f(l)) * 0.69314718055994531f;
}

}  // namespace ddtree
