// The kernels' ABI: one parameter struct per stage group, passed by value
// (`__grid_constant__`), so each argument list is written once here and once in its
// #[repr(C)] Rust twin (crates/ddtree-cuda/src/params.rs). The static_asserts below and
// that crate's tests hold the same sizes and offsets, so the two cannot drift apart
// silently. Pointers are 8 bytes; every struct is padded to a multiple of 8.
#pragma once
#include <cstddef>

namespace ddtree {

// SPEC stages 1–3 (candidates.cu, select.cu, emit.cu): the draft logits and the tree's
// outputs. One struct for the three launches of a build.
struct BuildParams {
  const void* logits;  // [bs, L, V] of the kernel's dtype, strides s0, s1, s2 (elements)
  long long s0, s1, s2;
  const long long* roots;   // [bs]
  const long long* prefix;  // [bs]
  float* topk_logprobs;     // [bs, L, K]
  long long* topk_ids;      // [bs, L, K]
  int* eligible;            // [bs * L] scratch
  int* bad;                 // [bs * L] scratch
  long long* verify_ids;    // [bs, Q] (as the six below)
  long long* positions;
  long long* depths;
  long long* parents;
  long long* first_child;
  long long* next_sibling;
  double* scores;
  int* ancestor_bits;    // [bs, Q, ceil(Q/32)]
  long long* num_nodes;  // [bs]
  int* status;           // [bs]
  long long* stats;      // [bs, 16] selection diagnostics, or null
  int L, V, K, budget;
  int cache_lp;    // the best-first fallback caches the log-probs in shared memory
  int best_first;  // force the best-first selection (benchmarks, tests)
};
static_assert(sizeof(BuildParams) == 192 && offsetof(BuildParams, roots) == 32 &&
                  offsetof(BuildParams, stats) == 160 && offsetof(BuildParams, L) == 168 &&
                  offsetof(BuildParams, best_first) == 188,
              "BuildParams layout");

// SPEC stage 4 (accept.cu): the walk and the generator's advance.
struct AcceptParams {
  const void* logits;  // [bs, Q, V], strides s0, s1, s2 (elements)
  long long s0, s1, s2;
  const long long* verify_ids;    // [bs, Q]
  const long long* first_child;   // [bs, Q]
  const long long* next_sibling;  // [bs, Q]
  long long* accepted_nodes;      // [bs, L+1]
  long long* accepted_tokens;     // [bs, L+1]
  long long* accept_index;        // [bs, L+1]
  long long* accept_len;          // [bs]
  long long* bonus;               // [bs]
  int* status;                    // [bs]
  const float* temperature;       // [bs], or null: a greedy batch (and the three below)
  const int* top_k;
  const float* top_p;
  long long* rng;  // [2]: seed, offset
  int V, q, path_len;
  int cache_slice;  // each block keeps its row slice in dynamic shared memory
};
static_assert(sizeof(AcceptParams) == 152 && offsetof(AcceptParams, verify_ids) == 32 &&
                  offsetof(AcceptParams, rng) == 128 && offsetof(AcceptParams, V) == 136 &&
                  offsetof(AcceptParams, cache_slice) == 148,
              "AcceptParams layout");

// SPEC stage 5 (commit.cu): the accepted paths, the verify window and each kernel's
// buffers (kept_slots: kept/release; compact_kv: buffers; gather_hidden: hidden/out).
struct CommitParams {
  const long long* nodes;   // [bs, L+1] accepted nodes, -1 padded
  int* status;              // [bs]: a bad index's code, first code wins
  const long long* window;  // [bs, Q] slots (kept_slots, compact_kv)
  long long* kept;          // [bs, L+1]
  bool* release;            // [bs, Q]
  char* const* buffers;     // device table of cache base addresses (compact_kv)
  const char* hidden;       // [bs*Q, row_bytes] (gather_hidden)
  char* out;                // [bs, L+1, row_bytes] (gather_hidden)
  long long row_bytes;
  long long slots;  // rows of the smallest cache; < 0: slots unchecked (kept_slots)
  int q, path_len;
};
static_assert(sizeof(CommitParams) == 88 && offsetof(CommitParams, row_bytes) == 64 &&
                  offsetof(CommitParams, q) == 80,
              "CommitParams layout");

// SGLang's FULL mask (emit.cu).
struct MaskParams {
  const int* ancestor_bits;   // [bs, Q, ceil(Q/32)]
  const long long* seq_lens;  // [bs]
  bool* out;
  long long out_len;
  int q;
  int write_prefix;
};
static_assert(sizeof(MaskParams) == 40 && offsetof(MaskParams, q) == 32, "MaskParams layout");

}  // namespace ddtree
