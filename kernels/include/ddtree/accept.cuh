// SPEC stage 4 — accept: walk the tree along the target's posterior tokens, one cluster of
// kAcceptCluster blocks per request. Each block owns a contiguous slice of every visited
// row (read in place: strided, bf16/fp16/fp32); the blocks combine their partial results
// through distributed shared memory. The walk is sequential (the next row depends on the
// posterior), so the time per level is one read of a 300 KB row at V = 151936: one block
// per request streamed it alone, eight blocks stream it as eighths.
//
// greedy = argmax (lowest id on ties, NaN as -inf); sampling = temperature, then top-k, then
// top-p on the renormalised mass, then one draw by the Gumbel-max trick over the kept
// tokens. Only visited nodes are computed.
//
// Every token has a unique 56-bit order key, (value key << 24 | ~id): a larger key comes
// first in SPEC's order (value descending, id ascending). Top-k and top-p are cuts in that
// order, found by 8-bit radix selects whose histograms count tokens (top-k) or fixed-point
// probability mass (top-p); integer sums keep them deterministic. A sampled level reads its
// row once into shared memory (when the slice fits) and runs its passes from there.
#pragma once
#include <cooperative_groups.h>

#include "common.cuh"

namespace ddtree {

namespace cg = cooperative_groups;

constexpr int kAcceptThreads = 256;
constexpr int kAcceptCluster = 8;        // blocks per request (the portable cluster size)
constexpr int kLinkCap = 1024;           // trees up to this Q keep their links in shared memory
constexpr int kSliceCacheCap = 76 * 1024;  // bytes of a row slice kept in shared memory
constexpr int kMinAcceptBlocks = 4;      // per SM: 64 requests' clusters resident at once
// Vector loads a thread issues before using them. sm_120's register allocation spills the
// sampling passes under 64 registers with any batch (ptxas -v), so it loads one at a time
// there; sm_90, where this is measured, keeps 4 in flight without spilling.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
constexpr int kAcceptLoadBatch = 1;
#else
constexpr int kAcceptLoadBatch = 4;
#endif
constexpr int kIdBits = 24;              // V <= 2^24
constexpr uint64_t kIdMask = (1ull << kIdBits) - 1;
constexpr double kMassScale = 1099511627776.0;  // 2^40: fixed-point probability mass

// Elements of a row each block owns: a multiple of 8 keeps every slice 16-byte aligned.
__host__ __device__ constexpr int accept_slice_len(int V) {
  return (V + kAcceptCluster * 8 - 1) / (kAcceptCluster * 8) * 8;
}

// This block's slice [lo, hi) of one target row. With a cache, the first pass over the
// slice stores its raw elements in shared memory and later passes read them from there.
template <typename T>
struct Slice {
  const T* row;
  long long stride;
  int lo, hi;
  T* cache;     // null: every pass reads global memory
  bool cached;  // the cache holds this row

  // Calls f(id, value) for this thread's share of the slice.
  template <typename F>
  __device__ __forceinline__ void for_each(F f) const {
    visit(
        [&](int first, const uint4& v) {
          const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
          for (int j = 0; j < 16 / static_cast<int>(sizeof(T)); ++j) f(first + j, to_f32(e[j]));
        },
        f);
  }

  // This thread's share of the slice: chunk(first id, 16 bytes) for each vector load when the
  // source is contiguous and aligned, elem(id, value) for the elements read one by one.
  template <typename FChunk, typename FElem>
  __device__ __forceinline__ void visit(FChunk chunk, FElem elem) const {
    constexpr int kVec = 16 / sizeof(T);
    const int n = hi - lo;
    const T* src = cached ? cache : row + lo * stride;
    const bool contiguous = cached || stride == 1;
    int done = 0;
    if (contiguous && reinterpret_cast<uintptr_t>(src) % 16 == 0) {
      const uint4* vec = reinterpret_cast<const uint4*>(src);
      uint4* store = cache != nullptr && !cached ? reinterpret_cast<uint4*>(cache) : nullptr;
      if (cached)
        visit_vec<false>(reinterpret_cast<const uint4*>(cache), nullptr, n / kVec, chunk);
      else if (store)
        visit_vec<true>(vec, store, n / kVec, chunk);
      else
        visit_vec<true>(vec, nullptr, n / kVec, chunk);
      done = n / kVec * kVec;
    }
    const long long step = contiguous ? 1 : stride;
    for (int i = done + threadIdx.x; i < n; i += blockDim.x) {
      const T v = src[i * step];
      if (cache != nullptr && !cached) cache[i] = v;
      elem(lo + i, to_f32(v));
    }
  }

