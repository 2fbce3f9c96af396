// SPEC stage 4 — accept: walk the tree along the target's posterior tokens, one cluster of
// kAcceptCluster blocks per request (accept_row.cuh). The walk is sequential (the next row
// depends on the posterior), so the time per level is one read of a 300 KB row at
// V = 151936: one block per request streamed it alone, eight blocks stream it as eighths.
// The posterior of a visited node: greedy = argmax (lowest id on ties, NaN as -inf), or a
// draw (sample.cuh). Only visited nodes are computed.
#pragma once
#include "shortlist.cuh"

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
  int* status;                 // [1]: kStatusOk or kStatusBadTreeLink
};

// The tree's links, from shared memory when the tree fits (the walk chases them one by one):
// `local` holds Q verify ids, then Q first children, then Q next siblings.
struct Links {
  const int* local;  // null: read the int64 arrays in global memory
  AcceptTree g;
  int q;
  bool bad;  // some link lies outside [-1, Q): the walk must not follow any
  __device__ long long token(int i) const { return local ? local[i] : g.verify_ids[i]; }
  __device__ int first_child(int i) const {
    return local ? local[q + i] : static_cast<int>(g.first_child[i]);
  }
  __device__ int next_sibling(int i) const {
    return local ? local[2 * q + i] : static_cast<int>(g.next_sibling[i]);
  }
  // The child of `node` that carries `token`, -1 if none, or kCycle for a corrupt tree: a
  // sibling chain longer than Q, or a child that does not come after its parent (nodes are
  // numbered in best-first order, so a walk only moves forward and never revisits a node).
  // Links are in range (checked at load).
  static constexpr int kCycle = -2;
  __device__ int child_with(int node, int token) const {
    int c = first_child(node);
    for (int steps = 0; c >= 0; c = next_sibling(c), ++steps) {
      if (steps == q) return kCycle;
      if (this->token(c) == token) return c > node ? c : kCycle;
    }
    return -1;
  }
};

__device__ __forceinline__ bool link_ok(long long link, int q) { return link >= -1 && link < q; }

// Copies the links into `local` (3 * Q ints of shared memory) when Q <= kLinkCap, and checks
// every link against [-1, Q) first: the walk follows them as row offsets.
__device__ Links load_links(int* local, AcceptTree tree, int q) {
  const bool in_smem = q <= kLinkCap;
  int bad = 0;
  for (int i = threadIdx.x; i < q; i += blockDim.x) {
    const long long fc = tree.first_child[i], ns = tree.next_sibling[i];
    bad |= !link_ok(fc, q) || !link_ok(ns, q);
    if (in_smem) {
      local[i] = static_cast<int>(tree.verify_ids[i]);
      local[q + i] = static_cast<int>(fc);
      local[2 * q + i] = static_cast<int>(ns);
    }
  }
  bad = __syncthreads_or(bad);
  return Links{in_smem ? local : nullptr, tree, q, bad != 0};
}

// The root-only result of a request whose links are corrupt (rank 0 of the cluster).
__device__ void write_root_only(const Links& links, AcceptOut out, int b, int path_len,
                                int root_token) {
  for (int i = threadIdx.x; i < path_len; i += blockDim.x) {
    out.accepted_nodes[i] = i == 0 ? 0 : -1;
    out.accepted_tokens[i] = i == 0 ? links.token(0) : -1;
    out.accept_index[i] = i == 0 ? static_cast<long long>(b) * links.q : -1;
  }
  if (threadIdx.x == 0) {
    *out.accept_len = 1;
    *out.bonus = root_token;
    *out.status = kStatusBadTreeLink;
  }
}

// The walk of request b along `posterior(node)` (every thread of the block calls it, in
// the same order; the walk's cluster or a lone block), written by the `leader` block:
// corrupt links (every thread checked every link, so all agree) or a sibling cycle met on
// the walk give the root-only result, the walk restarting at the root once to draw its
// posterior again (the same token), with one call site for the costly part.
template <typename Posterior>
__device__ void walk_request(const Links& links, AcceptOut out, int b, int path_len,
                             bool leader, Posterior posterior, AcceptScratch& s) {
  bool corrupt = links.bad;
  int node = 0, len = 0;
  while (true) {
    const int token = posterior(node);
    if (corrupt) {
      if (leader) write_root_only(links, out, b, path_len, token);
      break;
    }
    if (threadIdx.x == 0) {
      const int next = len + 1 < path_len ? links.child_with(node, token) : -1;
      s.next = next;
      if (leader && next != Links::kCycle) {
        out.accepted_nodes[len] = node;
        out.accepted_tokens[len] = links.token(node);
        out.accept_index[len] = static_cast<long long>(b) * links.q + node;
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
    if (next == Links::kCycle) {
      corrupt = true;
      node = 0;
      continue;
    }
    if (next < 0) break;
    node = next;
  }
  if (leader && !corrupt) {
    for (int i = len + threadIdx.x; i < path_len; i += blockDim.x) {
      out.accepted_nodes[i] = -1;
      out.accepted_tokens[i] = -1;
      out.accept_index[i] = -1;
    }
    if (threadIdx.x == 0) *out.status = kStatusOk;
  }
}

// The walk (SPEC stage 4) for request b, run by each block of its cluster; `rank` 0 writes
// the outputs. A draw is by shortlist (shortlist.cuh) unless `exhaustive` (sample_row's
// passes: the same token). `cache` (dynamic shared memory, or null) holds this block's row
// slice; `local_links` has room for 3 * Q ints when Q <= kLinkCap.
template <typename T, bool kSampling>
__device__ void accept_request(const T* logits, long long s1, long long s2, int V, int q,
                               int path_len, int b, int rank, AcceptTree tree, AcceptOut out,
                               const Sampling* sampling, bool exhaustive, T* cache,
                               int* local_links,
                               AcceptScratch& s) {
  const float temperature = sampling ? sampling->temperature[b] : 0.0f;
  const int top_k = sampling ? sampling->top_k[b] : 0;
  const float top_p = sampling ? sampling->top_p[b] : 1.0f;
  const uint64_t stream = sampling ? call_stream(sampling->rng) : 0;
  const Links links = load_links(local_links, tree, q);
  Cluster cl{s, 0};
  const int lo = min(V, rank * accept_slice_len(V)), hi = min(V, lo + accept_slice_len(V));
  // The posterior token of `node` (a draw is keyed by (stream, request, node), so asking
  // again for the same node gives the same token).
  auto posterior = [&](int node) {
    Slice<T> slice{logits + node * s1, s2, lo, hi, cache, false};
    if (kSampling && temperature > 0.0f) {
      const uint64_t draws = node_stream(stream, b, node);
      const int token = exhaustive ? kDrawBySampleRow : draw_row(slice, temperature, top_k, top_p, V, draws, cl);
      if (token != kDrawBySampleRow) return token;
      return sample_row(slice, temperature, top_k, top_p, V, draws, cl);
    }
    constexpr int kBatch = kSampling ? kAcceptLoadBatch : kGreedyLoadBatch;
    return argmax_token(
        row_argmax_key<T, kBatch>(Slice<T>{slice.row, s2, lo, hi, nullptr, false}, cl));
  };
  walk_request(links, out, b, path_len, rank == 0, posterior, s);
  cg::this_cluster().sync();  // no block leaves while another may read its shared memory
}

}  // namespace ddtree
