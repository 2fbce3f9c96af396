// Entry points of SPEC stage 5 (see include/ddtree/commit.cuh).
#include "ddtree/commit.cuh"

// grid (bs): kept slots [bs, L+1] and the release mask [bs, Q].
extern "C" __global__ void __launch_bounds__(256)
    ddtree_kept_slots(const long long* window, const long long* nodes, int q, int path_len,
                      long long* kept, bool* release) {
  const int b = blockIdx.x;
  ddtree::kept_slots_request(window + static_cast<long long>(b) * q,
                             nodes + static_cast<long long>(b) * path_len, q, path_len,
                             kept + static_cast<long long>(b) * path_len,
                             release + static_cast<long long>(b) * q);
}

// grid (bs, buffers, chunks): every buffer is [slots, row_bytes] (a layer's K, V or MLA
// latent cache); `buffers` is a device table of their base addresses.
extern "C" __global__ void __launch_bounds__(256)
    ddtree_compact_kv(char* const* buffers, long long row_bytes, const long long* window,
                      const long long* nodes, int q, int path_len) {
  __shared__ __align__(16) char stage[ddtree::kMaxPath * ddtree::kCompactChunk];
  const int b = blockIdx.x;
  ddtree::compact_chunk(buffers[blockIdx.y], row_bytes,
                        static_cast<long long>(blockIdx.z) * ddtree::kCompactChunk,
                        window + static_cast<long long>(b) * q,
                        nodes + static_cast<long long>(b) * path_len, path_len, stage);
}

// grid (bs, L+1): row i of request b's output = hidden row b*Q + nodes[i] (zeros past the
// path). Rows are row_bytes long; hidden is [bs*Q, row_bytes], out [bs, L+1, row_bytes].
extern "C" __global__ void __launch_bounds__(256)
    ddtree_gather_hidden(const char* hidden, long long row_bytes, const long long* nodes, int q,
                         int path_len, char* out) {
  const int b = blockIdx.x, i = blockIdx.y;
  const long long node = nodes[static_cast<long long>(b) * path_len + i];
  char* dst = out + (static_cast<long long>(b) * path_len + i) * row_bytes;
  if (node < 0) {
    for (long long c = threadIdx.x; c < row_bytes; c += blockDim.x) dst[c] = 0;
    return;
  }
  const char* src = hidden + (static_cast<long long>(b) * q + node) * row_bytes;
  ddtree::block_copy(dst, src, row_bytes);
}

// The readback: n int64 words from the acceptance buffer to pinned host memory mapped into
// the device's address space, stored by the SMs over the bus. A copy-engine memcpy would
// cost the stream a switch to the copy engine and back (~8 µs each way on the H200).
extern "C" __global__ void __launch_bounds__(256)
    ddtree_readback(const long long* src, long long* host_dst, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    host_dst[i] = src[i];
}
