// SPEC stage 2 — selection: the first B rank paths in canonical order (float64 score
// descending, rank path lexicographically ascending, a proper prefix first).
//
// The fallback of select_parallel.cuh, and its benchmark baseline: one warp per request
// runs SPEC.md's best-first frontier (pop the best; push its next sibling and its first
// child), the frontier spread over the 32 lanes: every pop is a
// 32-wide argmax by warp shuffles, so the warp emits exactly the heap's order. Rank paths
// are packed 11 bits per depth (rank + 1; 0 = absent), five depths per word, so comparing
// the words in order compares paths lexicographically with a proper prefix first.
//
// The loop touches only shared memory and registers; the tree links (parents, depths,
// scores, verify ids, first child, next sibling) are written once at the end, by all lanes.
#pragma once
#include "common.cuh"

namespace ddtree {

constexpr int kPathWords = 4;
constexpr int kFieldsPerWord = 5;
constexpr int kFieldBits = 11;
constexpr int kMaxSelectDepth = kPathWords * kFieldsPerWord;  // 20
constexpr int kMaxBudget = 1023;

struct Path {
  uint64_t w[kPathWords];
};

__device__ __forceinline__ void path_add(Path& p, int depth_index, int amount) {
  const int word = depth_index / kFieldsPerWord;
  const int shift = (kFieldsPerWord - 1 - depth_index % kFieldsPerWord) * kFieldBits;
  // Static indices only, so the path stays in registers (a dynamic one spills it to local
  // memory, which costs more than the rest of a pop).
#pragma unroll
  for (int i = 0; i < kPathWords; ++i)
    if (i == word) p.w[i] += static_cast<uint64_t>(amount) << shift;
}

// Canonical "a before b": higher score key, then lexicographically smaller path.
__device__ __forceinline__ bool before(uint64_t ka, const Path& pa, uint64_t kb, const Path& pb) {
  if (ka != kb) return ka > kb;
  for (int i = 0; i < kPathWords; ++i)
    if (pa.w[i] != pb.w[i]) return pa.w[i] < pb.w[i];
  return false;
}

// Shared-memory layout, carved from dynamic shared memory (sizes depend on B, L, K).
struct SelectSmem {
  uint64_t* f_key;   // [B+1] double_key(score); 0 marks a dead slot (below every score)
  double* f_score;   // [B+1] frontier scores
  uint64_t* f_path;  // [kPathWords][B+1]
  short* f_parent;   // [B+1] node index of the parent (0 = root)
  short* f_prev;     // [B+1] node index of the previous sibling, -1 for a first child
  short* f_rank;     // [B+1]
  char* f_depth;     // [B+1]
  double* n_score;   // [B+1] chosen nodes (index 0 = root)
  short* n_parent;   // [B+1]
  short* n_rank;     // [B+1]
  char* n_depth;     // [B+1]
  short* n_first;    // [B+1] first child
  short* n_next;     // [B+1] next sibling
  float* lp;         // [L*K] log-probs cached in shared memory, or nullptr

  static __host__ __device__ size_t bytes(int budget, int depth, int k, bool cache_lp) {
    const size_t n = budget + 1;
    size_t b = n * (8 + 8 + 8 * kPathWords + 2 + 2 + 2 + 1) + n * (8 + 2 + 2 + 1 + 2 + 2);
    b = (b + 15) & ~size_t(15);
    return b + (cache_lp ? size_t(depth) * k * 4 : 0);
  }

