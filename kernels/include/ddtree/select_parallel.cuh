// SPEC stage 2 — selection, block-parallel (one block of kSelectThreads per request).
//
// The first B rank paths in canonical order are the B best of the set {score >= t} for any
// threshold t with at least B paths at or above it. That set is prefix-closed, and a parent's
// children in it are a prefix of its ranks (a row's LP are sorted and f64 addition is
// monotone), so it is enumerated level by level: per parent, a binary search counts its
// children, a scan gives their offsets, and the children are written in turn (by one warp
// on a level of at most 32 parents). t starts at a lower bound of the B-th score taken from
// a family of paths counted cheaply (first_threshold), so the first levels list few more
// paths than the tree needs. The store holds kStoreCap paths; when a level would overflow
// it, t is raised by bisection to a value with B <= |{score >= t}| <= limit, and the store is
// compacted (a node below t has no descendant above it). A store of at most kRankStoreCap
// paths is then ranked whole (rank_store: lexicographic positions from subtree sizes, then
// each path's place in canonical order; the first B places are the tree). A larger one takes
// a radix select for the B-th score, lexicographic comparisons settle ties there, and a sort
// of the chosen paths on (score, lexicographic position) gives each its node index (by rank
// where the chosen paths are few, else a bitonic network).
//
// Every decision is a function of block-wide sums, so the result is deterministic and equals
// the best-first order exactly. When ties straddle every threshold (no t fits the store), the
// caller falls back to the best-first warp of select.cuh.
#pragma once
#include "common.cuh"
#include "select.cuh"

namespace ddtree {

constexpr int kSelectThreads = 512;
constexpr int kStoreCap = 4096;
constexpr int kStoreItems = kStoreCap / kSelectThreads;  // store slots per thread
constexpr int kBisectSteps = 80;
constexpr int kSortCap = 1024;  // > kMaxBudget, a power of two
constexpr int kIndexBits = 12;  // store indices < kStoreCap

// The enumerated paths in level order; children of one parent are contiguous, in rank order.
struct Store {
  double* score;         // [cap]
  short* parent;         // [cap] store index of the parent, -1 = the root
  short* rank;           // [cap]
  short* order;          // [cap] position in canonical order (chosen paths only); during the
                         // enumeration, the current level's LP row (floats)
  unsigned char* depth;  // [cap]
  unsigned char* chosen; // [cap]
  int* work;             // [cap + 1] child offsets, compaction map, lexicographic positions
  uint64_t* sort_key;    // [kSortCap] the chosen paths' score keys, sorted
  unsigned* sort_aux;    // [kSortCap] lexicographic position << 12 | store index

  static __host__ __device__ size_t bytes() {
    return size_t(kStoreCap) * (8 + 2 + 2 + 2 + 1 + 1) + size_t(kStoreCap + 1) * 4 +
           size_t(kSortCap) * (8 + 4);
  }

  __device__ static Store carve(char* base) {
    Store s;
    char* p = base;
    auto take = [&](size_t bytes) { char* r = p; p += bytes; return r; };
    // score and sort_key adjacent: first_threshold stages its LP rows across both.
    s.score = reinterpret_cast<double*>(take(kStoreCap * 8));
    s.sort_key = reinterpret_cast<uint64_t*>(take(kSortCap * 8));
    s.work = reinterpret_cast<int*>(take((kStoreCap + 1) * 4));
    s.sort_aux = reinterpret_cast<unsigned*>(take(kSortCap * 4));
    s.parent = reinterpret_cast<short*>(take(kStoreCap * 2));
    s.rank = reinterpret_cast<short*>(take(kStoreCap * 2));
    s.order = reinterpret_cast<short*>(take(kStoreCap * 2));
    s.depth = reinterpret_cast<unsigned char*>(take(kStoreCap));
    s.chosen = reinterpret_cast<unsigned char*>(take(kStoreCap));
    return s;
  }
};

// Diagnostics (`stats`, optional): what the selection did per request and where its clock
// cycles went (thread 0's clock64 between block barriers).
enum SelectStat {
  kStatPath,      // 1 = parallel, 2 = best-first warp
  kStatPrunes,    // threshold raises
  kStatBisect,    // bisection steps over all raises
  kStatStore,     // paths enumerated at the final threshold
  kStatTies,      // paths tied at the B-th score when some were left out, else 0 (radix path)
  kStatLevels,    // levels enumerated
  kStatCount,     // cycles: child counts and offsets
  kStatPrune,     // cycles: bisection and compaction
  kStatGrow,      // cycles: writing children
  kStatChoose,    // cycles: radix select and tie ranks (a store above kRankStoreCap)
  kStatOrder,     // cycles: canonical positions (rank_store's whole ranking included)
  kStatWrite,     // cycles: tree links
  kStatFirst,     // cycles: the first threshold (first_threshold)
  kStatSlots = 16
};

// Block-wide scratch for reductions, the radix select and the diagnostics.
struct BlockScratch {
  int ints[kWarp];
  double reals[kWarp];
  int hist[2][256];  // double-buffered: one pass fills one while the other is cleared
  int pick[2];
  int lo;
  int max_depth;
  int level[kMaxSelectDepth + 2];  // final store: depth d occupies [level[d], level[d + 1])
  double chain[kMaxSelectDepth];   // first_threshold: the greedy chain's score, by depth
  int probe[2][kWarp];             // first_threshold: a round's counts (double-buffered)
  int family;                      // first_threshold: how many departures there are
  long long stat[kStatSlots];
  long long clock;

