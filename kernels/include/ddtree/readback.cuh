// The readback of an acceptance into a ring of pinned host slots, stored by the SMs through
// the slots' device mapping (no copy engine). The ring's cursor lives in device memory and
// the kernel advances it, so every execution — eager, a Stepper replay, or a replay of any
// graph the caller captured the call in — writes the next slot.
//
// A slot is int64 words: [begin stamp, bs, path_len, 0, accept_len[bs], bonus[bs],
// accepted_tokens[bs * path_len], status[bs], ..., end stamp (the slot's last word)].
// Round r (the cursor's value) writes stamp r + 1: the begin stamp first, then the data,
// then the end stamp. Thread 0 stores both stamps, each behind a system-scope fence: the
// first makes the begin stamp visible before thread 0 reaches the barrier the data stores
// wait on; the second follows the barrier after the data stores, so it orders them (fences
// are cumulative over what the barrier let thread 0 observe) before the end stamp. A host
// reader takes the end stamp, copies the data, then re-reads the begin stamp: equal stamps
// mean the copy is whole (a seqlock: crates/ddtree-cuda/src/readback.rs's RingReader, whose
// volatile loads sit between acquire fences).
#pragma once
#include <cstddef>

#include "common.cuh"

namespace ddtree {

constexpr int kReadbackHeader = 4;
constexpr int kReadbackThreads = 256;

struct ReadbackRing {
  long long* slots;               // mapped pinned memory, [nslots, slot_words]
  unsigned long long* cursor;     // device: readback writes issued so far
  long long slot_words;
  int nslots;
};

struct ReadbackSrc {
  const long long* accept_len;       // [bs]
  const long long* bonus;            // [bs]
  const long long* accepted_tokens;  // [bs, path_len]
  const int* status;                 // [bs]
  int bs;
  int path_len;
};

// The Rust launcher passes these by value as #[repr(C)] twins (crates/ddtree-cuda/src/
// readback.rs asserts the same sizes and offsets).
static_assert(sizeof(ReadbackRing) == 32 && offsetof(ReadbackRing, cursor) == 8 &&
                  offsetof(ReadbackRing, slot_words) == 16 && offsetof(ReadbackRing, nslots) == 24,
              "ReadbackRing layout");
static_assert(sizeof(ReadbackSrc) == 40 && offsetof(ReadbackSrc, bonus) == 8 &&
                  offsetof(ReadbackSrc, accepted_tokens) == 16 && offsetof(ReadbackSrc, status) == 24 &&
                  offsetof(ReadbackSrc, bs) == 32 && offsetof(ReadbackSrc, path_len) == 36,
              "ReadbackSrc layout");

// Word i of the slot's payload (header included), read from the acceptance.
__device__ __forceinline__ long long readback_word(const ReadbackSrc& src, int i) {
  if (i == 1) return src.bs;
  if (i == 2) return src.path_len;
  if (i < kReadbackHeader) return 0;
  i -= kReadbackHeader;
  if (i < src.bs) return src.accept_len[i];
  i -= src.bs;
  if (i < src.bs) return src.bonus[i];
  i -= src.bs;
  if (i < src.bs * src.path_len) return src.accepted_tokens[i];
  return src.status[i - src.bs * src.path_len];
}

// One block: claims the next round from the cursor (atomically, so launches that run
// concurrently take distinct rounds) and writes it into slot `round % nslots`.
__device__ void readback_round(ReadbackRing ring, ReadbackSrc src) {
  __shared__ unsigned long long claimed;
  if (threadIdx.x == 0) claimed = atomicAdd(ring.cursor, 1ull);
  __syncthreads();
  const unsigned long long round = claimed;
  volatile long long* slot = ring.slots + static_cast<long long>(round % ring.nslots) * ring.slot_words;
  const long long stamp = static_cast<long long>(round) + 1;
  if (threadIdx.x == 0) {
    slot[0] = stamp;
    __threadfence_system();  // the begin stamp is visible before any data
  }
  __syncthreads();
  const int words = kReadbackHeader + src.bs * (src.path_len + 3);
  for (int i = 1 + threadIdx.x; i < words; i += blockDim.x) slot[i] = readback_word(src, i);
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();  // every thread's data is visible before the end stamp
    slot[ring.slot_words - 1] = stamp;
  }
}

}  // namespace ddtree
