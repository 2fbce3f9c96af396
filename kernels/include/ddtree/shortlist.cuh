// SPEC stage 4's draw by shortlist: sample_row's token with fewer passes over the row
// (sample_row's top-p cut alone is a binned pass and up to five radix passes, each ending
// at a cluster barrier, with shared atomics for every token near the maximum).
//
// The draw is the Gumbel-max winner over the kept tokens: the kept token with the largest
// draw key (score x / T + G, then the lower id). So it is the first kept token among the
// kShortlist largest draw keys of all contenders, whenever one of them is kept:
// * the greedy pass (row_argmax_key) finds the row's maximum and caches the row;
// * `shortlist_draws` lists the contenders' kShortlist largest draw keys;
// * `rank_listed` counts, for one listed token, the tokens ahead of it in SPEC's order and
//   their fixed-point mass, with the row's total mass: top-k keeps a token with fewer than
//   top_k ahead, top-p one with less than its target mass ahead (select_cut's cuts, tested
//   token by token). The first listed token is ranked, the next only when it is not kept.
// When no listed token is kept (a top-p of 0.9 leaves all four outside the nucleus about
// once in 10^4 rows; a top-k often, when the row is flat), or pruning is off for the row,
// sample_row draws instead: the same token either way. A top-k with a top-p finds its top-k
// cut with select_cut, as the top-p target is a share of the top-k tokens' mass.
#pragma once
#include "sample.cuh"

namespace ddtree {

constexpr float kGumbelMax = 16.7f;  // gumbel() never exceeds it (see gumbel())
// Loads in flight a thread in the shortlist's passes: they read the cached row (shared
// memory, short latency), and more would spill on sm_90 (ptxas -v).
constexpr int kShortlistLoadBatch = 1;

// A bound on gumbel_of(h) from h's uniform u without its two logs: -ln(-ln u) <= -ln(1 - u)
// as -ln u >= 1 - u; 1 - u = (2^23 - j - 0.5) / 2^23 is exact in float. The margin covers
// both sides' rounding (under 1e-5 here).
__device__ __forceinline__ float gumbel_bound(uint64_t h) {
  const float rest = 8388607.5f - static_cast<float>(h >> 41);
  return 15.942385f - __logf(rest) + 1e-3f;  // 23 ln 2 - ln(rest) + margin
}

// The kShortlist largest keys offered, descending (0: empty).
struct Shortlist {
  uint64_t key[kShortlist];