  __device__ void reset_stats() {
    for (int i = threadIdx.x; i < kStatSlots; i += blockDim.x) stat[i] = 0;
    if (threadIdx.x == 0) clock = clock64();
  }
  __device__ void count(int slot, long long by = 1) {
    if (threadIdx.x == 0) stat[slot] += by;
  }
  // Charges thread 0's cycles since the last lap to `slot`.
  __device__ void lap(int slot) {
    if (threadIdx.x == 0) {
      const long long now = clock64();
      stat[slot] += now - clock;
      clock = now;
    }
  }
};

__device__ __forceinline__ double warp_min(double v) {
  for (int o = 16; o > 0; o >>= 1) v = fmin(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// For each of m <= N parents (scores ps): how many ranks r < eligible of LP row `row` have
// parent + LP[r] >= t, by binary searches run in lockstep so their loads overlap.
template <int N>
__device__ __forceinline__ void children_batch(const float* row, int eligible, const double* ps,
                                               int m, double t, int* counts) {
  int lo[N], hi[N];
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const bool all = t == -INFINITY;
    lo[i] = i < m && all ? eligible : 0;
    hi[i] = i < m && !all ? eligible : 0;
  }
  for (int span = eligible; span > 0; span >>= 1) {  // ceil(log2(eligible + 1)) rounds
#pragma unroll
    for (int i = 0; i < N; ++i) {
      if (lo[i] < hi[i]) {
        const int mid = (lo[i] + hi[i]) >> 1;
        if (ps[i] + static_cast<double>(row[mid]) >= t) lo[i] = mid + 1;
        else hi[i] = mid;
      }
    }
  }
#pragma unroll
  for (int i = 0; i < N; ++i) counts[i] = lo[i];
}

// This thread's contiguous share [first, first + m) of np parents, m <= kStoreItems.
__device__ __forceinline__ int parent_share(int np, int* m) {
  const int per = (np + kSelectThreads - 1) / kSelectThreads;
  const int first = min(np, static_cast<int>(threadIdx.x) * per);
  *m = min(np, first + per) - first;
  return first;
}

template <int N>
__device__ __forceinline__ int share_children_n(Store s, int lo, int first, int m,
                                                const float* row, int eligible, double t,
                                                int* counts) {
  double ps[N];
#pragma unroll
  for (int i = 0; i < N; ++i) ps[i] = i < m ? s.score[lo + first + i] : 0.0;
  children_batch<N>(row, eligible, ps, m, t, counts);
  int sum = 0;
#pragma unroll
  for (int i = 0; i < N; ++i) sum += i < m ? counts[i] : 0;
  return sum;
}

// Child counts (counts[0, m)) of this thread's share of the parents at store[lo, lo+np) at
// threshold t, and their sum. The batch width follows the share (block-uniform): wider
// batches than needed would only issue idle instructions.
__device__ __forceinline__ int share_children(Store s, int lo, int np, int first, int m,
                                              const float* row, int eligible, double t,
                                              int* counts) {
  const int per = (np + kSelectThreads - 1) / kSelectThreads;
  if (per <= 1) return share_children_n<1>(s, lo, first, m, row, eligible, t, counts);
  if (per <= 2) return share_children_n<2>(s, lo, first, m, row, eligible, t, counts);
  if (per <= 4) return share_children_n<4>(s, lo, first, m, row, eligible, t, counts);
  return share_children_n<kStoreItems>(s, lo, first, m, row, eligible, t, counts);
}

// Child counts of the parents at store[lo, lo+np) at threshold t: work[j] becomes parent j's
// first child offset, work[np] the total, which is returned.
__device__ int count_children(Store s, int lo, int np, const float* row, int eligible, double t,
                              BlockScratch& bs) {
  int m, counts[kStoreItems];
  const int first = parent_share(np, &m);
  const int sum = share_children(s, lo, np, first, m, row, eligible, t, counts);
  int total;
  int run = block_inclusive_scan(sum, bs.ints, &total) - sum;
#pragma unroll
  for (int i = 0; i < kStoreItems; ++i) {  // static indices keep `counts` in registers
    if (i < m) {
      s.work[first + i] = run;
      run += counts[i];
    }
  }
  if (threadIdx.x == 0) s.work[np] = total;
  __syncthreads();
  return total;
}

// One child of a level: store[x] is rank r of the parent at store index `parent` (-1: the
// root), SPEC's score: s(r1) = f64(LP), then parent + f64(LP).
__device__ __forceinline__ void write_child(Store s, int x, int parent, int r, const float* row,
                                            int depth) {
  const double lp = static_cast<double>(row[r]);
  s.score[x] = depth == 1 ? lp : s.score[parent] + lp;
  s.parent[x] = static_cast<short>(depth == 1 ? -1 : parent);
  s.rank[x] = static_cast<short>(r);
  s.depth[x] = static_cast<unsigned char>(depth);
}

// The parent of a level's child j: the last of the np parents whose first child offset
// (`offsets`, nondecreasing, offsets[0] = 0) is <= j.
__device__ __forceinline__ int parent_at(const int* offsets, int np, int j) {
  int a = 0, b = np - 1;
  while (a < b) {
    const int m = (a + b + 1) >> 1;
    if (offsets[m] <= j) a = m;
    else b = m - 1;
  }
  return a;
}

// Appends the children counted by count_children at store[n, n + total); each thread writes
// a contiguous run, finding its first parent by binary search and the rest by stepping.
__device__ void grow(Store s, int n, int lo, int np, const float* row, int total, int depth) {
  const int per = (total + kSelectThreads - 1) / kSelectThreads;
  const int j0 = min(total, static_cast<int>(threadIdx.x) * per), j1 = min(total, j0 + per);
  int a = parent_at(s.work, np, j0);
  for (int j = j0; j < j1; ++j) {
    while (s.work[a + 1] <= j) ++a;  // skips parents without children; work[np] = total
    write_child(s, n + j, lo + a, j - s.work[a], row, depth);
  }
  __syncthreads();
}

constexpr int kWarpGrow = 4 * kWarp;  // children a level_by_warp writes itself, at most

// Whether level_by_warp wrote the children it counted (the same answer on every thread).
__device__ __forceinline__ bool warp_grew(int n, int total) {
  return n + total <= kStoreCap && total <= kWarpGrow;
}

// count_children (and grow, when warp_grew) for a level of np <= kWarp parents, by warp 0
// alone: lane i counts parent i's children, a warp scan gives the offsets, and the lanes
// write the children in turn. One block barrier, where the block-wide pair takes five: on a
// small level the barriers, not the work, are the cost. depth == 1: the root is the parent.
__device__ int level_by_warp(Store s, int n, int lo, int np, const float* row, int eligible,
                             double t, int depth) {
  if (threadIdx.x < kWarp) {
    const int lane = threadIdx.x;
    int c = 0;
    if (lane < np) {
      const double ps = depth == 1 ? 0.0 : s.score[lo + lane];
      children_batch<1>(row, eligible, &ps, 1, t, &c);
    }
    const int end = warp_inclusive_scan(c);
    const int total = __shfl_sync(0xffffffffu, end, kWarp - 1);
    if (lane < np) s.work[lane] = end - c;
    if (lane == 0) s.work[np] = total;
    __syncwarp();
    if (warp_grew(n, total)) {
      for (int j = lane; j < total; j += kWarp) {
        const int a = parent_at(s.work, np, j);
        write_child(s, n + j, lo + a, j - s.work[a], row, depth);
      }
    }
  }
  __syncthreads();
  return s.work[np];
}

// |{score >= t}| over the store and the children of store[lo, lo+np).
__device__ int count_at_least(Store s, int n, int lo, int np, const float* row, int eligible,
                              double t, BlockScratch& bs) {
  int c = 0;
  for (int x = threadIdx.x; x < n; x += kSelectThreads) c += s.score[x] >= t;
  int m, counts[kStoreItems];
  const int first = parent_share(np, &m);
  c += share_children(s, lo, np, first, m, row, eligible, t, counts);
  return block_reduce(c, bs.ints, 0, warp_sum<int>);
}

// The lowest score among the store and the children of store[lo, lo+np).
__device__ double lowest_score(Store s, int n, int lo, int np, const float* row, int eligible,
                               BlockScratch& bs) {
  double m = INFINITY;
  for (int x = threadIdx.x; x < n; x += kSelectThreads) m = fmin(m, s.score[x]);
  if (eligible > 0)
    for (int j = threadIdx.x; j < np; j += kSelectThreads)
      m = fmin(m, s.score[lo + j] + static_cast<double>(row[eligible - 1]));
  return block_reduce(m, bs.reals, static_cast<double>(INFINITY), warp_min);
}

// Raises t (whose count exceeds the store) to a value whose count is in [budget, limit];
// false when bisection finds none (ties straddle the window).
__device__ bool raise_threshold(Store s, int n, int lo, int np, const float* row, int eligible,
                                int budget, int limit, double& t, BlockScratch& bs) {
  double below = t == -INFINITY ? lowest_score(s, n, lo, np, row, eligible, bs) : t;
  double above = 0.0;
  for (int step = 0; step < kBisectSteps; ++step) {
    bs.count(kStatBisect);
    const double mid = below + (above - below) * 0.5;
    if (!(mid > below && mid < above)) return false;
    const int c = count_at_least(s, n, lo, np, row, eligible, mid, bs);
    if (c > limit) below = mid;
    else if (c < budget) above = mid;
    else {
      t = mid;
      return true;
    }
  }
  return false;
}

// Keeps the store paths with score >= t in order (siblings stay contiguous), remapping parent
// links; moves *lo to the new start of the last level. Returns the new size.
__device__ int compact(Store s, int n, int* lo, double t, BlockScratch& bs) {
  const int base = threadIdx.x * kStoreItems;
  double sc[kStoreItems];
  short par[kStoreItems], rk[kStoreItems];
  unsigned char dp[kStoreItems];
  bool keep[kStoreItems];
  int c = 0;
#pragma unroll
  for (int i = 0; i < kStoreItems; ++i) {
    const int x = base + i;
    keep[i] = x < n && s.score[x] >= t;
    if (keep[i]) {
      sc[i] = s.score[x];
      par[i] = s.parent[x];
      rk[i] = s.rank[x];
      dp[i] = s.depth[x];
    }
    c += keep[i];
  }
  int total;
  int at = block_inclusive_scan(c, bs.ints, &total) - c;
  if (threadIdx.x == 0) bs.lo = total;  // an emptied last level starts at the end
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kStoreItems; ++i) {
    const int x = base + i;
    if (x == *lo && x < n) bs.lo = at;
    s.work[x] = keep[i] ? at++ : -1;
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kStoreItems; ++i)
    if (keep[i] && par[i] >= 0) par[i] = static_cast<short>(s.work[par[i]]);
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kStoreItems; ++i) {
    if (!keep[i]) continue;
    const int y = s.work[base + i];
    s.score[y] = sc[i];
    s.parent[y] = par[i];
    s.rank[y] = rk[i];
    s.depth[y] = dp[i];
  }
  *lo = bs.lo;
  __syncthreads();
  return total;
}

