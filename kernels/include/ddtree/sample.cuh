// SPEC stage 4's sampling: one draw from a row's filtered target distribution —
// temperature, then top-k, then top-p on the renormalised mass, then the Gumbel-max trick
// over the kept tokens. Top-k and top-p are cuts in SPEC's order: a coarse pass bins the
// tokens near the maximum by distance, and 8-bit radix passes over the order keys settle
// the crossing bin only; histograms count tokens (top-k) or fixed-point probability mass
// (top-p), and integer sums keep them deterministic. A sampled level reads its row once
// into shared memory (when the slice fits) and runs its passes from there.
#pragma once
#include "accept_row.cuh"
#include "params.h"

namespace ddtree {

// Far tokens, more than kNearNats below the row's maximum (after temperature), never win
// the Gumbel-max draw: a draw adds at most 16.7 to them and at least -2.9 to the maximum
// (see gumbel()). The sampling passes skip them after one compare, and top-p counts their
// mass as zero: each has under e^-27 of the maximum's (about 2 units of the 2^40 fixed
// point), all of them together under V * e^-27 of the total (3e-7 at V = 151936).
constexpr float kNearNats = 27.0f;
constexpr double kMassScale = 1099511627776.0;  // 2^40: fixed-point probability mass
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
  // exp(-nats) <= 1 times 2^40 is exact in float, so this is the double product's value
  // (no FP64: sm_120 runs it at 1/64 rate).
  __device__ __forceinline__ uint64_t mass(float x) const {
    return static_cast<uint64_t>(__expf(-nats(x)) * static_cast<float>(kMassScale));
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
// are constant for bf16 (16 significant bits) and fp16 (19), so those digits are skipped.
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

// The top-p cut's target: ceil(top_p x mass) in fixed-point mass, at least 1 (select_cut's,
// and the shortlist's test of one token against it).
__device__ __forceinline__ uint64_t top_p_target(float top_p, uint64_t mass) {
  const uint64_t target = static_cast<uint64_t>(ceil(static_cast<double>(top_p) * mass));
  return target == 0 ? 1 : target;
}

// Within bin c: 8-bit radix passes over the keys of the tokens of c that `within` keeps,
// to the key at which the running weight reaches `need`. Stops early when the crossing
// digit's tokens are all kept (one token, or a count that takes them all).
template <typename T>
__device__ Cut refine_cut(const Slice<T>& slice, Weight w, Cut within, int c, uint64_t need,
                          Cluster& cl) {
  AcceptScratch& s = cl.s;
  uint64_t prefix = 0, high = 0;  // the digits chosen so far, and their mask
  for (int shift = 48; shift >= 0; shift -= 8) {
    if (!digit_matters<T>(shift)) {
      // Every token's key holds the same bits here: 0 for a positive value, all ones for a
      // negative one (float_key inverts it), known from the sign digit decided first.
      const uint64_t fill = (prefix >> 55) & 1 ? 0 : 255;
      prefix |= fill << shift;
      high |= 255ull << shift;
      continue;
    }
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
    near = warp_sum(near);
    mass = warp_sum(mass);
    // Far tokens carry no mass; a count select (always over the whole row) counts them here.
    if (!w.mass && threadIdx.x == 0) s.total[255 - kFarBin] = s.total_cnt[255 - kFarBin] = V - near;
    if (w.mass) target = top_p_target(fraction, mass);
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

// Parameter i of a ParamSource (params.h), as a double (exact for every source value the
// conversions below keep: float, half, and ints up to 2^53; larger top_k is off anyway).
__device__ __forceinline__ double param_at(const ParamSource& f, int i) {
  if (f.ptr == nullptr) return f.scalar;
  const long long at = i * f.stride;
  switch (f.dtype) {
    case kParamF32: return static_cast<const float*>(f.ptr)[at];
    case kParamF64: return static_cast<const double*>(f.ptr)[at];
    case kParamF16: return __half2float(static_cast<const __half*>(f.ptr)[at]);
    case kParamBf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(f.ptr)[at]);
    case kParamI32: return static_cast<const int*>(f.ptr)[at];
    default: return static_cast<double>(static_cast<const long long*>(f.ptr)[at]);
  }
}

// top_k as the kernel stores it: truncated like a copy, clamped to int32 (NaN: off).
__device__ __forceinline__ int top_k_of(double k) {
  if (!(k == k)) return 0;
  return k >= 2147483647.0 ? 2147483647 : k <= -2147483648.0 ? -2147483647 - 1 : static_cast<int>(k);
}

// Writes a SamplingLoad (params.h): each request's parameters and/or a new seed.
__device__ __forceinline__ void load_sampling(const SamplingLoad& a) {
  for (int i = threadIdx.x; i < a.bs; i += blockDim.x) {
    a.to.temperature[i] = static_cast<float>(param_at(a.from[0], i));
    a.to.top_k[i] = top_k_of(param_at(a.from[1], i));
    a.to.top_p[i] = static_cast<float>(param_at(a.from[2], i));
  }
  if (a.reseed && threadIdx.x == 0) {
    a.to.rng[0] = a.seed;
    a.to.rng[1] = 0;
  }
}

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
__device__ __forceinline__ uint64_t draw_hash(uint64_t stream, int id) {
  return splitmix(stream ^ splitmix(static_cast<uint64_t>(id)));
}
__device__ __forceinline__ float gumbel_of(uint64_t h) {
  const float u = (static_cast<float>(h >> 41) + 0.5f) * (1.0f / 8388608.0f);
  return -logf(-logf(u));
}
__device__ __forceinline__ float gumbel(uint64_t stream, int id) { return gumbel_of(draw_hash(stream, id)); }

// The draw stream of a call (the generator's seed and offset, `rng`), then of one node of
// request b: every block that draws for (b, node) — the walk's cluster, or a
// vocabulary shard's block (accept_shard.cuh) — starts from the same counter.
__device__ __forceinline__ uint64_t call_stream(const long long* rng) {
  return splitmix(splitmix(rng[0]) ^ rng[1]);
}
__device__ __forceinline__ uint64_t node_stream(uint64_t call, int b, int node) {
  return splitmix(call ^ (static_cast<uint64_t>(b) << 32 | node));
}

// The smallest value that can still win a draw from a row (or a vocabulary shard) whose
// maximum is m: kContenderNats below it, or -inf (no pruning) where rounding could let a
// pruned token tie the winner: scores m / T that overflow or pass 2^20 in magnitude (an ulp
// of 1/8 or more). So pruning is exact wherever it applies, and pruning a shard against its
// own maximum draws what pruning the whole row does. Two roundings, written out: the walk
// and the shards must compute it bit for bit alike.
__device__ __forceinline__ float contender_from(float m, float temperature, float inv_temp) {
  if (!(fabsf(m * inv_temp) < 1048576.0f)) return -INFINITY;
  return __fsub_rn(m, __fmul_rn(kContenderNats, temperature));
}

// Token `id`'s Gumbel-max score x / T + G (one rounding: fused): the walk and the shards
// must compute it bit for bit alike, so both call this.
__device__ __forceinline__ float draw_score(float x, float inv_temp, uint64_t stream, int id) {
  return __fmaf_rn(x, inv_temp, gumbel(stream, id));
}

// One draw from the filtered target distribution of the row.
template <typename T>
__device__ int sample_row(Slice<T>& slice, float temperature, int top_k, float top_p, int V,
                          uint64_t stream, Cluster& cl) {
  const uint64_t best = row_argmax_key(slice, cl);  // also fills the slice cache
  slice.cached = slice.cache != nullptr;
  const float m = key_value(best);  // the largest value (float_key inverts non-NaN values)
  if (best == 0 || !(m > -INFINITY)) return argmax_token(best);  // nothing finite to draw from
  const Scale sc{m, 1.0f / temperature, m - kNearNats * temperature};
  Cut by_k = keep_all(), by_p = keep_all();
  if (top_k > 0 && top_k < V) by_k = select_cut(slice, Weight{sc, false}, keep_all(), top_k, 0.0f, V, cl);
  if (top_p < 1.0f) by_p = select_cut(slice, Weight{sc, true}, by_k, 1, top_p, V, cl);
  // Gumbel-max over the kept tokens: an exact draw from their renormalised softmax(x / T).
  float best_score = -INFINITY;
  int best_id = key_id(best);
  const float from = contender_from(m, temperature, sc.inv_temp);
  slice.for_each([&](int i, float x) {
    if (!(x >= from)) return;  // cannot win (and NaN)
    const int b = sc.bin(x);
    const uint64_t k = order_key(x, i);
    if (!by_k.keeps(b, k) || !by_p.keeps(b, k)) return;
    const float g = draw_score(x, sc.inv_temp, stream, i);
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

}  // namespace ddtree
