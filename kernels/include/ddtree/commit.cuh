// SPEC stage 5 — commit: which verify-window KV slots survive, the in-place compaction of
// paged KV caches, and the gather of the accepted nodes' hidden states.
//
// Every index these kernels dereference comes from the caller (an acceptance's nodes, the
// serving engine's `out_cache_loc` slots), so each block checks its request's indices
// against the sizes it is given before using any: a bad one makes the request's blocks
// write nothing (or the documented empty result) and records a status code; the rest of
// the batch runs normally and no access leaves the tensors.
#pragma once
#include "common.cuh"

namespace ddtree {

// The accepted path of one request: nodes[0, len) up to the first -1.
struct Path {
  const long long* nodes;  // [path_len], -1 padded
  int path_len;
  int q;
};

// Records `code` in a request's status unless an earlier stage recorded one (first wins).
__device__ __forceinline__ void record_status(int* status, int code) {
  if (code != kStatusOk) atomicCAS(status, kStatusOk, code);
}

// Whether path entry i is neither a node of [0, Q) nor padding (-1, and only after the
// path; the root entry is always a node).
__device__ __forceinline__ bool bad_entry(Path p, int i) {
  const long long n = p.nodes[i];
  const bool pad_before = i > 0 && p.nodes[i - 1] < 0;
  // A path longer than Q (a node repeated) would index past the request's Q window slots.
  return n >= p.q || n < -1 || (n >= 0 && (pad_before || i >= p.q)) || (i == 0 && n < 0);
}

// kStatusNodeOutOfRange if some path entry is bad, else kStatusOk. Every thread of the
// block gets the answer.
__device__ int check_nodes(Path p) {
  int bad = 0;
  for (int i = threadIdx.x; i < p.path_len; i += blockDim.x) bad |= bad_entry(p, i);
  return __syncthreads_or(bad) ? kStatusNodeOutOfRange : kStatusOk;
}

__device__ __forceinline__ bool slot_ok(long long slot, long long slots) {
  return slot >= 0 && slot < slots;
}

// One request: kept[i] = window[nodes[i]] for the accepted path (-1 padded); release[j] =
// node j is not on the path. With `slots` >= 0 every window slot must lie in [0, slots).
// A bad index gives kept all -1 and nothing released.
__device__ int kept_slots_request(const long long* window, Path p, long long slots,
                                  long long* kept, bool* release) {
  int code = check_nodes(p);
  if (code == kStatusOk && slots >= 0) {
    int bad = 0;
    for (int j = threadIdx.x; j < p.q; j += blockDim.x) bad |= !slot_ok(window[j], slots);
    if (__syncthreads_or(bad)) code = kStatusSlotOutOfRange;
  }
  const bool ok = code == kStatusOk;
  for (int i = threadIdx.x; i < p.path_len; i += blockDim.x)
    kept[i] = ok && p.nodes[i] >= 0 ? window[p.nodes[i]] : -1;
  for (int j = threadIdx.x; j < p.q; j += blockDim.x) {
    bool on_path = false;
    for (int i = 0; i < p.path_len && p.nodes[i] >= 0; ++i) on_path |= p.nodes[i] == j;
    release[j] = ok && !on_path;
  }
  return code;
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
// `stage` is 16-byte aligned, kMaxPath * kCompactChunk bytes. Thread i reads path entry i
// and checks it (its node, the slot read, the slot written); one barrier counts the path
// (no serial walk to its end), the reads skip any out-of-range source, and the barrier
// between reads and writes combines the checks: a request with a bad index writes nothing.
__device__ int compact_chunk(char* buffer, long long row_bytes, long long slots,
                             long long chunk_at, const long long* window, Path p, char* stage) {
  const long long left = row_bytes - chunk_at;
  const int bytes = left < kCompactChunk ? static_cast<int>(left) : kCompactChunk;
  int node_bad = 0, slot_bad = 0, on_path = 0;
  if (threadIdx.x < p.path_len) {
    const int i = threadIdx.x;
    const long long n = p.nodes[i];
    on_path = n >= 0;
    node_bad = bad_entry(p, i);
    if (!node_bad && on_path) slot_bad = !slot_ok(window[n], slots) || !slot_ok(window[i], slots);
  }
  const int len = __syncthreads_count(on_path);  // the path's length, when it is valid
  for (int i = 0; i < len; ++i) {
    const long long n = p.nodes[i];
    if (n < 0 || n >= p.q) continue;  // a bad path (the same answer in every thread)
    const long long src = window[n];
    if (slot_ok(src, slots))
      block_copy(stage + i * kCompactChunk, buffer + src * row_bytes + chunk_at, bytes);
  }
  if (__syncthreads_or(node_bad | slot_bad))
    return __syncthreads_or(node_bad) ? kStatusNodeOutOfRange : kStatusSlotOutOfRange;
  for (int i = 0; i < len; ++i)
    block_copy(buffer + window[i] * row_bytes + chunk_at, stage + i * kCompactChunk, bytes);
  return kStatusOk;
}

}  // namespace ddtree