// Rank path of store x lexicographically before store y (a proper prefix first).
__device__ bool path_before(const Store& s, int x, int y) {
  if (x == y) return false;
  int a = x, b = y, da = s.depth[x], db = s.depth[y];
  for (; da > db; --da) a = s.parent[a];
  for (; db > da; --db) b = s.parent[b];
  if (a == b) return s.depth[x] < s.depth[y];
  while (s.parent[a] != s.parent[b]) {
    a = s.parent[a];
    b = s.parent[b];
  }
  return s.rank[a] < s.rank[b];
}

// The k-th largest score key of the store by an 8-bit radix select; *above = keys above it.
__device__ uint64_t kth_largest_key(Store s, int n, int k, int* above, int* ties,
                                    BlockScratch& bs) {
  uint64_t prefix = 0, keys[kStoreItems];
  int need = k, skipped = 0;
#pragma unroll
  for (int i = 0; i < kStoreItems; ++i) {  // 0: absent (below every score's key)
    const int x = threadIdx.x + i * kSelectThreads;
    keys[i] = x < n ? double_key(s.score[x]) : 0;
  }
  for (int i = threadIdx.x; i < 256; i += kSelectThreads) bs.hist[0][i] = 0;
  __syncthreads();
  for (int shift = 56, pass = 0; shift >= 0; shift -= 8, ++pass) {
    int* hist = bs.hist[pass & 1];
    // The other buffer was last read before the previous pass's second barrier.
    for (int i = threadIdx.x; i < 256; i += kSelectThreads) bs.hist[(pass + 1) & 1][i] = 0;
    const uint64_t high = shift == 56 ? 0 : ~0ull << (shift + 8);
#pragma unroll
    for (int i = 0; i < kStoreItems; ++i)
      if (keys[i] != 0 && (keys[i] & high) == prefix) atomicAdd(&hist[(keys[i] >> shift) & 255], 1);
    __syncthreads();
    if (threadIdx.x < kWarp) warp_crossing_digit(hist, need, &bs.pick[0], &bs.pick[1]);
    __syncthreads();
    const int digit = bs.pick[0];
    prefix |= static_cast<uint64_t>(digit) << shift;
    need -= bs.pick[1];
    skipped += bs.pick[1];
    if (shift == 0) *ties = hist[digit];
  }
  __syncthreads();
  *above = skipped;
  return prefix;
}

