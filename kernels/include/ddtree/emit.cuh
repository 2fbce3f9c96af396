// SPEC stage 3 — verify inputs: positions, the root's verify id and the ancestor bits,
// from the links the selection wrote. Also SGLang's flat FULL mask from the bits.
#pragma once
#include "common.cuh"

namespace ddtree {

// Verify slots whose ancestor rows one block fills; a request's rows are spread over
// emit_parts(Q) blocks (launch.rs mirrors both).
constexpr int kEmitRows = 128;
__host__ __device__ constexpr int emit_parts(int q) { return (q + kEmitRows - 1) / kEmitRows; }

// Part `part` of one request: slots [part * kEmitRows, +kEmitRows). Thread t fills (slot,
// word) pairs: word w of slot i holds bits 32w..32w+31 of "j is i or an ancestor of i",
// found by walking the parent chain in shared memory. A parent's index is below its child's
// (nodes are numbered best-first; pad slots have none), so the walk for word w stops at
// the first ancestor below 32w. Part 0 also writes the root's verify id.
__device__ void emit_request(long long root, long long prefix_len, int q, int part,
                             const long long* __restrict__ depths,
                             const long long* __restrict__ parents,
                             long long* __restrict__ verify_ids, long long* __restrict__ positions,
                             int* __restrict__ ancestor_bits, short* s_parent) {
  for (int i = threadIdx.x; i < q; i += blockDim.x) s_parent[i] = static_cast<short>(parents[i]);
  const int lo = part * kEmitRows, hi = min(q, lo + kEmitRows);
  for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) positions[i] = prefix_len + depths[i];
  if (part == 0 && threadIdx.x == 0) verify_ids[0] = root;
  __syncthreads();
  const int words = (q + 31) / 32;
  for (int pair = lo * words + threadIdx.x; pair < hi * words; pair += blockDim.x) {
    const int i = pair / words, w = pair % words;
    unsigned bits = 0;
    for (int j = i; j >= 32 * w; j = s_parent[j])
      if (j < 32 * (w + 1)) bits |= 1u << (j % 32);
    ancestor_bits[pair] = static_cast<int>(bits);
  }
}

// One (request, row) of SGLang's FULL mask: request b's block is row-major [Q, P_b + Q] and
// starts after the blocks of requests 0..b-1. Prefix columns are written only when asked.
__device__ void full_mask_row(const int* __restrict__ bits, const long long* __restrict__ seq_lens,
                              int b, int i, int q, bool write_prefix, long long out_len,
                              bool* __restrict__ out) {
  long long offset = 0;
  for (int r = 0; r < b; ++r) offset += static_cast<long long>(q) * (seq_lens[r] + q);
  const long long p = seq_lens[b];
  const long long width = p + q;
  const long long start = offset + i * width;
  if (p < 0 || start + width > out_len) return;  // never write outside `out`
  bool* row = out + start;
  if (write_prefix)
    for (long long c = threadIdx.x; c < p; c += blockDim.x) row[c] = true;
  const int words = (q + 31) / 32;
  const int* my = bits + (static_cast<long long>(b) * q + i) * words;
  for (int j = threadIdx.x; j < q; j += blockDim.x) row[p + j] = (my[j / 32] >> (j % 32)) & 1;
}

}  // namespace ddtree