  __device__ static SelectSmem carve(char* base, int budget, int depth, int k, bool cache_lp) {
    const size_t n = budget + 1;
    SelectSmem s;
    char* p = base;
    auto take = [&](size_t bytes) { char* r = p; p += bytes; return r; };
    s.f_key = reinterpret_cast<uint64_t*>(take(n * 8));
    s.f_score = reinterpret_cast<double*>(take(n * 8));
    s.n_score = reinterpret_cast<double*>(take(n * 8));
    s.f_path = reinterpret_cast<uint64_t*>(take(n * 8 * kPathWords));
    s.f_parent = reinterpret_cast<short*>(take(n * 2));
    s.f_prev = reinterpret_cast<short*>(take(n * 2));
    s.f_rank = reinterpret_cast<short*>(take(n * 2));
    s.n_parent = reinterpret_cast<short*>(take(n * 2));
    s.n_rank = reinterpret_cast<short*>(take(n * 2));
    s.n_first = reinterpret_cast<short*>(take(n * 2));
    s.n_next = reinterpret_cast<short*>(take(n * 2));
    s.f_depth = take(n);
    s.n_depth = take(n);
    p = base + ((p - base + 15) & ~size_t(15));
    s.lp = cache_lp ? reinterpret_cast<float*>(take(size_t(depth) * k * 4)) : nullptr;
    return s;
  }
};

struct Best {
  uint64_t key;
  int slot;  // -1: none
};

__device__ __forceinline__ Path slot_path(const SelectSmem& s, int slot, int n) {
  Path p;
  for (int i = 0; i < kPathWords; ++i) p.w[i] = s.f_path[i * n + slot];
  return p;
}

// Canonical order of two live slots; paths are read only when the scores tie.
__device__ __forceinline__ bool better(const SelectSmem& s, int n, const Best& a, const Best& b) {
  if (a.slot < 0) return false;
  if (b.slot < 0) return true;
  if (a.key != b.key) return a.key > b.key;
  return before(a.key, slot_path(s, a.slot, n), b.key, slot_path(s, b.slot, n));
}

// This lane's best live slot among slots lane, lane+32, ... < used.
__device__ Best lane_best(const SelectSmem& s, int used, int n) {
  Best best{0, -1};
#pragma unroll 4
  for (int slot = threadIdx.x % kWarp; slot < used; slot += kWarp) {
    const Best c{s.f_key[slot], slot};
    if (c.key != 0 && better(s, n, c, best)) best = c;
  }
  return best;
}

// The warp's best slot: the largest key by two 32-bit warp reductions (high word, then the
// low word among the lanes holding the top high word), then, only when whole keys tie, the
// lexicographically smallest path among the tied lanes. Live keys are never 0.
__device__ __forceinline__ Best warp_best(const SelectSmem& s, int n, Best b) {
  constexpr unsigned kAll = 0xffffffffu;
  const unsigned hi = b.slot >= 0 ? static_cast<unsigned>(b.key >> 32) : 0u;
  const unsigned top_hi = __reduce_max_sync(kAll, hi);
  if (top_hi == 0) return Best{0, -1};
  const bool high = b.slot >= 0 && hi == top_hi;
  const unsigned top_lo = __reduce_max_sync(kAll, high ? static_cast<unsigned>(b.key) : 0u);
  const unsigned tied = __ballot_sync(kAll, high && static_cast<unsigned>(b.key) == top_lo);
  int slot = __shfl_sync(kAll, b.slot, __ffs(tied) - 1);
  for (unsigned rest = tied & (tied - 1); rest != 0; rest &= rest - 1) {
    const int other = __shfl_sync(kAll, b.slot, __ffs(rest) - 1);
    const uint64_t key = (static_cast<uint64_t>(top_hi) << 32) | top_lo;
    if (before(key, slot_path(s, other, n), key, slot_path(s, slot, n))) slot = other;
  }
  return Best{(static_cast<uint64_t>(top_hi) << 32) | top_lo, slot};
}

__device__ __forceinline__ void put(SelectSmem& s, int n, int slot, double score, const Path& p,
                                    int parent, int prev, int depth, int rank) {
  s.f_key[slot] = double_key(score);
  s.f_score[slot] = score;
  for (int i = 0; i < kPathWords; ++i) s.f_path[i * n + slot] = p.w[i];
  s.f_parent[slot] = static_cast<short>(parent);
  s.f_prev[slot] = static_cast<short>(prev);
  s.f_depth[slot] = static_cast<char>(depth);
  s.f_rank[slot] = static_cast<short>(rank);
}

struct SelectOut {
  long long* verify_ids;    // [Q]
  long long* depths;        // [Q]
  long long* parents;       // [Q]
  long long* first_child;   // [Q]
  long long* next_sibling;  // [Q]
  double* scores;           // [Q]
};

// One request, one warp. lp/ti: [L, K]; eligible: [L]. Returns the node count N.
__device__ int select_request(const float* __restrict__ lp_global, const long long* __restrict__ ti,
                              const int* __restrict__ eligible, int L, int K, int budget,
                              bool rejected, SelectOut out, SelectSmem s) {
  const int lane = threadIdx.x % kWarp;
  const int n = budget + 1;
  if (s.lp != nullptr)
    for (int i = lane; i < L * K; i += kWarp) s.lp[i] = lp_global[i];
  for (int i = lane; i < n; i += kWarp) {
    s.n_first[i] = -1;
    s.n_next[i] = -1;
  }
  __shared__ int s_eligible[kMaxSelectDepth];
  for (int d = lane; d < L; d += kWarp) s_eligible[d] = min(eligible[d], K);
  if (lane == 0) s.n_score[0] = 0.0;
  __syncwarp();
  const float* lp = s.lp != nullptr ? s.lp : lp_global;
  auto lp_at = [&](int depth, int rank) { return static_cast<double>(lp[(depth - 1) * K + rank]); };
  auto ok = [&](int depth, int rank) { return depth <= L && rank < s_eligible[depth - 1]; };

  int used = 0;
  if (!rejected && ok(1, 0)) {
    if (lane == 0) {
      Path p{};
      path_add(p, 0, 1);
      put(s, n, 0, lp_at(1, 0), p, 0, -1, 1, 0);
    }
    used = 1;
  }
  __syncwarp();
  int nodes = 0;
  Best mine = lane_best(s, used, n);
  while (nodes < budget) {
    const Best win = warp_best(s, n, mine);
    if (win.slot < 0) break;
    const int node = ++nodes;
    // Read phase (every lane), then lane 0 writes, then the affected lanes rescan.
    const int slot = win.slot;
    const int depth = s.f_depth[slot], rank = s.f_rank[slot], parent = s.f_parent[slot];
    const int prev = s.f_prev[slot];
    const double score = s.f_score[slot];
    const Path path = slot_path(s, slot, n);
    const bool has_sibling = ok(depth, rank + 1);
    const bool has_child = ok(depth + 1, 0);
    const double parent_score = s.n_score[parent];
    __syncwarp();
    if (lane == 0) {
      s.n_score[node] = score;
      s.n_parent[node] = static_cast<short>(parent);
      s.n_depth[node] = static_cast<char>(depth);
      s.n_rank[node] = static_cast<short>(rank);
      if (prev < 0) s.n_first[parent] = static_cast<short>(node);
      else s.n_next[prev] = static_cast<short>(node);
      // The popped slot takes the next sibling; the first child takes a new slot.
      s.f_key[slot] = 0;
      if (has_sibling) {
        const double lp_next = lp_at(depth, rank + 1);
        const double sib = parent == 0 ? lp_next : parent_score + lp_next;
        Path sp = path;
        path_add(sp, depth - 1, 1);
        put(s, n, slot, sib, sp, parent, node, depth, rank + 1);
      }
      if (has_child) {
        Path cp = path;
        path_add(cp, depth, 1);
        put(s, n, used, score + lp_at(depth + 1, 0), cp, node, -1, depth + 1, 0);
      }
    }
    const int new_slot = used;
    used += has_child ? 1 : 0;
    __syncwarp();
    // The popped slot's lane looks again, with the whole warp: lane t reads the owner's
    // t-th slot, then one warp reduction (a serial rescan costs a pop its most).
    const int owner = slot % kWarp;
    const int mine_slot = owner + kWarp * lane;
    Best column{0, -1};
    if (mine_slot < used && s.f_key[mine_slot] != 0) column = Best{s.f_key[mine_slot], mine_slot};
    const Best owner_best = warp_best(s, n, column);
    if (lane == owner) mine = owner_best;
    // The new child's lane only compares it with what it holds.
    if (has_child && lane == new_slot % kWarp) {
      const Best child{s.f_key[new_slot], new_slot};
      if (better(s, n, child, mine)) mine = child;
    }
    __syncwarp();
  }
  __syncwarp();
  // Write the tree links once, in parallel.
  for (int i = lane; i < n; i += kWarp) {
    const bool real = i >= 1 && i <= nodes;
    out.depths[i] = real ? s.n_depth[i] : 0;
    out.parents[i] = real ? s.n_parent[i] : -1;
    out.scores[i] = i == 0 ? 0.0 : (real ? s.n_score[i] : -INFINITY);
    out.first_child[i] = i <= nodes ? s.n_first[i] : -1;
    out.next_sibling[i] = real ? s.n_next[i] : -1;
    if (i >= 1) out.verify_ids[i] = real ? ti[(s.n_depth[i] - 1) * K + s.n_rank[i]] : 0;
  }
  return nodes;
}

}  // namespace ddtree