// Lists, in store order, the store paths whose score key is `cut` in s.work[0, count).
__device__ int list_tied(Store s, int n, uint64_t cut, BlockScratch& bs) {
  const int base = threadIdx.x * kStoreItems;
  int c = 0;
  for (int i = 0; i < kStoreItems; ++i) c += base + i < n && double_key(s.score[base + i]) == cut;
  int total;
  int at = block_inclusive_scan(c, bs.ints, &total) - c;
  for (int i = 0; i < kStoreItems; ++i)
    if (base + i < n && double_key(s.score[base + i]) == cut) s.work[at++] = base + i;
  __syncthreads();
  return total;
}

// Marks the first `budget` paths of the store (canonical order) in s.chosen.
__device__ void choose(Store s, int n, int budget, BlockScratch& bs) {
  if (n <= budget) {
    for (int x = threadIdx.x; x < n; x += kSelectThreads) s.chosen[x] = 1;
    __syncthreads();
    return;
  }
  int above, ties;
  const uint64_t cut = kth_largest_key(s, n, budget, &above, &ties, bs);
  const int need = budget - above;  // how many of the tied paths are taken, >= 1
  for (int x = threadIdx.x; x < n; x += kSelectThreads)
    s.chosen[x] = double_key(s.score[x]) >= cut;
  __syncthreads();
  if (ties == need) return;
  // Some tied paths are left out: keep the `need` lexicographically first.
  bs.count(kStatTies, ties);
  const int tied = list_tied(s, n, cut, bs);
  for (int i = threadIdx.x; i < tied; i += kSelectThreads) {
    const int x = s.work[i];
    int earlier = 0;
    for (int j = 0; j < tied && earlier < need; ++j) earlier += path_before(s, s.work[j], x);
    s.chosen[x] = earlier < need;
  }
  __syncthreads();
}

