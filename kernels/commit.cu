// Entry points of SPEC stage 5 (see include/ddtree/commit.cuh).
#include "ddtree/commit.cuh"
#include "ddtree/params.h"
#include "ddtree/readback.cuh"

// grid (bs): kept slots [bs, L+1] and the release mask [bs, Q]; `slots` < 0: slot ids
// unchecked (they are copied, not dereferenced). Status codes into `status` [bs].
extern "C" __global__ void __launch_bounds__(256)
    ddtree_kept_slots(const __grid_constant__ ddtree::CommitParams a) {
  const int b = blockIdx.x;
  const ddtree::Path p{a.nodes + static_cast<long long>(b) * a.path_len, a.path_len, a.q};
  const int code = ddtree::kept_slots_request(
      a.window + static_cast<long long>(b) * a.q, p, a.slots,
      a.kept + static_cast<long long>(b) * a.path_len, a.release + static_cast<long long>(b) * a.q);
  if (threadIdx.x == 0) ddtree::record_status(a.status + b, code);
}

// grid (bs, buffers, chunks): every buffer is [slots, row_bytes] (a layer's K, V or MLA
// latent cache; `slots` is the smallest row count among them); `buffers` is a device table
// of their base addresses. A request with a bad index moves nothing.
extern "C" __global__ void __launch_bounds__(256)
    ddtree_compact_kv(const __grid_constant__ ddtree::CommitParams a) {
  __shared__ __align__(16) char stage[ddtree::kMaxPath * ddtree::kCompactChunk];
  const int b = blockIdx.x;
  const ddtree::Path p{a.nodes + static_cast<long long>(b) * a.path_len, a.path_len, a.q};
  const int code = ddtree::compact_chunk(
      a.buffers[blockIdx.y], a.row_bytes, a.slots,
      static_cast<long long>(blockIdx.z) * ddtree::kCompactChunk,
      a.window + static_cast<long long>(b) * a.q, p, stage);
  if (threadIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0) ddtree::record_status(a.status + b, code);
}

// grid (bs, L+1): row i of request b's output = hidden row b*Q + nodes[i] (zeros past the
// path). Rows are row_bytes long; hidden is [bs*Q, row_bytes], out [bs, L+1, row_bytes]. A
// request with a node outside [0, Q) keeps its output rows as they were.
extern "C" __global__ void __launch_bounds__(256)
    ddtree_gather_hidden(const __grid_constant__ ddtree::CommitParams a) {
  const int b = blockIdx.x, i = blockIdx.y;
  const ddtree::Path p{a.nodes + static_cast<long long>(b) * a.path_len, a.path_len, a.q};
  const int code = ddtree::check_nodes(p);
  if (code != ddtree::kStatusOk) {
    if (threadIdx.x == 0 && i == 0) ddtree::record_status(a.status + b, code);
    return;
  }
  const long long node = p.nodes[i];
  const long long row_bytes = a.row_bytes;
  char* dst = a.out + (static_cast<long long>(b) * a.path_len + i) * row_bytes;
  if (node < 0) {
    for (long long c = threadIdx.x; c < row_bytes; c += blockDim.x) dst[c] = 0;
    return;
  }
  const char* src = a.hidden + (static_cast<long long>(b) * a.q + node) * row_bytes;
  ddtree::block_copy(dst, src, row_bytes);
}

// The readback (include/ddtree/readback.cuh): one block writes the acceptance into the next
// slot of the pinned ring and advances the ring's device cursor.
extern "C" __global__ void __launch_bounds__(ddtree::kReadbackThreads)
    ddtree_readback(ddtree::ReadbackRing ring, ddtree::ReadbackSrc src) {
  ddtree::readback_round(ring, src);
}
