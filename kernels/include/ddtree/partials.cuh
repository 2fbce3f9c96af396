// SPEC stage 1 as mergeable partials. A row's vocabulary is cut into parts — chunks of one
// GPU's row, and across tensor-parallel ranks each rank's shard, itself chunked — and:
//   partial_row:     one block per part: its top K (value desc, id asc; global ids), its
//                    maximum and its NaN/+inf flag (one `top_k_pass`);
//   partial_sum_row: one block per part, once every part's maximum is known: its
//                    fixed-point sum in the row's grade (fixed_sum.cuh: exp(x - row max),
//                    or exp(x) where that grade is absolute);
//   merge_row:       one block per row: the top K of every part's list, and Z from the
//                    parts' sums — exactly `candidates_row` on the whole row, bit for bit:
//                    the rank order is comparisons only and the fixed-point sum is exact.
// The lists are written K long, in rank order; a part of fewer than K tokens pads its list
// with (value -inf, id -1).
#pragma once
#include "candidates.cuh"

namespace ddtree {

constexpr int kSumThreads = 256;  // a part's sum: one read, no shared state

// One part of `len` tokens whose first global id is `id0`.
template <typename T>
__device__ void partial_row(const T* __restrict__ part, long long stride, int len, int K,
                            long long id0, float* __restrict__ values,
                            long long* __restrict__ ids, float* __restrict__ max_out,
                            int* __restrict__ bad_out, CandShared& s) {
  const int k = min(K, len);
  float m;
  NoSum none;
  const int bad = top_k_pass(part, stride, len, k, s, &m, none);
  if (threadIdx.x == 0) {
    *max_out = m;
    *bad_out = bad;
  }
  for (int r = threadIdx.x; r < K; r += blockDim.x) {
    float v = -INFINITY;
    long long id = -1;
    if (!bad && r < k) {
      const int local = static_cast<int>(0xffffffffu - static_cast<uint32_t>(s.cand[r]));
      v = key_value_or(static_cast<uint32_t>(s.cand[r] >> 32),
                       [&] { return to_f32(part[static_cast<long long>(local) * stride]); });
      id = id0 + local;
    }
    values[r] = v;
    ids[r] = id;
  }
}

// The row's maximum over its `parts` parts' maxima (comparisons only: the same on every
// rank), reduced over the block; `scratch` holds 32 floats.
__device__ __forceinline__ float parts_max(const float* __restrict__ maxima, int parts,
                                           float* scratch) {
  float m = -INFINITY;
  for (int j = threadIdx.x; j < parts; j += blockDim.x) m = fmaxf(m, maxima[j]);
  return block_max(m, scratch);
}

// One part's fixed-point sum in the grade of the row maximum `m` (against it, unless the
// grade is absolute; NaN and +inf add nothing: such a row is rejected at the merge anyway).
template <typename T>
__device__ void partial_sum_row(const T* __restrict__ part, long long stride, int len, float m,
                                U128* __restrict__ out, U128* scratch) {
  const float shift = (m == -INFINITY) ? 0.0f : m;
  U128 sum{0ull, 0ull};
  with_grade(shift, [&](auto grade) {  // the row's grade: the same on every part
    for_each_in_row(part, stride, len, [&](int, float x) {
      if (!bad_value(x)) sum = add128(sum, fixed_term(x, shift, grade));
    });
  });
  sum = block_sum128(sum, scratch);
  if (threadIdx.x == 0) *out = sum;
}

// An entry's rank key: larger = ranked earlier; a padding entry (id -1) is the smallest.
__device__ __forceinline__ uint64_t entry_key(float v, long long id) {
  return id < 0 ? 0ull : composite(float_key(v), static_cast<int>(id));
}

// The value of the entry whose key is `key`, found by binary search in the part lists
// (each in descending key order, padding last); -inf if none has it.
__device__ float value_of(const float* __restrict__ values, const long long* __restrict__ ids,
                          int parts, int K, uint64_t key) {
  for (int j = 0; j < parts; ++j) {
    const float* v = values + static_cast<long long>(j) * K;
    const long long* id = ids + static_cast<long long>(j) * K;
    int lo = 0, hi = K;  // the first entry whose key is <= key
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (entry_key(v[mid], id[mid]) > key) lo = mid + 1;
      else hi = mid;
    }
    if (lo < K && entry_key(v[lo], id[lo]) == key) return v[lo];
  }
  return -INFINITY;
}

// One row from its `parts` lists (values/ids [parts, K]), maxima, flags and sums [parts]:
// lp[K], ti[K], *eligible and *bad as candidates_row writes them for the whole row.
// parts * K <= kTieCap (the launcher's limit).
__device__ void merge_row(const float* __restrict__ values, const long long* __restrict__ ids,
                          const float* __restrict__ maxima, const int* __restrict__ bads,
                          const U128* __restrict__ sums, int parts, int K,
                          float* __restrict__ lp, long long* __restrict__ ti,
                          int* __restrict__ eligible, int* __restrict__ bad, CandShared& s) {
  int any_bad = 0;
  for (int j = threadIdx.x; j < parts; j += blockDim.x) any_bad |= bads[j];
  if (block_any(any_bad, s.iscratch)) {
    write_rejected(K, lp, ti, eligible, bad);
    return;
  }
  if (threadIdx.x == 0) s.count = s.tie_count = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < parts * K; i += blockDim.x) {
    if (ids[i] >= 0) s.ties[atomicAdd(&s.tie_count, 1)] = entry_key(values[i], ids[i]);
  }
  __syncthreads();
  select_kept(s, s.tie_count, K);  // every part has min(K, its length) >= its share
  U128 sum{0ull, 0ull};
  for (int j = threadIdx.x; j < parts; j += blockDim.x) sum = add128(sum, sums[j]);
  sum = block_sum128(sum, s.uscratch);
  const float m = parts_max(maxima, parts, s.fscratch);
  const float z = (m == -INFINITY) ? -INFINITY : fixed_normaliser(m, sum);
  const uint32_t ninf = neg_inf_key();
  int local_elig = 0;
  for (int r = threadIdx.x; r < K; r += blockDim.x) {
    const uint64_t c = s.cand[r];
    const bool finite = static_cast<uint32_t>(c >> 32) != ninf;
    // The value from its key (a zero's sign from the part lists).
    const float x = key_value_or(static_cast<uint32_t>(c >> 32),
                                 [&] { return value_of(values, ids, parts, K, c); });
    lp[r] = finite ? x - z : -INFINITY;
    ti[r] = static_cast<long long>(0xffffffffu - static_cast<uint32_t>(c));
    local_elig += finite ? 1 : 0;
  }
  int total_elig;
  block_inclusive_scan(local_elig, s.iscratch, &total_elig);
  if (threadIdx.x == 0) {
    *eligible = total_elig;
    *bad = 0;
  }
}

}  // namespace ddtree