// Level starts of the final store into bs.level (its levels are contiguous, in depth order);
// bs.max_depth = the deepest level.
__device__ void level_starts(Store s, int n, BlockScratch& bs) {
  if (threadIdx.x == 0) bs.max_depth = 0;
  __syncthreads();
  for (int x = threadIdx.x; x < n; x += kSelectThreads) {
    const int d = s.depth[x];
    if (x == 0 || s.depth[x - 1] != d) bs.level[d] = x;
    if (x == n - 1) {
      bs.level[d + 1] = n;
      bs.max_depth = d;
    }
  }
  __syncthreads();
}

// Each chosen path's position in lexicographic order among the chosen paths (a prefix
// first), into s.work: subtree sizes bottom-up; then the sizes of a node's lower-ranked
// siblings, which sit just before it in the store, by one scan; then sums down the tree.
__device__ void lex_positions(Store s, int n, BlockScratch& bs) {
  level_starts(s, n, bs);
  for (int x = threadIdx.x; x < n; x += kSelectThreads) s.work[x] = s.chosen[x];
  __syncthreads();
  for (int d = bs.max_depth; d >= 2; --d) {
    for (int x = bs.level[d] + threadIdx.x; x < bs.level[d + 1]; x += kSelectThreads)
      if (s.chosen[x]) atomicAdd(&s.work[s.parent[x]], s.work[x]);
    __syncthreads();
  }
  const int base = threadIdx.x * kStoreItems;
  int size[kStoreItems], c = 0;
#pragma unroll
  for (int i = 0; i < kStoreItems; ++i) {
    size[i] = base + i < n ? s.work[base + i] : 0;
    c += size[i];
  }
  int total;
  int at = block_inclusive_scan(c, bs.ints, &total) - c;
#pragma unroll
  for (int i = 0; i < kStoreItems; ++i) {  // sums stay below kMaxBudget * kMaxSelectDepth
    if (base + i < n) s.order[base + i] = static_cast<short>(at);
    at += size[i];
  }
  __syncthreads();
  for (int x = threadIdx.x; x < n; x += kSelectThreads)
    if (s.chosen[x]) s.work[x] = s.order[x] - s.order[x - s.rank[x]];
  __syncthreads();
  for (int d = 2; d <= bs.max_depth; ++d) {
    for (int x = bs.level[d] + threadIdx.x; x < bs.level[d + 1]; x += kSelectThreads)
      if (s.chosen[x]) s.work[x] += s.work[s.parent[x]] + 1;
    __syncthreads();
  }
}

// Canonical order of two sort entries: higher score key, then lexicographically first.
__device__ __forceinline__ bool entry_before(uint64_t ka, unsigned xa, uint64_t kb, unsigned xb) {
  return ka > kb || (ka == kb && xa < xb);
}

// sort_chosen's entries [0, total) put in canonical order by rank, in two barriers: an
// entry's place is the number of entries before it (entries are distinct: their
// lexicographic positions differ), counted by `split` adjacent lanes over a share of the
// others each. s.order[x] gets store path x's place, sort_aux the entries in order (through
// s.work, free once the lexicographic positions are in sort_aux).
__device__ void rank_chosen(Store s, int total) {
  int split = 1;  // lanes an entry, a power of two up to a warp
  while (split < kWarp && total * split * 2 <= kSelectThreads) split *= 2;
  const int part = threadIdx.x % split;
  for (int e0 = 0; e0 < total; e0 += kSelectThreads / split) {
    const int e = e0 + static_cast<int>(threadIdx.x) / split;
    const uint64_t ke = e < total ? s.sort_key[e] : 0;
    const unsigned xe = e < total ? s.sort_aux[e] : 0;
    int before = 0;
    for (int j = part; e < total && j < total; j += split)
      before += entry_before(s.sort_key[j], s.sort_aux[j], ke, xe) ? 1 : 0;
    for (int o = split / 2; o > 0; o >>= 1) before += __shfl_xor_sync(0xffffffffu, before, o);
    if (e < total && part == 0) {
      s.order[xe & ((1u << kIndexBits) - 1)] = static_cast<short>(before);
      s.work[before] = static_cast<int>(xe);
    }
  }
  __syncthreads();
  for (int p = threadIdx.x; p < total; p += kSelectThreads) s.sort_aux[p] = static_cast<unsigned>(s.work[p]);
  __syncthreads();
}