  __device__ __forceinline__ void clear() {
#pragma unroll
    for (int i = 0; i < kShortlist; ++i) key[i] = 0;
  }
  __device__ __forceinline__ uint64_t last() const { return key[kShortlist - 1]; }
  __device__ __forceinline__ void offer(uint64_t k) {
#pragma unroll
    for (int i = 0; i < kShortlist; ++i) {
      const uint64_t a = key[i];
      key[i] = a > k ? a : k;
      k = a > k ? k : a;
    }
  }
  // The warp's largest head, removed from the lane that holds it (keys are unique: a key
  // holds its token id).
  __device__ __forceinline__ uint64_t take_warp_max() {
    const uint64_t w = warp_max_u64(key[0]);
    if (w != 0 && key[0] == w) {
#pragma unroll
      for (int i = 0; i + 1 < kShortlist; ++i) key[i] = key[i + 1];
      key[kShortlist - 1] = 0;
    }
    return w;
  }
};

// Element j of a 16-byte chunk of T, for a j known only at run time.
template <typename T>
__device__ __forceinline__ float chunk_element(const uint4& v, int j) {
  constexpr int kPerWord = 4 / sizeof(T);
  const int w = j / kPerWord;
  const uint32_t word = w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w;
  if (kPerWord == 1) return __uint_as_float(word);
  const unsigned short bits = static_cast<unsigned short>(word >> (16 * (j % kPerWord)));
  T e;
  memcpy(&e, &bits, sizeof(bits));
  return to_f32(e);
}

// The warp's largest key of one per lane, cleared in its lane.
__device__ __forceinline__ uint64_t take_lane_max(uint64_t& v) {
  const uint64_t w = warp_max_u64(v);
  if (v == w) v = 0;
  return w;
}

// The shortlist pass's combine, one cluster barrier: the cluster's shortlist (into
// s.shortlist) from each thread's.
__device__ void combine_shortlists(Cluster& cl, Shortlist& t) {
  AcceptScratch& s = cl.s;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  constexpr int kWarps = kAcceptThreads / kWarp;
  uint64_t w[kShortlist];
#pragma unroll
  for (int r = 0; r < kShortlist; ++r) w[r] = t.take_warp_max();
  if (lane == 0)
#pragma unroll
    for (int r = 0; r < kShortlist; ++r) s.warp_draws[warp * kShortlist + r] = w[r];
  __syncthreads();
  const int p = cl.phase++ & 1;
  cg::cluster_group cluster = cg::this_cluster();
  if (warp == 0) {
    uint64_t v = lane < kWarps * kShortlist ? s.warp_draws[lane] : 0;
#pragma unroll
    for (int r = 0; r < kShortlist; ++r) {
      const uint64_t top = take_lane_max(v);
      if (lane == 0) s.draw_part[p][r] = top;
    }
  }
  cluster.sync();
  if (warp == 0) {
    uint64_t v = 0;
    if (lane < kAcceptCluster * kShortlist)
      v = *cluster.map_shared_rank(&s.draw_part[p][lane % kShortlist], lane / kShortlist);
#pragma unroll
    for (int r = 0; r < kShortlist; ++r) {
      const uint64_t top = take_lane_max(v);
      if (lane == 0) s.shortlist[r] = top;
    }
  }
  __syncthreads();
}

// The rank pass's combine, one cluster barrier: the cluster's sums of v into s.sums.
__device__ void combine_sums(Cluster& cl, uint64_t (&v)[kShortlistSums]) {
  AcceptScratch& s = cl.s;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
#pragma unroll
  for (int i = 0; i < kShortlistSums; ++i) v[i] = warp_sum(v[i]);
  if (lane == 0)
#pragma unroll
    for (int i = 0; i < kShortlistSums; ++i) s.warp_sums[warp][i] = v[i];
  __syncthreads();
  const int p = cl.phase++ & 1;
  if (threadIdx.x < kShortlistSums) {
    uint64_t t = 0;
    for (int w = 0; w < kAcceptThreads / kWarp; ++w) t += s.warp_sums[w][threadIdx.x];
    s.sum_part[p][threadIdx.x] = t;
  }
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  if (threadIdx.x < kShortlistSums) {
    uint64_t t = 0;
    for (int r = 0; r < kAcceptCluster; ++r) t += *cluster.map_shared_rank(&s.sum_part[p][threadIdx.x], r);
    s.sums[threadIdx.x] = t;
  }
  __syncthreads();
}

// Pass 2 (the row cached, its maximum known): the shortlist of the contenders' draw keys
// into s.shortlist. A token is hashed only where its largest possible score reaches the
// block's floor (the largest kShortlist-th key of any thread's list: a token below it is in
// no list's top), and its two logs computed only where the hash's bound does.
template <typename T>
__device__ void shortlist_draws(const Slice<T>& slice, float from, float inv_temp,
                                uint64_t stream, Cluster& cl) {
  constexpr int kVec = 16 / sizeof(T);
  AcceptScratch& s = cl.s;
  if (threadIdx.x == 0) s.floor = 0;
  __syncthreads();
  volatile uint64_t* floor = &s.floor;
  float floor_score = -INFINITY;
  uint64_t published = 0;
  Shortlist list;
  list.clear();
  auto may_list = [&](float x) {  // a contender that could reach the floor
    return x >= from && !(__fmaf_rn(x, inv_temp, kGumbelMax) < floor_score);
  };
  auto draw = [&](int i, float x) {
    const uint64_t h = draw_hash(stream, i);
    if (__fmaf_rn(x, inv_temp, gumbel_bound(h)) < floor_score) return;
    list.offer(order_key(__fmaf_rn(x, inv_temp, gumbel_of(h)), i));  // draw_score's value
  };
  auto refresh = [&]() {  // publish this thread's floor, read the block's
    const uint64_t last = list.last();
    if (last > published) {
      atomicMax(reinterpret_cast<unsigned long long*>(&s.floor), last);
      published = last;
    }
    const uint64_t f = *floor > last ? *floor : last;
    floor_score = f == 0 ? -INFINITY : key_value(f);
  };
  slice.template visit<kShortlistLoadBatch>(
      [&](int first, const uint4& v) {
        const T* e = reinterpret_cast<const T*>(&v);
        // The tokens that may make the list, then one call site for the hash and the logs
        // (unrolled per element, they would not fit the registers).
        unsigned may = 0;
#pragma unroll
        for (int j = 0; j < kVec; ++j) may |= may_list(to_f32(e[j])) ? 1u << j : 0u;
        if (may == 0) return;
        for (; may != 0; may &= may - 1) {
          const int j = __ffs(may) - 1;
          draw(first + j, chunk_element<T>(v, j));
        }
        refresh();
      },
      [&](int i, float x) {
        if (!may_list(x)) return;
        draw(i, x);
        refresh();
      });
  combine_shortlists(cl, list);
}

// Listed token c's value (read back: a key holds the score) and order key; false for an
// empty slot.
template <typename T>
__device__ __forceinline__ bool listed(const Slice<T>& slice, const AcceptScratch& s, int c,
                                       float* x, uint64_t* order) {
  const uint64_t key = s.shortlist[c];
  if (key == 0) return false;
  *x = to_f32(slice.row[key_id(key) * slice.stride]);
  *order = order_key(*x, key_id(key));
  return true;
}

// The rank pass, for listed token c (value x_c, order key order_c): s.sums = {the fixed-point mass
// of the near tokens `within` keeps (when `by_mass`), the tokens ahead of c in SPEC's order,
// their mass as counted in the first}. Only tokens at or above x_c can be ahead of it.
template <typename T>
__device__ void rank_listed(const Slice<T>& slice, const Scale& sc, Cut within, bool by_mass,
                            float x_c, uint64_t order_c, Cluster& cl) {
  const bool all = within.bin > kFarBin;
  uint64_t total = 0, mass_ahead = 0;
  uint32_t ahead = 0;  // V < 2^24
  slice.for_each([&](int i, float x) {
    uint64_t mass = 0;
    if (by_mass && !sc.far(x) && (all || within.keeps(sc.bin(x), order_key(x, i)))) mass = sc.mass(x);
    total += mass;
    if (x >= x_c && order_key(x, i) > order_c) {
      ahead += 1;
      mass_ahead += mass;
    }
  });
  uint64_t v[kShortlistSums] = {total, ahead, mass_ahead};
  combine_sums(cl, v);
}

constexpr int kDrawBySampleRow = -1;

// One draw from the filtered target distribution of the row: sample_row's token, by
// shortlist where it can (see the top of this file), else kDrawBySampleRow: the caller then
// calls sample_row (from one call site: inlined twice, it would not fit the registers).
template <typename T>
__device__ int draw_row(Slice<T>& slice, float temperature, int top_k, float top_p, int V,
                        uint64_t stream, Cluster& cl) {
  const uint64_t best = row_argmax_key(slice, cl);  // also fills the slice cache
  slice.cached = slice.cache != nullptr;
  const float m = key_value(best);
  if (best == 0 || !(m > -INFINITY)) return argmax_token(best);  // as sample_row
  const float inv_temp = 1.0f / temperature;
  const float from = contender_from(m, temperature, inv_temp);
  if (from == -INFINITY) return kDrawBySampleRow;  // no pruning: sample_row's rounding cases
  shortlist_draws(slice, from, inv_temp, stream, cl);
  const Scale sc{m, inv_temp, m - kNearNats * temperature};
  const bool by_k = top_k > 0 && top_k < V, by_p = top_p < 1.0f;
  Cut cut_k = keep_all();
  if (by_k && by_p) cut_k = select_cut(slice, Weight{sc, false}, keep_all(), top_k, 0.0f, V, cl);
  // The listed contenders in draw order, each ranked by a pass until one is kept: the first
  // is but for about 1 - top_p of the rows. One outside the top-k says the draws fall
  // outside it: sample_row draws from the top-k alone.
  for (int c = 0; c < kShortlist; ++c) {
    float x;
    uint64_t order;
    if (!listed(slice, cl.s, c, &x, &order)) break;  // the list's end
    const int id = key_id(cl.s.shortlist[c]);
    if (!by_k && !by_p) return id;
    if (by_k && by_p && !cut_k.keeps(sc.bin(x), order)) continue;
    rank_listed(slice, sc, cut_k, by_p, x, order, cl);
    const uint64_t* sums = cl.s.sums;
    if (by_k && !by_p && sums[1] >= static_cast<uint64_t>(top_k)) break;
    if (!by_p) return id;
    const uint64_t target = top_p_target(top_p, sums[0]);
    if (sums[2] < target) return id;
  }
  return kDrawBySampleRow;
}

}  // namespace ddtree
