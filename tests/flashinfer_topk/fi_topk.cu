// A C entry point to flashinfer's radix top-k (`sampling::TopKDispatch`, the kernel
// `flashinfer.top_k` runs for UNO's call), so the benchmark can time UNO with its own top-k
// on a GPU machine that has neither flashinfer nor a compiler. Built by build.sh from the
// headers of the flashinfer-python wheel SGLang 0.5.23 pins; nothing of flashinfer is kept
// in this repository.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <flashinfer/math.cuh>  // topk.cuh uses math:: without including it
#include <flashinfer/topk.cuh>

namespace {

template <typename T>
int dispatch(void* input, int* indices, void* values, unsigned rows, unsigned k, unsigned d,
             void* row_states, bool sorted, bool deterministic, cudaStream_t stream) {
  using flashinfer::sampling::RadixRowState;
  using flashinfer::sampling::TopKTieBreak;
  return static_cast<int>(flashinfer::sampling::TopKDispatch<T, int>(
      static_cast<T*>(input), indices, static_cast<T*>(values), rows, k, d,
      static_cast<RadixRowState*>(row_states), sorted, deterministic, TopKTieBreak::None,
      stream, /*dsa_graph_safe=*/false));
}

}  // namespace

// dtype: 0 fp32, 1 fp16, 2 bf16. Returns the cudaError_t (0 = success); -1 for a bad dtype.
extern "C" int ddtree_fi_radix_topk(int dtype, void* input, int* indices, void* values,
                                    unsigned rows, unsigned k, unsigned d, void* row_states,
                                    int sorted, int deterministic, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case 0:
      return dispatch<float>(input, indices, values, rows, k, d, row_states, sorted,
                             deterministic, s);
    case 1:
      return dispatch<__half>(input, indices, values, rows, k, d, row_states, sorted,
                              deterministic, s);
    case 2:
      return dispatch<__nv_bfloat16>(input, indices, values, rows, k, d, row_states, sorted,
                                     deterministic, s);
    default:
      return -1;
  }
}