// Sorts the chosen paths into canonical order over (score key, lexicographic position), by
// rank_chosen when they are few, else by a bitonic network; s.order[x] = the position of
// store path x. Returns their count.
__device__ int sort_chosen(Store s, int n, BlockScratch& bs) {
  lex_positions(s, n, bs);
  const int base = threadIdx.x * kStoreItems;
  int c = 0;
#pragma unroll
  for (int i = 0; i < kStoreItems; ++i) c += base + i < n && s.chosen[base + i];
  int total;
  int at = block_inclusive_scan(c, bs.ints, &total) - c;
#pragma unroll
  for (int i = 0; i < kStoreItems; ++i) {
    const int x = base + i;
    if (x < n && s.chosen[x]) {
      s.sort_key[at] = double_key(s.score[x]);
      s.sort_aux[at++] = static_cast<unsigned>(s.work[x]) << kIndexBits | x;
    }
  }
  if (total * total <= 128 * kSelectThreads) {
    __syncthreads();
    rank_chosen(s, total);
    return total;
  }
  int size = 1;
  while (size < total) size <<= 1;
  for (int i = total + threadIdx.x; i < size; i += kSelectThreads) {
    s.sort_key[i] = 0;  // below every finite score's key
    s.sort_aux[i] = ~0u;
  }
  __syncthreads();
  for (int k = 2; k <= size; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int p = threadIdx.x; p < size / 2; p += kSelectThreads) {
        const int a = 2 * j * (p / j) + p % j, b = a + j;
        const uint64_t ka = s.sort_key[a], kb = s.sort_key[b];
        const unsigned xa = s.sort_aux[a], xb = s.sort_aux[b];
        const bool ascending = (a & k) == 0;  // this half runs in canonical order
        if (ascending == entry_before(kb, xb, ka, xa)) {
          s.sort_key[a] = kb;
          s.sort_key[b] = ka;
          s.sort_aux[a] = xb;
          s.sort_aux[b] = xa;
        }
      }
      __syncthreads();
    }
  }
  for (int p = threadIdx.x; p < total; p += kSelectThreads)
    s.order[s.sort_aux[p] & ((1u << kIndexBits) - 1)] = static_cast<short>(p);
  __syncthreads();
  return total;
}

// The largest store rank_store takes (its place count costs n^2 / kSelectThreads a thread).
constexpr int kRankStoreCap = 256;
static_assert(kRankStoreCap * kRankStoreCap <= 128 * kSelectThreads, "rank_chosen's bound");

// lex_positions over the whole store (n <= kRankStoreCap), by warp 0 alone: the same three
// steps, each level a warp step instead of a block barrier (about twenty on a deep tree).
// Then the sort entries (score key, lexicographic position << kIndexBits | store index).
__device__ void lex_positions_warp(Store s, int n, BlockScratch& bs) {
  constexpr int kPer = kRankStoreCap / kWarp;  // a lane's contiguous share in the scan
  const int lane = threadIdx.x;
  for (int x = lane; x < n; x += kWarp) {  // level starts; every path counts itself
    const int d = s.depth[x];
    if (x == 0 || s.depth[x - 1] != d) bs.level[d] = x;
    if (x == n - 1) {
      bs.level[d + 1] = n;
      bs.max_depth = d;
    }
    s.work[x] = 1;
  }
  __syncwarp();
  const int deepest = n > 0 ? bs.max_depth : 0;
  for (int d = deepest; d >= 2; --d) {  // subtree sizes, bottom-up
    for (int x = bs.level[d] + lane; x < bs.level[d + 1]; x += kWarp)
      atomicAdd(&s.work[s.parent[x]], s.work[x]);
    __syncwarp();
  }
  int size[kPer], c = 0;  // sizes summed in store order: s.order
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int x = lane * kPer + i;
    size[i] = x < n ? s.work[x] : 0;
    c += size[i];
  }
  int at = warp_inclusive_scan(c) - c;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int x = lane * kPer + i;
    if (x < n) s.order[x] = static_cast<short>(at);
    at += size[i];
  }
  __syncwarp();
  for (int x = lane; x < n; x += kWarp) s.work[x] = s.order[x] - s.order[x - s.rank[x]];
  __syncwarp();
  for (int d = 2; d <= deepest; ++d) {  // positions, top-down
    for (int x = bs.level[d] + lane; x < bs.level[d + 1]; x += kWarp)
      s.work[x] += s.work[s.parent[x]] + 1;
    __syncwarp();
  }
  for (int x = lane; x < n; x += kWarp) {
    s.sort_key[x] = double_key(s.score[x]);
    s.sort_aux[x] = static_cast<unsigned>(s.work[x]) << kIndexBits | x;
  }
}

// choose and sort_chosen at once for a store of n <= kRankStoreCap paths: every path gets
// its canonical place among the whole store (lexicographic positions, then rank_chosen's
// count), and the first `budget` places are the chosen ones. No radix select: its eight
// passes cost more than counting places among a few hundred paths.
__device__ int rank_store(Store s, int n, int budget, BlockScratch& bs) {
  // The enumeration may have ended on level_by_warp, whose count every thread reads from
  // s.work after its barrier: warp 0 must not overwrite it before they have.
  __syncthreads();
  if (threadIdx.x < kWarp) lex_positions_warp(s, n, bs);
  __syncthreads();
  rank_chosen(s, n);
  for (int x = threadIdx.x; x < n; x += kSelectThreads) s.chosen[x] = s.order[x] < budget;
  __syncthreads();
  return min(n, budget);
}

