// SPEC stage 4 over vocabulary shards (tensor parallelism): each rank holds the target
// logits of a contiguous slice of the vocabulary. A node's posterior is a maximum over the
// row of order keys (accept_row.cuh: value key << 24 | ~global id), and a maximum splits
// over shards exactly:
//   shard_keys:  one block per node of this rank's shard: the shard's greedy key (its
//                first maximum, NaN ignored) and, for a request that samples by temperature
//                alone, its best Gumbel-max draw key — the same counters (stream of the
//                request and node, global token id) and the same score (draw_score) as the
//                walk's sample_row, so the best draw over the ranks is the walk's draw;
//   walk_keys:   after the caller gathers every rank's keys, one block per request walks
//                the tree (walk_request) taking each visited node's posterior from the
//                maximum over the ranks' keys.
// A shard prunes the tokens that cannot beat its own maximum's draw (`contender_from`,
// exact wherever it prunes); a token pruned on one shard cannot win on the whole row
// either, since the row's maximum is at least the shard's. top_k / top_p need the whole row: the caller gathers
// rows for those requests instead (these kernels apply temperature alone).
#pragma once
#include "accept.cuh"
#include "params.h"

namespace ddtree {

constexpr int kShardKeyThreads = 256;
constexpr int kKeyWalkThreads = 128;

// The greedy key of a shard row: the largest (value, then lowest global id) among values
// above -inf, NaN ignored; 0 when there is none. `scratch` holds a warp's slot per warp.
template <typename T>
__device__ uint64_t shard_greedy_key(const T* row, long long stride, int V, long long id0,
                                     uint64_t* scratch) {
  float best = -INFINITY;
  int at = -1;
  for (int i = threadIdx.x; i < V; i += blockDim.x) {  // ids ascending: the first maximum
    const float x = to_f32(row[i * stride]);
    if (x > best) {
      best = x;
      at = i;
    }
  }
  const uint64_t key = at < 0 ? 0 : order_key(best, static_cast<int>(id0 + at));
  return block_reduce(key, scratch, uint64_t{0}, warp_max_u64);
}

// The best draw key of a shard row whose greedy key is `greedy` (nonzero): the largest
// score x / T + G (then the lowest id) among the shard's contenders, 0 when none.
template <typename T>
__device__ uint64_t shard_draw_key(const T* row, long long stride, int V, long long id0,
                                   float temperature, uint64_t stream, uint64_t greedy,
                                   uint64_t* scratch) {
  const float inv_temp = 1.0f / temperature;
  const float from = contender_from(key_value(greedy), temperature, inv_temp);
  float best_score = -INFINITY;
  int best_id = 0x7fffffff;
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    const float x = to_f32(row[i * stride]);
    if (!(x >= from)) continue;  // cannot win (and NaN)
    const int id = static_cast<int>(id0 + i);
    const float g = draw_score(x, inv_temp, stream, id);
    if (g > best_score || (g == best_score && id < best_id)) {
      best_score = g;
      best_id = id;
    }
  }
  const uint64_t key = best_score > -INFINITY ? order_key(best_score, best_id) : 0;
  return block_reduce(key, scratch, uint64_t{0}, warp_max_u64);
}

// One node row of the shard (block (b * Q + node)).
template <typename T>
__device__ void shard_keys(const ShardKeyParams& p) {
  __shared__ uint64_t scratch[kWarp];
  const int n = blockIdx.x, b = n / p.q, node = n % p.q;
  const T* row = static_cast<const T*>(p.logits) + b * p.s0 + node * p.s1;
  const uint64_t greedy = shard_greedy_key(row, p.s2, p.V, p.id0, scratch);
  const float temperature = p.sampling.temperature ? p.sampling.temperature[b] : 0.0f;
  uint64_t sampled = 0;
  if (temperature > 0.0f && greedy != 0) {
    const uint64_t stream = node_stream(call_stream(p.sampling.rng), b, node);
    sampled = shard_draw_key(row, p.s2, p.V, p.id0, temperature, stream, greedy, scratch);
  }
  if (threadIdx.x == 0) {
    p.greedy[n] = greedy;
    p.sampled[n] = sampled;
  }
}

// The walk of request b along the ranks' keys: a node's greedy posterior is the largest
// greedy key's token (0 when no rank has a value above -inf); a sampled one the largest
// draw key's, or the greedy token when no rank has a contender (as sample_row returns).
__device__ void walk_keys(const KeyWalkParams& p, int* local_links) {
  __shared__ AcceptScratch s;
  const int b = blockIdx.x;
  const long long row = static_cast<long long>(b) * p.q, path = static_cast<long long>(b) * p.path_len;
  const float temperature = p.temperature ? p.temperature[b] : 0.0f;
  const long long rank_stride = static_cast<long long>(p.bs) * p.q;
  auto posterior = [&](int node) {
    uint64_t greedy = 0, sampled = 0;
    for (int r = 0; r < p.tp; ++r) {
      const uint64_t g = p.greedy[r * rank_stride + row + node];
      const uint64_t d = p.sampled[r * rank_stride + row + node];
      greedy = g > greedy ? g : greedy;
      sampled = d > sampled ? d : sampled;
    }
    if (temperature > 0.0f && greedy != 0 && sampled != 0) return key_id(sampled);
    return argmax_token(greedy);
  };
  const Links links = load_links(
      local_links,
      AcceptTree{p.tree.verify_ids + row, p.tree.first_child + row, p.tree.next_sibling + row},
      p.q);
  walk_request(links,
               AcceptOut{p.out.accepted_nodes + path, p.out.accepted_tokens + path,
                         p.out.accept_index + path, p.out.accept_len + b, p.out.bonus + b,
                         p.out.status + b},
               b, p.path_len, true, posterior, s);
}

}  // namespace ddtree
