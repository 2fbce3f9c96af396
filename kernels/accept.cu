// Entry points of SPEC stage 4 (see include/ddtree/accept.cuh): one block per request.
// The sampling arguments are null for a greedy batch; otherwise each request's temperature
// decides (<= 0: greedy).
#include "ddtree/accept.cuh"

template <typename T>
__device__ void accept_entry(const T* logits, long long s0, long long s1, long long s2, int V,
                             int q, int path_len, const long long* verify_ids,
                             const long long* first_child, const long long* next_sibling,
                             long long* accepted_nodes, long long* accepted_tokens,
                             long long* accept_index, long long* accept_len, long long* bonus,
                             const float* temperature, const int* top_k, const float* top_p,
                             const long long* rng) {
  __shared__ ddtree::AcceptScratch s;
  const int b = blockIdx.x;
  const long long row = static_cast<long long>(b) * q, path = static_cast<long long>(b) * path_len;
  const ddtree::SampleArgs args{temperature, top_k, top_p, rng};
  ddtree::accept_request<T>(
      logits + b * s0, s1, s2, V, q, path_len, b,
      ddtree::AcceptTree{verify_ids + row, first_child + row, next_sibling + row},
      ddtree::AcceptOut{accepted_nodes + path, accepted_tokens + path, accept_index + path,
                        accept_len + b, bonus + b},
      temperature != nullptr ? &args : nullptr, s);
}

#define DDTREE_ACCEPT(NAME, T)                                                                 \
  extern "C" __global__ void __launch_bounds__(ddtree::kAcceptThreads) NAME(                   \
      const T* logits, long long s0, long long s1, long long s2, int V, int q, int path_len,   \
      const long long* verify_ids, const long long* first_child,                               \
      const long long* next_sibling, long long* accepted_nodes, long long* accepted_tokens,    \
      long long* accept_index, long long* accept_len, long long* bonus,                        \
      const float* temperature, const int* top_k, const float* top_p, const long long* rng) {  \
    accept_entry<T>(logits, s0, s1, s2, V, q, path_len, verify_ids, first_child, next_sibling, \
                    accepted_nodes, accepted_tokens, accept_index, accept_len, bonus,          \
                    temperature, top_k, top_p, rng);                                           \
  }

DDTREE_ACCEPT(ddtree_accept_f32, float)
DDTREE_ACCEPT(ddtree_accept_f16, __half)
DDTREE_ACCEPT(ddtree_accept_bf16, __nv_bfloat16)

// Advances the generator's offset after a sampling accept, so that the next call (or the
// next replay of a graph that captured it) draws fresh numbers.
extern "C" __global__ void ddtree_advance_rng(long long* rng) { rng[1] += 1; }