// Tree links of the N chosen paths (node index = 1 + canonical position) into `out`.
__device__ void write_links(const Store& s, int n, int nodes, int q, const long long* ti, int K,
                            SelectOut out) {
  for (int i = threadIdx.x; i < q; i += kSelectThreads) {
    out.depths[i] = 0;
    out.parents[i] = -1;
    out.scores[i] = i == 0 ? 0.0 : -INFINITY;
    out.first_child[i] = -1;
    out.next_sibling[i] = -1;
    if (i >= 1) out.verify_ids[i] = 0;
  }
  __syncthreads();
  for (int j = threadIdx.x; j < nodes; j += kSelectThreads) {
    const int x = s.sort_aux[j] & ((1u << kIndexBits) - 1);
    const int i = j + 1, d = s.depth[x], r = s.rank[x], p = s.parent[x];
    const int parent_node = p < 0 ? 0 : s.order[p] + 1;
    out.depths[i] = d;
    out.parents[i] = parent_node;
    out.scores[i] = s.score[x];
    out.verify_ids[i] = ti[(d - 1) * K + r];
    if (r == 0) out.first_child[parent_node] = i;
    // The next rank of the same parent sits at x + 1 and is chosen whenever it exists.
    if (x + 1 < n && s.chosen[x + 1] && s.parent[x + 1] == p) out.next_sibling[i] = s.order[x + 1] + 1;
  }
}

constexpr int kRowRegs = (kMaxBudget + kSelectThreads - 1) / kSelectThreads;  // K <= budget

// This thread's share of LP row d (if d < L) into registers.
__device__ __forceinline__ void prefetch_row(const float* lp, int K, const int* eligible, int L,
                                             int d, float* next) {
#pragma unroll
  for (int i = 0; i < kRowRegs; ++i) {
    const int r = threadIdx.x + i * kSelectThreads;
    next[i] = d < L && r < eligible[d] ? lp[d * K + r] : 0.0f;
  }
}

// --- The first threshold: the greedy chain's departures ---
//
// Enumerating from t = -inf lists every path of the first levels until the store overflows,
// then bisects and compacts (two raises at B = 63). Any `budget` paths bound the B-th score
// from below, so t may start at the budget-th best score of a family of paths that is cheap
// to count: the departures (0, ..., 0, r), which follow the greedy chain and leave it at their
// last depth. Departure r at depth d + 1 scores chain[d] + LP[d][r] (SPEC's left-to-right
// sum: chain[d] is the chain's score), so each depth's departures are its LP row shifted, and
// their count at a threshold is one binary search. Thresholds are probed 32 at a time (two a
// warp), three rounds narrowing a window whose low end always has >= budget departures.

constexpr int kFamilyFloats = (kStoreCap * 8 + kSortCap * 8) / 4;  // score + sort_key, as floats
constexpr int kFamilyProbes = 2 * kSelectThreads / kWarp;          // a half-warp each
constexpr int kFamilyRounds = 3;
static_assert(kFamilyProbes == kWarp, "one round's counts fit a warp-sized array");
static_assert(kMaxSelectDepth <= 32, "a half-warp's 16 lanes take two depths each");

