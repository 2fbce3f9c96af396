// Entry points of SPEC stage 3 (see include/ddtree/emit.cuh).
#include "ddtree/emit.cuh"
#include "ddtree/params.h"

// emit_parts(Q) blocks per request.
extern "C" __global__ void __launch_bounds__(256)
    ddtree_emit(const __grid_constant__ ddtree::BuildParams p) {
  __shared__ short s_parent[1024];
  const int q = p.budget + 1;
  const int parts = ddtree::emit_parts(q);
  const int b = blockIdx.x / parts, part = blockIdx.x % parts;
  const long long row = static_cast<long long>(b) * q;
  const int words = (q + 31) / 32;
  const ddtree::TreePtrs& t = p.out;
  ddtree::emit_request(p.roots[b], p.prefix[b] < 0 ? 0 : p.prefix[b], q, part, t.depths + row,
                       t.parents + row, t.verify_ids + row, t.positions + row,
                       t.ancestor_bits + static_cast<long long>(b) * q * words, s_parent);
}

// grid (bs, Q): one block per mask row.
extern "C" __global__ void __launch_bounds__(256)
    ddtree_full_mask(const __grid_constant__ ddtree::MaskParams p) {
  ddtree::full_mask_row(p.ancestor_bits, p.seq_lens, blockIdx.x, blockIdx.y, p.q,
                        p.write_prefix != 0, p.out_len, p.out);
}
