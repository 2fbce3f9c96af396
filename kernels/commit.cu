// Entry points of SPEC stage 5 (see include/ddtree/commit.cuh).
#include "ddtree/commit.cuh"
#include "ddtree/readback.cuh"

// grid (bs): kept slots [bs, L+1] and the release mask [bs, Q]; `slots` < 0: slot ids
// unchecked (they are copied, not dereferenced). Status codes into `status` [bs].
extern "C" __global__ void __launch_bounds__(256)
    ddtree_kept_slots(const long long* window, const long long* nodes, int q, int path_len,
                      long long slots, long long* kept, bool* release, int* status) {
  const int b = blockIdx.x;
  const ddtree::Path p{nodes + static_cast<long long>(b) * path_len, path_len, q};
  const int code = ddtree::kept_slots_request(window + static_cast<long long>(b) * q, p, slots,
                                              kept + static_cast<long long>(b) * path_len,
                                              release + static_cast<long long>(b) * q);
  if (threadIdx.x == 0) ddtree::record_status(status + b, code);
}

// grid (bs, buffers, chunks): every buffer is [slots, row_bytes] (a layer's K, V or MLA
// latent cache; `slots` is the smallest row count among them); `buffers` is a device table
// of their base addresses. A request with a bad index moves nothing.
extern "C" __global__ void __launch_bounds__(256)
    ddtree_compact_kv(char* const* buffers, long long row_bytes, long long slots,
                      const long long* window, const long long* nodes, int q, int path_len,
                      int* status) {
  __shared__ __align__(16) char stage[ddtree::kMaxPath * ddtree::kCompactChunk];
  const int b = blockIdx.x;
  const ddtree::Path p{nodes + static_cast<long long>(b) * path_len, path_len, q};
  const int code = ddtree::compact_chunk(
      buffers[blockIdx.y], row_bytes, slots, static_cast<long long>(blockIdx.z) * ddtree::kCompactChunk,
      window + static_cast<long long>(b) * q, p, stage);
  if (threadIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0) ddtree::record_status(status + b, code);
}

// grid (bs, L+1): row i of request b's output = hidden row b*Q + nodes[i] (zeros past the
// path). Rows are row_bytes long; hidden is [bs*Q, row_bytes], out [bs, L+1, row_bytes]. A
// request with a node outside [0, Q) keeps its output rows as they were.
extern "C" __global__ void __launch_bounds__(256)
    ddtree_gather_hidden(const char* hidden, long long row_bytes, const long long* nodes, int q,
                         int path_len, char* out, int* status) {
  const int b = blockIdx.x, i = blockIdx.y;
  const ddtree::Path p{nodes + static_cast<long long>(b) * path_len, path_len, q};
  const int code = ddtree::check_nodes(p);
  if (code != ddtree::kStatusOk) {
    if (threadIdx.x == 0 && i == 0) ddtree::record_status(status + b, code);
    return;
  }
  const long long node = p.nodes[i];
  char* dst = out + (static_cast<long long>(b) * path_len + i) * row_bytes;
  if (node < 0) {
    for (long long c = threadIdx.x; c < row_bytes; c += blockDim.x) dst[c] = 0;
    return;
  }
  const char* src = hidden + (static_cast<long long>(b) * q + node) * row_bytes;
  ddtree::block_copy(dst, src, row_bytes);
}

// The readback (include/ddtree/readback.cuh): one block writes the acceptance into the next
// slot of the pinned ring and advances the ring's device cursor.
extern "C" __global__ void __launch_bounds__(ddtree::kReadbackThreads)
    ddtree_readback(ddtree::ReadbackRing ring, ddtree::ReadbackSrc src) {
  ddtree::readback_round(ring, src);
}