// Departures at depth d + 1 scoring >= v, among the first `len` ranks of the LP row `row`.
__device__ __forceinline__ int departures_at_least(const float* row, int len, double chain,
                                                   double v) {
  int lo = 0, hi = len;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (chain + static_cast<double>(row[mid]) >= v) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// Probe i of the window (lo, hi): the same value on every thread.
__device__ __forceinline__ double probe_value(double lo, double hi, int i) {
  return lo + (hi - lo) * static_cast<double>(i + 1) / static_cast<double>(kFamilyProbes + 1);
}

// A score with >= budget paths at or above it, near the budget-th best departure; -inf when
// there are fewer than `budget` departures. `eligible` is block-shared; uses the store's
// score and sort_key arrays as scratch (free until the first level is written).
__device__ double first_threshold(const float* lp, int K, const int* eligible, int L,
                                  int budget, Store s, BlockScratch& bs) {
  int depths = 0;  // departures exist down to the first depth with no eligible rank
  while (depths < L && eligible[depths] > 0) ++depths;
  if (depths == 0) return -INFINITY;
  const int ranks = min(K, kFamilyFloats / depths);  // a subset still bounds from below
  float* rows = reinterpret_cast<float*>(s.score);    // [depths][ranks]
  for (int i = threadIdx.x; i < depths * ranks; i += kSelectThreads) {
    const int d = i / ranks, r = i % ranks;
    if (r < eligible[d]) rows[i] = lp[d * K + r];
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double chain = 0.0;  // 0 + LP is LP: depth 1's departures are its row
    int family = 0;
#pragma unroll  // a fixed trip count: the row loads go out before the chain of adds
    for (int d = 0; d < kMaxSelectDepth; ++d) {
      if (d < depths) {
        bs.chain[d] = chain;
        family += min(ranks, eligible[d]);
        const double lp0 = static_cast<double>(rows[d * ranks]);  // rank 0 at depth d + 1
        chain = d == 0 ? lp0 : chain + lp0;
      }
    }
    bs.family = family;
  }
  __syncthreads();
  if (bs.family < budget) return -INFINITY;
  // The window: lo has >= budget departures (the lowest score of all: every one of them).
  double lo = INFINITY, hi = static_cast<double>(rows[0]);
  for (int d = 0; d < depths; ++d)
    lo = fmin(lo, bs.chain[d] + static_cast<double>(rows[d * ranks + min(ranks, eligible[d]) - 1]));
  int lo_count = bs.family;
  const int lane = threadIdx.x % kWarp, half = lane / 16, j = lane % 16;
  const int probe = 2 * (threadIdx.x / kWarp) + half;
  for (int round = 0; round < kFamilyRounds && lo_count > budget; ++round) {
    const double v = probe_value(lo, hi, probe);
    int c = 0;
    for (int d = j; d < depths; d += 16)
      c += departures_at_least(rows + d * ranks, min(ranks, eligible[d]), bs.chain[d], v);
    for (int o = 8; o > 0; o >>= 1) c += __shfl_xor_sync(0xffffffffu, c, o);  // the half-warp
    int* counts = bs.probe[round & 1];  // the other buffer is read by the previous round
    if (j == 0) counts[probe] = c;
    __syncthreads();
    int best = -1;  // the highest probe with >= budget departures (counts fall as probes rise)
    for (int i = 0; i < kFamilyProbes; ++i) best = counts[i] >= budget ? i : best;
    const double new_hi = best + 1 < kFamilyProbes ? probe_value(lo, hi, best + 1) : hi;
    if (best >= 0) {
      lo_count = counts[best];
      lo = probe_value(lo, hi, best);
    }
    hi = new_hi;
  }
  return lo;
}

// One request, one block. Returns N, or -1 when the caller must run the best-first warp.
__device__ int select_parallel(const float* __restrict__ lp, const long long* __restrict__ ti,
                               const int* eligible, int L, int K, int budget, SelectOut out,
                               Store s, BlockScratch& bs) {
  bs.count(kStatPath);
  const int limit = 4 * budget <= kStoreCap ? kStoreCap / 2 : kStoreCap;
  double t = first_threshold(lp, K, eligible, L, budget, s, bs);
  bs.lap(kStatFirst);
  int n = 0, lo = 0, np = 1;  // the store, its last level [lo, lo+np); level 0 is the root
  // Each level's LP row is staged in shared memory (in `order`, unused until the end): the
  // binary searches read it at shared-memory latency.
  // The next row is loaded into registers at the start of a level, so its global-memory
  // latency hides behind that level's work.
  float* row = reinterpret_cast<float*>(s.order);
  float next[kRowRegs];
  prefetch_row(lp, K, eligible, L, 0, next);
  for (int d = 0; d < L; ++d) {
#pragma unroll
    for (int i = 0; i < kRowRegs; ++i) {
      const int r = threadIdx.x + i * kSelectThreads;
      if (r < eligible[d]) row[r] = next[i];
    }
    __syncthreads();
    prefetch_row(lp, K, eligible, L, d + 1, next);
    int total;
    bool grown = false;
    if (np <= kWarp) {  // depth 1 (the root's children) too
      total = level_by_warp(s, n, lo, np, row, eligible[d], t, d + 1);
      grown = warp_grew(n, total);
    } else {
      total = count_children(s, lo, np, row, eligible[d], t, bs);
    }
    bs.lap(kStatCount);
    if (n + total > kStoreCap) {  // never at depth 1: K <= kMaxBudget < kStoreCap
      grown = false;
      bs.count(kStatPrunes);
      if (!raise_threshold(s, n, lo, np, row, eligible[d], budget, limit, t, bs)) return -1;
      n = compact(s, n, &lo, t, bs);
      np = n - lo;
      total = np > 0 ? count_children(s, lo, np, row, eligible[d], t, bs) : 0;
      bs.lap(kStatPrune);
    }
    if (total == 0) break;
    if (!grown) grow(s, n, lo, np, row, total, d + 1);
    bs.lap(kStatGrow);
    bs.count(kStatLevels);
    lo = n;
    n += total;
    np = total;
  }
  bs.count(kStatStore, n);
  int nodes;
  if (n <= kRankStoreCap) {
    nodes = rank_store(s, n, budget, bs);
  } else {
    choose(s, n, budget, bs);
    bs.lap(kStatChoose);
    nodes = sort_chosen(s, n, bs);
  }
  bs.lap(kStatOrder);
  write_links(s, n, nodes, budget + 1, ti, K, out);
  bs.lap(kStatWrite);
  return nodes;
}

}  // namespace ddtree