  // The vector loop, in batches of kBatch loads issued before any is used: the walk is a
  // chain of row reads, so each read must keep many loads in flight (a store to the cache
  // between loads would otherwise order them, as the compiler cannot rule out aliasing).
  template <bool kGlobal, typename FChunk>
  __device__ __forceinline__ void visit_vec(const uint4* vec, uint4* store, int chunks,
                                            FChunk chunk) const {
    constexpr int kVec = 16 / sizeof(T), kBatch = kAcceptLoadBatch;
    for (int base = threadIdx.x; base < chunks; base += kBatch * blockDim.x) {
      uint4 v[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int c = base + u * blockDim.x;
        if (c < chunks) v[u] = kGlobal ? __ldg(vec + c) : vec[c];
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int c = base + u * blockDim.x;
        if (c >= chunks) break;
        if (store) store[c] = v[u];
        chunk(lo + c * kVec, v[u]);
      }
    }
  }
};

__device__ __forceinline__ uint64_t order_key(float x, int id) {
  if (isnan(x)) x = -INFINITY;
  return static_cast<uint64_t>(float_key(x)) << kIdBits | (kIdMask - static_cast<uint64_t>(id));
}

__device__ __forceinline__ int key_id(uint64_t key) { return static_cast<int>(kIdMask - (key & kIdMask)); }

__device__ __forceinline__ uint64_t warp_max_u64(uint64_t v) {
  for (int o = 16; o > 0; o >>= 1) {
    const uint64_t w = __shfl_xor_sync(0xffffffffu, v, o);
    v = w > v ? w : v;
  }
  return v;
}

__device__ __forceinline__ uint64_t warp_sum_u64(uint64_t v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Shared state of one block. `part`, `hist` and `cnt` are read by the other blocks of the
// cluster; they are double-buffered by pass parity, so one cluster barrier per pass
// suffices (a block rewrites a buffer two passes later, after every reader has passed the
// barrier in between).
struct AcceptScratch {
  uint64_t reduce[kWarp];  // block_reduce's per-warp slots
  uint64_t part[2];
  uint64_t hist[2][256];
  uint32_t cnt[2][256];
  uint64_t total[256];  // the cluster's combined histogram
  uint32_t total_cnt[256];
  uint64_t bcast;
  uint64_t need;  // a select's target, set from the first pass's total
  uint64_t pick_before;
  int pick_digit;
  int next;
};

// Cluster-wide reductions. Every block of a cluster runs the same sequence of them (all
// control flow depends only on combined values), counting passes in `phase`.
struct Cluster {
  AcceptScratch& s;
  int phase;

  template <typename WarpOp>
  __device__ uint64_t reduce(uint64_t v, WarpOp warp_op) {
    v = block_reduce(v, s.reduce, uint64_t{0}, warp_op);
    const int p = phase++ & 1;
    if (threadIdx.x == 0) s.part[p] = v;
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();
    if (threadIdx.x < kWarp) {
      uint64_t r = 0;
      if (threadIdx.x < kAcceptCluster) r = *cluster.map_shared_rank(&s.part[p], threadIdx.x);
      r = warp_op(r);
      if (threadIdx.x == 0) s.bcast = r;
    }
    __syncthreads();
    return s.bcast;
  }
  __device__ uint64_t max(uint64_t v) { return reduce(v, warp_max_u64); }

  // The local histogram buffer of the next pass, zeroed.
  __device__ int begin_histogram() {
    const int p = phase & 1;
    for (int i = threadIdx.x; i < 256; i += blockDim.x) {
      s.hist[p][i] = 0;
      s.cnt[p][i] = 0;
    }
    __syncthreads();
    return p;
  }

  // Sums the cluster's histograms of this pass into s.total / s.total_cnt.
  __device__ void combine_histogram() {
    const int p = phase++ & 1;
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();
    for (int i = threadIdx.x; i < 256; i += blockDim.x) {
      uint64_t h = 0;
      uint32_t c = 0;
      for (int r = 0; r < kAcceptCluster; ++r) {
        h += *cluster.map_shared_rank(&s.hist[p][i], r);
        c += *cluster.map_shared_rank(&s.cnt[p][i], r);
      }
      s.total[i] = h;
      s.total_cnt[i] = c;
    }
    __syncthreads();
  }
};

// Adds weight w to bin `digit`. The histograms only see tokens near the row's maximum
// (spread over many bins) or within one bin of those, so plain shared atomics suffice.
__device__ __forceinline__ void hist_add(uint64_t* hist, uint32_t* cnt, int digit, uint64_t w) {
  atomicAdd(reinterpret_cast<unsigned long long*>(&hist[digit]), w);
  atomicAdd(&cnt[digit], 1u);
}

// The greedy posterior: the largest order key of the row, or 0 when no value exceeds -inf
// (then every token ties at -inf, NaN counting as -inf, and the answer is id 0). Each thread
// keeps its first largest value (it visits ids in increasing order); a vector chunk costs
// one max per element, and is searched for its first maximum only when it beats the best.
template <typename T>
__device__ uint64_t row_argmax_key(const Slice<T>& slice, Cluster& cl) {
  constexpr int kVec = 16 / sizeof(T);
  float best = -INFINITY;
  int at = -1;
  slice.visit(
      [&](int first, const uint4& v) {
        const T* e = reinterpret_cast<const T*>(&v);
        float top = to_f32(e[0]);
#pragma unroll
        for (int j = 1; j < kVec; ++j) top = fmaxf(top, to_f32(e[j]));  // NaN ignored
        if (!(top > best)) return;
        best = top;
#pragma unroll
        for (int j = kVec - 1; j >= 0; --j)
          if (to_f32(e[j]) == top) at = first + j;
      },
      [&](int i, float x) {
        if (x > best) {
          best = x;
          at = i;
        }
      });
  return cl.max(at < 0 ? 0 : order_key(best, at));
}

// The token of a greedy posterior key.
__device__ __forceinline__ int argmax_token(uint64_t key) { return key == 0 ? 0 : key_id(key); }

// Far tokens, more than kNearNats below the row's maximum (after temperature), never win
// the Gumbel-max draw: a draw adds at most 16.7 to them and at least -2.9 to the maximum
// (see gumbel()). The sampling passes skip them after one compare, and top-p counts their
// mass as zero: each has under e^-27 of the maximum's, 2^-38.9 in the 2^-40 fixed point.
constexpr float kNearNats = 27.0f;
// The draw itself skips more: a token wins only if x/T + g >= m/T + g_min, so only tokens
// within g_max - g_min = 16.64 + 2.81 = 19.45 nats of the maximum (19.6: room for rounding)
// ever need their Gumbel number, the costly part of a pass.
constexpr float kContenderNats = 19.6f;
constexpr float kBinsPerNat = 9.0f;
constexpr int kFarBin = 243;  // 27 * 9: the bin of every far token

// Distances from the row's maximum m, in nats after temperature: the coarse bins of a
// select (bin 0 holds the maximum) and each token's fixed-point mass.
struct Scale {
  float m;
  float inv_temp;
  float near_from;  // m - kNearNats * temperature: smaller values (and NaN) are far
  __device__ __forceinline__ float nats(float x) const { return x == m ? 0.0f : (m - x) * inv_temp; }
  // One compare: the test every pass makes first, for every token.
  __device__ __forceinline__ bool far(float x) const { return !(x >= near_from); }
  // Monotone in x (larger x, smaller bin).
  __device__ __forceinline__ int bin(float x) const {
    if (far(x)) return kFarBin;
    return min(kFarBin - 1, static_cast<int>(nats(x) * kBinsPerNat));
  }
  __device__ __forceinline__ uint64_t mass(float x) const {
    return static_cast<uint64_t>(static_cast<double>(__expf(-nats(x))) * kMassScale);
  }
};

// A cut in SPEC's order: the kept tokens are those in a lower bin, and those of `bin` whose
// key is >= `key`. Cut{kFarBin + 1, 0} keeps everything.
struct Cut {
  int bin;
  uint64_t key;
  __device__ __forceinline__ bool keeps(int b, uint64_t k) const {
    return b < bin || (b == bin && k >= key);
  }
};

__device__ __forceinline__ Cut keep_all() { return Cut{kFarBin + 1, 0}; }

// Digit shifts of the 56-bit key that can differ between tokens: the value key's low bits
// are zero for bf16 (16 significant bits) and fp16 (19), so those digits are skipped.
template <typename T>
__device__ __forceinline__ bool digit_matters(int shift) {
  return shift < kIdBits || shift > 48 - KeyBits<T>::value;
}

// Weight of a token in a select: its count (top-k) or its fixed-point mass (top-p).
struct Weight {
  Scale sc;
  bool mass;
  __device__ __forceinline__ uint64_t of(float x) const { return mass ? sc.mass(x) : 1; }
};

// Within bin c: 8-bit radix passes over the keys of the tokens of c that `within` keeps,
// to the key at which the running weight reaches `need`. Stops early when the crossing
// digit's tokens are all kept (one token, or a count that takes them all).
template <typename T>
__device__ Cut refine_cut(const Slice<T>& slice, Weight w, Cut within, int c, uint64_t need,
                          Cluster& cl) {
  AcceptScratch& s = cl.s;
  uint64_t prefix = 0, high = 0;  // the digits chosen so far, and their mask
  for (int shift = 48; shift >= 0; shift -= 8) {
    if (!digit_matters<T>(shift)) continue;
    const int p = cl.begin_histogram();
    slice.for_each([&](int i, float x) {
      if (w.sc.far(x)) return;
      const int b = w.sc.bin(x);
      const uint64_t k = order_key(x, i);
      if (b != c || !within.keeps(b, k) || (k & high) != prefix) return;
      hist_add(s.hist[p], s.cnt[p], static_cast<int>(k >> shift) & 255, w.of(x));
    });
    cl.combine_histogram();
    if (threadIdx.x < kWarp) warp_crossing_digit(s.total, need, &s.pick_digit, &s.pick_before);
    __syncthreads();
    const int d = s.pick_digit;
    need -= s.pick_before;
    prefix |= static_cast<uint64_t>(d) << shift;
    high |= 255ull << shift;
    if (s.total_cnt[d] <= 1 || (!w.mass && need >= s.total[d])) break;
  }
  return Cut{c, prefix};
}

// The cut where the running weight of the tokens `within` keeps, in SPEC's order, first
// reaches `target` (top-k: a count; top-p: `fraction` of their total mass). One pass bins the
// near tokens by distance from the maximum; refine_cut settles the crossing bin.
template <typename T>
__device__ Cut select_cut(const Slice<T>& slice, Weight w, Cut within, uint64_t target,
                          float fraction, int V, Cluster& cl) {
  AcceptScratch& s = cl.s;
  const int p = cl.begin_histogram();
  slice.for_each([&](int i, float x) {
    if (w.sc.far(x)) return;
    const int b = w.sc.bin(x);
    if (!within.keeps(b, order_key(x, i))) return;
    hist_add(s.hist[p], s.cnt[p], 255 - b, w.of(x));
  });
  cl.combine_histogram();
  if (threadIdx.x < kWarp) {
    uint64_t near = 0, mass = 0;
    for (int i = threadIdx.x; i < 256; i += kWarp) {
      near += s.total_cnt[i];
      mass += s.total[i];
    }
    near = warp_sum_u64(near);
    mass = warp_sum_u64(mass);
    // Far tokens carry no mass; a count select (always over the whole row) counts them here.
    if (!w.mass && threadIdx.x == 0) s.total[255 - kFarBin] = s.total_cnt[255 - kFarBin] = V - near;
    if (w.mass) target = static_cast<uint64_t>(ceil(static_cast<double>(fraction) * mass));
    if (target == 0) target = 1;
    __syncwarp();
    warp_crossing_digit(s.total, target, &s.pick_digit, &s.pick_before);
    __syncwarp();
    if (threadIdx.x == 0) s.need = w.mass && target > mass ? 0 : target - s.pick_before;
  }
  __syncthreads();
  const int c = 255 - s.pick_digit;
  const uint64_t need = s.need;
  if (need == 0) return keep_all();  // rounding left top_p's target above the total
  // A top-k cut among far tokens keeps every near token; the far ones it also keeps carry
  // no mass and never win the draw, so keeping them all changes nothing.
  if (c == kFarBin) return keep_all();
  if (s.total_cnt[255 - c] <= 1 || (!w.mass && need >= s.total[255 - c])) return Cut{c, 0};
  return refine_cut(slice, w, within, c, need, cl);
}

// Per-request sampling parameters (device arrays [bs]) and the generator state.
struct SampleArgs {
  const float* temperature;  // <= 0: greedy
  const int* top_k;          // <= 0 or >= V: off
  const float* top_p;        // >= 1: off
  const long long* rng;      // [2]: seed, offset (advanced after every accept)
};

__device__ __forceinline__ uint64_t splitmix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// A Gumbel(0, 1) draw from the counter (seed, offset, request, node, token). u takes 23
// bits so that it is exactly representable in (0, 1) (24 bits would round the top value to
// 1.0 and give +inf); full-precision logs keep -log(u) accurate near u = 1. So a draw lies
// in [-2.9, 16.7].
__device__ __forceinline__ float gumbel(uint64_t stream, int id) {
  const uint64_t h = splitmix(stream ^ splitmix(static_cast<uint64_t>(id)));
  const float u = (static_cast<float>(h >> 41) + 0.5f) * (1.0f / 8388608.0f);
  return -logf(-logf(u));
}

// One draw from the filtered target distribution of the row.
template <typename T>
__device__ int sample_row(Slice<T>& slice, float temperature, int top_k, float top_p, int V,
                          uint64_t stream, Cluster& cl) {
  const uint64_t best = row_argmax_key(slice, cl);  // also fills the slice cache
  slice.cached = slice.cache != nullptr;
  // The largest value back from its key (float_key is invertible for non-NaN values).
  const uint32_t vk = static_cast<uint32_t>(best >> kIdBits);
  const uint32_t bits = (vk & 0x80000000u) ? (vk & 0x7fffffffu) : ~vk;
  const float m = __uint_as_float(bits);
  if (best == 0 || !(m > -INFINITY)) return argmax_token(best);  // nothing finite to draw from
  const Scale sc{m, 1.0f / temperature, m - kNearNats * temperature};
  Cut by_k = keep_all(), by_p = keep_all();
  if (top_k > 0 && top_k < V) by_k = select_cut(slice, Weight{sc, false}, keep_all(), top_k, 0.0f, V, cl);
  if (top_p < 1.0f) by_p = select_cut(slice, Weight{sc, true}, by_k, 1, top_p, V, cl);
  // Gumbel-max over the kept tokens: an exact draw from their renormalised softmax(x / T).
  float best_score = -INFINITY;
  int best_id = key_id(best);
  const float contender_from = m - kContenderNats * temperature;
  slice.for_each([&](int i, float x) {
    if (!(x >= contender_from)) return;  // cannot win (and NaN)
    const int b = sc.bin(x);
    const uint64_t k = order_key(x, i);
    if (!by_k.keeps(b, k) || !by_p.keeps(b, k)) return;
    const float g = x * sc.inv_temp + gumbel(stream, i);
    if (g > best_score || (g == best_score && i < best_id)) {
      best_score = g;
      best_id = i;
    }
  });
  // Largest score, lowest id: pack (score key, ~id) and take the cluster maximum.
  const uint64_t packed = best_score > -INFINITY ? order_key(best_score, best_id) : 0;
  const uint64_t win = cl.max(packed);
  return win != 0 ? key_id(win) : key_id(best);
}

struct AcceptTree {
  const long long* verify_ids;    // [Q]
  const long long* first_child;   // [Q]
  const long long* next_sibling;  // [Q]
};

struct AcceptOut {
  long long* accepted_nodes;   // [L+1]
  long long* accepted_tokens;  // [L+1]
  long long* accept_index;     // [L+1]
  long long* accept_len;       // [1]
  long long* bonus;            // [1]
};

// The tree's links, from shared memory when the tree fits (the walk chases them one by one):
// `local` holds Q verify ids, then Q first children, then Q next siblings.
struct Links {
  const int* local;  // null: read the int64 arrays in global memory
  AcceptTree g;
  int q;
  __device__ long long token(int i) const { return local ? local[i] : g.verify_ids[i]; }
  __device__ int first_child(int i) const {
    return local ? local[q + i] : static_cast<int>(g.first_child[i]);
  }
  __device__ int next_sibling(int i) const {
    return local ? local[2 * q + i] : static_cast<int>(g.next_sibling[i]);
  }
  // The child of `node` that carries `token`, or -1.
  __device__ int child_with(int node, int token) const {
    for (int c = first_child(node); c >= 0; c = next_sibling(c))
      if (this->token(c) == token) return c;
    return -1;
  }
};

// Copies the links into `local` (3 * Q ints of shared memory) when Q <= kLinkCap.
__device__ Links load_links(int* local, AcceptTree tree, int q) {
  if (q > kLinkCap) return Links{nullptr, tree, q};
  for (int i = threadIdx.x; i < q; i += blockDim.x) {
    local[i] = static_cast<int>(tree.verify_ids[i]);
    local[q + i] = static_cast<int>(tree.first_child[i]);
    local[2 * q + i] = static_cast<int>(tree.next_sibling[i]);
  }
  __syncthreads();
  return Links{local, tree, q};
}

// The walk (SPEC stage 4) for request b, run by each block of its cluster; `rank` 0 writes
// the outputs. `cache` (dynamic shared memory, or null) holds this block's row slice;
// `local_links` has room for 3 * Q ints when Q <= kLinkCap.
template <typename T>
__device__ void accept_request(const T* logits, long long s1, long long s2, int V, int q,
                               int path_len, int b, int rank, AcceptTree tree, AcceptOut out,
                               const SampleArgs* sampling, T* cache, int* local_links,
                               AcceptScratch& s) {
  const float temperature = sampling ? sampling->temperature[b] : 0.0f;
  const int top_k = sampling ? sampling->top_k[b] : 0;
  const float top_p = sampling ? sampling->top_p[b] : 1.0f;
  uint64_t stream = 0;
  if (sampling) stream = splitmix(splitmix(sampling->rng[0]) ^ sampling->rng[1]);
  const Links links = load_links(local_links, tree, q);
  Cluster cl{s, 0};
  const int lo = min(V, rank * accept_slice_len(V)), hi = min(V, lo + accept_slice_len(V));
  int node = 0, len = 0;
  while (true) {
    Slice<T> slice{logits + node * s1, s2, lo, hi, cache, false};
    int token;
    if (temperature > 0.0f) {
      const uint64_t at = splitmix(stream ^ (static_cast<uint64_t>(b) << 32 | node));
      token = sample_row(slice, temperature, top_k, top_p, V, at, cl);
    } else {
      token = argmax_token(row_argmax_key(Slice<T>{slice.row, s2, lo, hi, nullptr, false}, cl));
    }
    if (threadIdx.x == 0) {
      const int next = len + 1 < path_len ? links.child_with(node, token) : -1;
      s.next = next;
      if (rank == 0) {
        out.accepted_nodes[len] = node;
        out.accepted_tokens[len] = links.token(node);
        out.accept_index[len] = static_cast<long long>(b) * q + node;
        if (next < 0) {
          *out.accept_len = len + 1;
          *out.bonus = token;
        }
      }
    }
    __syncthreads();
    const int next = s.next;
    ++len;
    __syncthreads();
    if (next < 0) break;
    node = next;
  }
  if (rank == 0)
    for (int i = len + threadIdx.x; i < path_len; i += blockDim.x) {
      out.accepted_nodes[i] = -1;
      out.accepted_tokens[i] = -1;
      out.accept_index[i] = -1;
    }
  cg::this_cluster().sync();  // no block leaves while another may read its shared memory
}

}  // namespace ddtree
