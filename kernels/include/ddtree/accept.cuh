// SPEC stage 4 — accept: walk the tree along the target's posterior tokens, one block per
// request. The posterior of a visited node is computed by the whole block from its target
// row, read in place (strided, bf16/fp16/fp32): greedy = argmax (lowest id on ties, NaN as
// -inf); sampling = temperature, then top-k, then top-p on the renormalised mass, then one
// draw by the Gumbel-max trick over the kept tokens. Only visited nodes are computed: a row
// is 300 KB at V = 151936, and a walk visits accept_len of the Q rows.
//
// Every token has a unique 56-bit order key, (value key << 24 | ~id): a larger key comes
// first in SPEC's order (value descending, id ascending). Top-k and top-p are cuts in that
// order, found by 8-bit radix selects whose histograms count tokens (top-k) or fixed-point
// probability mass (top-p); integer atomics keep them deterministic.
#pragma once
#include "common.cuh"

namespace ddtree {

constexpr int kAcceptThreads = 1024;
constexpr int kIdBits = 24;  // V <= 2^24
constexpr uint64_t kIdMask = (1ull << kIdBits) - 1;
constexpr double kMassScale = 1099511627776.0;  // 2^40: fixed-point probability mass

template <typename T>
struct TargetRow {
  const T* p;
  long long stride;
  int V;
  __device__ __forceinline__ float at(int i) const { return to_f32(p[i * stride]); }
};

// Calls f(id, value) for this thread's share of the row: 16-byte vector loads when the row
// is contiguous and aligned (a row is hundreds of KB, read by one block: scalar 2-byte
// loads leave it latency-bound), element loads otherwise.
template <typename T, typename F>
__device__ __forceinline__ void for_each_in_row(const TargetRow<T>& row, F f) {
  int done = 0;
  if (row.stride == 1 && reinterpret_cast<uintptr_t>(row.p) % 16 == 0) {
    constexpr int kVec = 16 / sizeof(T);
    const int chunks = row.V / kVec;
    const uint4* vec = reinterpret_cast<const uint4*>(row.p);
#pragma unroll 4
    for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
      const uint4 v = __ldg(vec + c);
      const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
      for (int j = 0; j < kVec; ++j) f(c * kVec + j, to_f32(e[j]));
    }
    done = chunks * kVec;
  }
  for (int i = done + threadIdx.x; i < row.V; i += blockDim.x) f(i, row.at(i));
}

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

struct AcceptScratch {
  uint64_t reduce[kWarp];  // block_reduce's per-warp slots
  uint64_t hist[256];
  int pick_digit;
  uint64_t pick_before;
  int next;
};

__device__ __forceinline__ uint64_t block_max_u64(uint64_t v, AcceptScratch& s) {
  return block_reduce(v, s.reduce, uint64_t{0}, warp_max_u64);
}

__device__ __forceinline__ uint64_t block_sum_u64(uint64_t v, AcceptScratch& s) {
  return block_reduce(v, s.reduce, uint64_t{0}, warp_sum_u64);
}

// The greedy posterior: the largest order key of the row.
template <typename T>
__device__ uint64_t row_argmax_key(const TargetRow<T>& row, AcceptScratch& s) {
  uint64_t best = 0;
  for_each_in_row(row, [&](int i, float x) {
    const uint64_t k = order_key(x, i);
    best = k > best ? k : best;
  });
  return block_max_u64(best, s);
}

// Weight of a token in a radix select: 1 (count) or its fixed-point probability mass.
struct Weight {
  bool mass;
  float top;      // the row's largest value
  float inv_temp;
  __device__ __forceinline__ uint64_t of(float x) const {
    if (!mass) return 1;
    const float e = __expf((x - top) * inv_temp);  // in [0, 1]; -inf and NaN give 0
    return isnan(e) ? 0 : static_cast<uint64_t>(static_cast<double>(e) * kMassScale);
  }
};

// The key of the token at which the running weight, in SPEC's order over the tokens with key
// >= floor, first reaches `target` (>= 1). 8-bit radix passes over the 56-bit keys.
template <typename T>
__device__ uint64_t select_by_weight(const TargetRow<T>& row, uint64_t floor, uint64_t target,
                                     Weight w, AcceptScratch& s) {
  uint64_t prefix = 0;
  for (int shift = 48; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) s.hist[i] = 0;
    __syncthreads();
    const uint64_t high = shift == 48 ? 0 : ~0ull << (shift + 8);
    for_each_in_row(row, [&](int i, float x) {
      const uint64_t k = order_key(x, i);
      if (k >= floor && (k & high) == prefix) {
        const uint64_t wt = w.of(x);
        if (wt) atomicAdd(reinterpret_cast<unsigned long long*>(&s.hist[(k >> shift) & 255]), wt);
      }
    });
    __syncthreads();
    if (threadIdx.x < kWarp) warp_crossing_digit(s.hist, target, &s.pick_digit, &s.pick_before);
    __syncthreads();
    prefix |= static_cast<uint64_t>(s.pick_digit) << shift;
    target -= s.pick_before;
    if (target == 0) target = 1;
    __syncthreads();
  }
  return prefix;
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

