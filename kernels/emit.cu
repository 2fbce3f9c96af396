// Entry points of SPEC stage 3 (see include/ddtree/emit.cuh).
#include "ddtree/emit.cuh"

// One block per request.
extern "C" __global__ void __launch_bounds__(256)
    ddtree_emit(const long long* __restrict__ roots, const long long* __restrict__ prefix,
                int budget, const long long* __restrict__ depths,
                const long long* __restrict__ parents, long long* __restrict__ verify_ids,
                long long* __restrict__ positions, int* __restrict__ ancestor_bits) {
  __shared__ short s_parent[1024];
  const int b = blockIdx.x;
  const int q = budget + 1;
  const long long row = static_cast<long long>(b) * q;
  const int words = (q + 31) / 32;
  ddtree::emit_request(roots[b], prefix[b] < 0 ? 0 : prefix[b], q, depths + row, parents + row,
                       verify_ids + row, positions + row,
                       ancestor_bits + static_cast<long long>(b) * q * words, s_parent);
}

// grid (bs, Q): one block per mask row.
extern "C" __global__ void __launch_bounds__(256)
    ddtree_full_mask(const int* __restrict__ ancestor_bits, const long long* __restrict__ seq_lens,
                     int q, int write_prefix, long long out_len, bool* __restrict__ out) {
  ddtree::full_mask_row(ancestor_bits, seq_lens, blockIdx.x, blockIdx.y, q, write_prefix != 0,
                        out_len, out);
}
