// SPEC stage 4 — accept: walk the tree along the target's posterior tokens, one cluster of
// kAcceptCluster blocks per request (accept_row.cuh). The walk is sequential (the next row
// depends on the posterior), so the time per level is one read of a 300 KB row at
// V = 151936: one block per request streamed it alone, eight blocks stream it as eighths.
// The posterior of a visited node: greedy = argmax (lowest id on ties, NaN as -inf), or a
// draw (sample.cuh). Only visited nodes are computed.
#pragma once
#include "sample.cuh"

namespace ddtree {

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

// The tree's links, from shared memory when the tree fits (the walk chases them one by one):
// `local` holds Q verify ids, then Q first children, then Q next siblings.
struct Links {
  const int* local;  // null: read the int64 arrays in global memory
  AcceptTree g;
  int q;
  __device__ long long token(int i) const { return local ? local[i] : g.verify_ids[i]; }
  __device__ int first_child(int i) const {
    return local ? local[q + i] : static_cast<int>(g.first_child[i]);
  }
  __device__ int next_sibling(int i) const {
    return local ? local[2 * q + i] : static_cast<int>(g.next_sibling[i]);
  }
  // The child of `node` that carries `token`, or -1.
  __device__ int child_with(int node, int token) const {
    for (int c = first_child(node); c >= 0; c = next_sibling(c))
      if (this->token(c) == token) return c;
    return -1;
  }
};

// Copies the links into `local` (3 * Q ints of shared memory) when Q <= kLinkCap.
__device__ Links load_links(int* local, AcceptTree tree, int q) {
  if (q > kLinkCap) return Links{nullptr, tree, q};
  for (int i = threadIdx.x; i < q; i += blockDim.x) {
    local[i] = static_cast<int>(tree.verify_ids[i]);
    local[q + i] = static_cast<int>(tree.first_child[i]);
    local[2 * q + i] = static_cast<int>(tree.next_sibling[i]);
  }
  __syncthreads();
  return Links{local, tree, q};
}

// The walk (SPEC stage 4) for request b, run by each block of its cluster; `rank` 0 writes
// the outputs. `cache` (dynamic shared memory, or null) holds this block's row slice;
// `local_links` has room for 3 * Q ints when Q <= kLinkCap.
template <typename T>
__device__ void accept_request(const T* logits, long long s1, long long s2, int V, int q,
                               int path_len, int b, int rank, AcceptTree tree, AcceptOut out,
                               const SampleArgs* sampling, T* cache, int* local_links,
                               AcceptScratch& s) {
  const float temperature = sampling ? sampling->temperature[b] : 0.0f;
  const int top_k = sampling ? sampling->top_k[b] : 0;
  const float top_p = sampling ? sampling->top_p[b] : 1.0f;
  uint64_t stream = 0;
  if (sampling) stream = splitmix(splitmix(sampling->rng[0]) ^ sampling->rng[1]);
  const Links links = load_links(local_links, tree, q);
  Cluster cl{s, 0};
  const int lo = min(V, rank * accept_slice_len(V)), hi = min(V, lo + accept_slice_len(V));
  int node = 0, len = 0;
  while (true) {
    Slice<T> slice{logits + node * s1, s2, lo, hi, cache, false};
    int token;
    if (temperature > 0.0f) {
      const uint64_t at = splitmix(stream ^ (static_cast<uint64_t>(b) << 32 | node));
      token = sample_row(slice, temperature, top_k, top_p, V, at, cl);
    } else {
      token = argmax_token(row_argmax_key(Slice<T>{slice.row, s2, lo, hi, nullptr, false}, cl));
    }
    if (threadIdx.x == 0) {
      const int next = len + 1 < path_len ? links.child_with(node, token) : -1;
      s.next = next;
      if (rank == 0) {
        out.accepted_nodes[len] = node;
        out.accepted_tokens[len] = links.token(node);
        out.accept_index[len] = static_cast<long long>(b) * q + node;
        if (next < 0) {
          *out.accept_len = len + 1;
          *out.bonus = token;
        }
      }
    }
    __syncthreads();
    const int next = s.next;
    ++len;
    __syncthreads();
    if (next < 0) break;
    node = next;
  }
  if (rank == 0)
    for (int i = len + threadIdx.x; i < path_len; i += blockDim.x) {
      out.accepted_nodes[i] = -1;
      out.accepted_tokens[i] = -1;
      out.accept_index[i] = -1;
    }
  cg::this_cluster().sync();  // no block leaves while another may read its shared memory
}

}  // namespace ddtree