// A Gumbel(0, 1) draw from the counter (seed, offset, request, node, token).
__device__ __forceinline__ float gumbel(uint64_t stream, int id) {
  const uint64_t h = splitmix(stream ^ splitmix(static_cast<uint64_t>(id)));
  const float u = (static_cast<float>(h >> 40) + 0.5f) * (1.0f / 16777216.0f);  // (0, 1)
  return -__logf(-__logf(u));
}

// One draw from the filtered target distribution of `row`.
template <typename T>
__device__ int sample_row(const TargetRow<T>& row, float temperature, int top_k, float top_p,
                          uint64_t stream, AcceptScratch& s) {
  const uint64_t best = row_argmax_key(row, s);
  // The largest value back from its key (float_key is invertible for non-NaN values).
  const uint32_t vk = static_cast<uint32_t>(best >> kIdBits);
  const uint32_t bits = (vk & 0x80000000u) ? (vk & 0x7fffffffu) : ~vk;
  const float m = __uint_as_float(bits);
  if (!(m > -INFINITY)) return key_id(best);  // nothing finite to draw from
  const Weight count{false, m, 1.0f / temperature};
  const Weight mass{true, m, 1.0f / temperature};
  uint64_t floor = 0;  // kept: key >= floor
  if (top_k > 0 && top_k < row.V) floor = select_by_weight(row, 0, top_k, count, s);
  if (top_p < 1.0f) {
    uint64_t total = 0;
    for_each_in_row(row, [&](int i, float x) {
      if (order_key(x, i) >= floor) total += mass.of(x);
    });
    total = block_sum_u64(total, s);
    uint64_t target = static_cast<uint64_t>(ceil(static_cast<double>(top_p) * total));
    if (target == 0) target = 1;
    floor = select_by_weight(row, floor, target, mass, s);
  }
  // Gumbel-max over the kept tokens: an exact draw from their renormalised softmax(x / T).
  float best_score = -INFINITY;
  int best_id = key_id(best);
  for_each_in_row(row, [&](int i, float x) {
    if (order_key(x, i) < floor || !(x > -INFINITY)) return;
    const float g = x * count.inv_temp + gumbel(stream, i);
    if (g > best_score || (g == best_score && i < best_id)) {
      best_score = g;
      best_id = i;
    }
  });
  // Largest score, lowest id: pack (score key, ~id) and take the block maximum.
  const uint64_t packed = best_score > -INFINITY ? order_key(best_score, best_id) : 0;
  const uint64_t win = block_max_u64(packed, s);
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

// The walk (SPEC stage 4) for request b; posterior(node) is computed by the whole block.
template <typename T>
__device__ void accept_request(const T* logits, long long s1, long long s2, int V, int q,
                               int path_len, int b, AcceptTree tree, AcceptOut out,
                               const SampleArgs* sampling, AcceptScratch& s) {
  const float temperature = sampling ? sampling->temperature[b] : 0.0f;
  const int top_k = sampling ? sampling->top_k[b] : 0;
  const float top_p = sampling ? sampling->top_p[b] : 1.0f;
  uint64_t stream = 0;
  if (sampling) stream = splitmix(splitmix(sampling->rng[0]) ^ sampling->rng[1]);
  int node = 0, len = 0;
  while (true) {
    const TargetRow<T> row{logits + node * s1, s2, V};
    int token;
    if (temperature > 0.0f) {
      const uint64_t at = splitmix(stream ^ (static_cast<uint64_t>(b) << 32 | node));
      token = sample_row(row, temperature, top_k, top_p, at, s);
    } else {
      token = key_id(row_argmax_key(row, s));
    }
    if (threadIdx.x == 0) {
      out.accepted_nodes[len] = node;
      out.accepted_tokens[len] = tree.verify_ids[node];
      out.accept_index[len] = static_cast<long long>(b) * q + node;
      int child = static_cast<int>(tree.first_child[node]), next = -1;
      while (child >= 0) {
        if (tree.verify_ids[child] == token) { next = child; break; }
        child = static_cast<int>(tree.next_sibling[child]);
      }
      s.next = len + 1 < path_len ? next : -1;
      if (s.next < 0) {
        *out.accept_len = len + 1;
        *out.bonus = token;
      }
    }
    __syncthreads();
    const int next = s.next;
    ++len;
    __syncthreads();
    if (next < 0) break;
    node = next;
  }
  for (int i = len + threadIdx.x; i < path_len; i += blockDim.x) {
    out.accepted_nodes[i] = -1;
    out.accepted_tokens[i] = -1;
    out.accept_index[i] = -1;
  }
}

}  // namespace ddtree
