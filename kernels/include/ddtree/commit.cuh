// SPEC stage 5 — commit: which verify-window KV slots survive, the in-place compaction of
// paged KV caches, and the gather of the accepted nodes' hidden states.
#pragma once
#include "common.cuh"

namespace ddtree {

// One request: kept[i] = window[nodes[i]] for the accepted path (-1 padded); release[j] =
// node j is not on the path.
__device__ void kept_slots_request(const long long* window, const long long* nodes, int q,
                                   int path_len, long long* kept, bool* release) {
  for (int i = threadIdx.x; i < path_len; i += blockDim.x)
    kept[i] = nodes[i] >= 0 ? window[nodes[i]] : -1;
  for (int j = threadIdx.x; j < q; j += blockDim.x) {
    bool on_path = false;
    for (int i = 0; i < path_len && nodes[i] >= 0; ++i) on_path |= nodes[i] == j;
    release[j] = !on_path;
  }
}

constexpr int kCompactChunk = 1024;  // bytes of each row a block moves
constexpr int kMaxPath = 21;         // L + 1 with L <= 20

// Copies `bytes` from src to dst with the block: 16-byte words when both ends and the
// length allow it (rows are KB long; byte copies leave the copy latency-bound).
__device__ __forceinline__ void block_copy(char* dst, const char* src, long long bytes) {
  const bool wide = (reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) |
                     static_cast<uintptr_t>(bytes)) % 16 == 0;
  if (wide) {
    uint4* d = reinterpret_cast<uint4*>(dst);
    const uint4* s = reinterpret_cast<const uint4*>(src);
    for (long long c = threadIdx.x; c < bytes / 16; c += blockDim.x) d[c] = s[c];
  } else {
    for (long long c = threadIdx.x; c < bytes; c += blockDim.x) dst[c] = src[c];
  }
}

// One (request, buffer, chunk): reads the chunk of every accepted row into shared memory,
// then writes them to the window's first slots, so sources are read before any write.
// `stage` is 16-byte aligned, kMaxPath * kCompactChunk bytes.
__device__ void compact_chunk(char* buffer, long long row_bytes, long long chunk_at,
                              const long long* window, const long long* nodes, int path_len,
                              char* stage) {
  const long long left = row_bytes - chunk_at;
  const int bytes = left < kCompactChunk ? static_cast<int>(left) : kCompactChunk;
  int len = 0;
  while (len < path_len && nodes[len] >= 0) ++len;
  for (int i = 0; i < len; ++i)
    block_copy(stage + i * kCompactChunk, buffer + window[nodes[i]] * row_bytes + chunk_at, bytes);
  __syncthreads();
  for (int i = 0; i < len; ++i)
    block_copy(buffer + window[i] * row_bytes + chunk_at, stage + i * kCompactChunk, bytes);
}

}  // namespace ddtree
