// The kernels' ABI: one parameter struct per stage group, passed by value
// (`__grid_constant__`), so each argument list is written once here and once in its
// #[repr(C)] Rust twin (crates/ddtree-cuda/src/params.rs). The static_asserts below and
// that crate's tests hold the same sizes and offsets, so the two cannot drift apart
// silently. Pointers are 8 bytes; every struct is padded to a multiple of 8.
#pragma once
#include <cstddef>

namespace ddtree {

// The pointer groups the structs below nest; each is one Rust struct too (TreePtrs,
// Scratch, WalkTree, AcceptPtrs, Sampling), so a group's field list is written once per
// language and every field's offset is asserted.

// A Tree's outputs: [bs, Q] each unless noted.
struct TreePtrs {
  long long* verify_ids;
  long long* positions;
  long long* depths;
  long long* parents;
  long long* first_child;
  long long* next_sibling;
  int* ancestor_bits;      // [bs, Q, ceil(Q/32)]
  double* scores;
  long long* num_nodes;    // [bs]
  float* topk_logprobs;    // [bs, L, K]
  long long* topk_ids;     // [bs, L, K]
  int* status;             // [bs]
};
static_assert(sizeof(TreePtrs) == 96 && offsetof(TreePtrs, positions) == 8 &&
                  offsetof(TreePtrs, depths) == 16 && offsetof(TreePtrs, parents) == 24 &&
                  offsetof(TreePtrs, first_child) == 32 && offsetof(TreePtrs, next_sibling) == 40 &&
                  offsetof(TreePtrs, ancestor_bits) == 48 && offsetof(TreePtrs, scores) == 56 &&
                  offsetof(TreePtrs, num_nodes) == 64 && offsetof(TreePtrs, topk_logprobs) == 72 &&
                  offsetof(TreePtrs, topk_ids) == 80 && offsetof(TreePtrs, status) == 88,
              "TreePtrs layout");

// Diagnostic slots a request's selection writes (select_parallel.cuh's kStatSlots). The
// stage-1 diagnostics build (DDTREE_STAGE1_CLOCKS) puts each row's kPhaseSlots after them.
constexpr int kSelectStatSlots = 16;

// A build's scratch: [bs * L] each, and the selection's diagnostics [bs, 16] or null.
struct Scratch {
  int* eligible;
  int* bad;
  long long* stats;
};
static_assert(sizeof(Scratch) == 24 && offsetof(Scratch, bad) == 8 &&
                  offsetof(Scratch, stats) == 16,
              "Scratch layout");

// The links an accept walks: [bs, Q] each.
struct WalkTree {
  const long long* verify_ids;
  const long long* first_child;
  const long long* next_sibling;
};
static_assert(sizeof(WalkTree) == 24 && offsetof(WalkTree, first_child) == 8 &&
                  offsetof(WalkTree, next_sibling) == 16,
              "WalkTree layout");

// An accept's outputs: [bs, L+1] paths, [bs] scalars.
struct AcceptPtrs {
  long long* accepted_nodes;
  long long* accepted_tokens;
  long long* accept_index;
  long long* accept_len;
  long long* bonus;
  int* status;
};
static_assert(sizeof(AcceptPtrs) == 48 && offsetof(AcceptPtrs, accepted_tokens) == 8 &&
                  offsetof(AcceptPtrs, accept_index) == 16 && offsetof(AcceptPtrs, accept_len) == 24 &&
                  offsetof(AcceptPtrs, bonus) == 32 && offsetof(AcceptPtrs, status) == 40,
              "AcceptPtrs layout");

// Per-request sampling parameters [bs] and the generator [2] (seed, offset); all null for
// a greedy batch.
struct Sampling {
  float* temperature;  // <= 0: greedy
  int* top_k;          // <= 0 or >= V: off
  float* top_p;        // >= 1: off
  long long* rng;      // advanced after every sampling accept
};
static_assert(sizeof(Sampling) == 32 && offsetof(Sampling, top_k) == 8 &&
                  offsetof(Sampling, top_p) == 16 && offsetof(Sampling, rng) == 24,
              "Sampling layout");

// SPEC stages 1–3 (candidates.cu, select.cu, emit.cu): the draft logits and the tree's
// outputs. One struct for the three launches of a build.
struct BuildParams {
  const void* logits;  // [bs, L, V] of the kernel's dtype, strides s0, s1, s2 (elements)
  long long s0, s1, s2;
  const long long* roots;   // [bs]
  const long long* prefix;  // [bs]
  TreePtrs out;
  Scratch scratch;
  int L, V, K, budget;
  int cache_lp;    // the best-first fallback caches the log-probs in shared memory
  int best_first;  // the best-first selection (small budgets; forced by benchmarks, tests)
};
static_assert(sizeof(BuildParams) == 192 && offsetof(BuildParams, logits) == 0 &&
              offsetof(BuildParams, s0) == 8 && offsetof(BuildParams, s1) == 16 &&
              offsetof(BuildParams, s2) == 24 && offsetof(BuildParams, roots) == 32 &&
              offsetof(BuildParams, prefix) == 40 && offsetof(BuildParams, out) == 48 &&
              offsetof(BuildParams, scratch) == 144 && offsetof(BuildParams, L) == 168 &&
              offsetof(BuildParams, V) == 172 && offsetof(BuildParams, K) == 176 &&
              offsetof(BuildParams, budget) == 180 && offsetof(BuildParams, cache_lp) == 184 &&
              offsetof(BuildParams, best_first) == 188,
              "BuildParams layout");

// SPEC stage 1 as partials (partials.cuh, entry points in candidates.cu): a part list per
// (row, part); `parts` lists a row in the part arrays, this launch's at `part_base`.
struct PartialParams {
  const void* logits;  // [bs, L, V] (a shard's V), strides s0, s1, s2 (elements)
  long long s0, s1, s2;
  int L, V;
  int K;          // each list's length
  int chunk;      // tokens per part of this launch's logits
  int parts;      // part lists per row in the arrays below (every shard's)
  int part_base;  // this launch's first part of a row
  long long id0;  // global id of this launch's token 0 (a shard's first token)
  float* values;               // [rows, parts, K]
  long long* ids;              // [rows, parts, K]
  float* maxima;               // [rows, parts]
  int* bad;                    // [rows, parts]
  unsigned long long* sums;    // [rows, parts, 2] (low, high)
  float* lp;                   // merge: [rows, K]
  long long* ti;               // merge: [rows, K]
  int* eligible;               // merge: [rows]
  int* row_bad;                // merge: [rows]
};
static_assert(sizeof(PartialParams) == 136 && offsetof(PartialParams, L) == 32 &&
                  offsetof(PartialParams, V) == 36 && offsetof(PartialParams, K) == 40 &&
                  offsetof(PartialParams, chunk) == 44 && offsetof(PartialParams, parts) == 48 &&
                  offsetof(PartialParams, part_base) == 52 && offsetof(PartialParams, id0) == 56 &&
                  offsetof(PartialParams, values) == 64 && offsetof(PartialParams, ids) == 72 &&
                  offsetof(PartialParams, maxima) == 80 && offsetof(PartialParams, bad) == 88 &&
                  offsetof(PartialParams, sums) == 96 && offsetof(PartialParams, lp) == 104 &&
                  offsetof(PartialParams, ti) == 112 && offsetof(PartialParams, eligible) == 120 &&
                  offsetof(PartialParams, row_bad) == 128,
              "PartialParams layout");

// SPEC stage 4 (accept.cu): the walk and the generator's advance.
struct AcceptParams {
  const void* logits;  // [bs, Q, V], strides s0, s1, s2 (elements)
  long long s0, s1, s2;
  WalkTree tree;
  AcceptPtrs out;
  Sampling sampling;
  int V, q, path_len;
  int flags;  // kAcceptCacheSlice | kAcceptExhaustive
};
// AcceptParams::flags: each block keeps its row slice in dynamic shared memory; a draw takes
// sample_row's passes instead of the shortlist's (DDTREE_SAMPLING=exhaustive).
constexpr int kAcceptCacheSlice = 1;
constexpr int kAcceptExhaustive = 2;
static_assert(sizeof(AcceptParams) == 152 && offsetof(AcceptParams, logits) == 0 &&
              offsetof(AcceptParams, s0) == 8 && offsetof(AcceptParams, s1) == 16 &&
              offsetof(AcceptParams, s2) == 24 && offsetof(AcceptParams, tree) == 32 &&
              offsetof(AcceptParams, out) == 56 && offsetof(AcceptParams, sampling) == 104 &&
              offsetof(AcceptParams, V) == 136 && offsetof(AcceptParams, q) == 140 &&
              offsetof(AcceptParams, path_len) == 144 &&
              offsetof(AcceptParams, flags) == 148,
              "AcceptParams layout");

// SPEC stage 4 over a vocabulary shard (accept_shard.cuh, entry points in accept.cu):
// every node's posterior as order keys over this rank's tokens, which the ranks gather.
struct ShardKeyParams {
  const void* logits;  // this rank's shard [bs, Q, V_r], strides s0, s1, s2 (elements)
  long long s0, s1, s2;
  Sampling sampling;            // temperature and rng read (null temperature: greedy batch)
  unsigned long long* greedy;   // [bs, Q]: the shard's argmax key, 0 if none
  unsigned long long* sampled;  // [bs, Q]: the shard's best draw key, 0 if none or greedy
  long long id0;                // global id of the shard's token 0
  int V, q, bs, reserved;       // V: the shard's tokens
};
static_assert(sizeof(ShardKeyParams) == 104 && offsetof(ShardKeyParams, s0) == 8 &&
              offsetof(ShardKeyParams, sampling) == 32 && offsetof(ShardKeyParams, greedy) == 64 &&
              offsetof(ShardKeyParams, sampled) == 72 && offsetof(ShardKeyParams, id0) == 80 &&
              offsetof(ShardKeyParams, V) == 88 && offsetof(ShardKeyParams, q) == 92 &&
              offsetof(ShardKeyParams, bs) == 96,
              "ShardKeyParams layout");

// The walk along every rank's keys ([tp, bs, Q] each, gathered in rank order).
struct KeyWalkParams {
  const unsigned long long* greedy;
  const unsigned long long* sampled;
  const float* temperature;  // [bs], or null: a greedy batch
  WalkTree tree;
  AcceptPtrs out;
  int tp, q, path_len, bs;
};
static_assert(sizeof(KeyWalkParams) == 112 && offsetof(KeyWalkParams, temperature) == 16 &&
              offsetof(KeyWalkParams, tree) == 24 && offsetof(KeyWalkParams, out) == 48 &&
              offsetof(KeyWalkParams, tp) == 96 && offsetof(KeyWalkParams, q) == 100 &&
              offsetof(KeyWalkParams, path_len) == 104 && offsetof(KeyWalkParams, bs) == 108,
              "KeyWalkParams layout");

// Where a SamplingLoad takes one per-request parameter from: a scalar for every request
// (ptr null), or element i * stride of a [bs] device tensor of dtype `dtype`, converted as
// torch's copy_ would (top_k clamped to the int32 range, where a copy would wrap).
enum ParamDtype : int {
  kParamF32 = 0,
  kParamF64 = 1,
  kParamF16 = 2,
  kParamBf16 = 3,
  kParamI32 = 4,
  kParamI64 = 5,
};
struct ParamSource {
  const void* ptr;
  long long stride;  // elements
  double scalar;     // the value of every request when ptr is null
  int dtype;         // ParamDtype
  int pad;
};
static_assert(sizeof(ParamSource) == 32 && offsetof(ParamSource, ptr) == 0 &&
              offsetof(ParamSource, stride) == 8 && offsetof(ParamSource, scalar) == 16 &&
              offsetof(ParamSource, dtype) == 24 && offsetof(ParamSource, pad) == 28,
              "ParamSource layout");

// The Stepper's eager sampled accept (accept.cu's ddtree_load_sampling, the first node of
// its graph): the per-request parameters (scalars or the caller's tensors) written for `bs`
// requests and/or the generator restarted, in one launch.
struct SamplingLoad {
  Sampling to;
  ParamSource from[3];  // temperature, top_k, top_p
  long long seed;
  int bs;      // requests to fill; 0: leave the parameters as they are
  int reseed;  // nonzero: rng = (seed, 0)
};
static_assert(sizeof(SamplingLoad) == 144 && offsetof(SamplingLoad, to) == 0 &&
              offsetof(SamplingLoad, from) == 32 && offsetof(SamplingLoad, seed) == 128 &&
              offsetof(SamplingLoad, bs) == 136 && offsetof(SamplingLoad, reseed) == 140,
              "SamplingLoad layout");

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
static_assert(sizeof(CommitParams) == 88 && offsetof(CommitParams, nodes) == 0 &&
              offsetof(CommitParams, status) == 8 && offsetof(CommitParams, window) == 16 &&
              offsetof(CommitParams, kept) == 24 && offsetof(CommitParams, release) == 32 &&
              offsetof(CommitParams, buffers) == 40 && offsetof(CommitParams, hidden) == 48 &&
              offsetof(CommitParams, out) == 56 && offsetof(CommitParams, row_bytes) == 64 &&
              offsetof(CommitParams, slots) == 72 && offsetof(CommitParams, q) == 80 &&
              offsetof(CommitParams, path_len) == 84,
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
static_assert(sizeof(MaskParams) == 40 && offsetof(MaskParams, ancestor_bits) == 0 &&
              offsetof(MaskParams, seq_lens) == 8 && offsetof(MaskParams, out) == 16 &&
              offsetof(MaskParams, out_len) == 24 && offsetof(MaskParams, q) == 32 &&
              offsetof(MaskParams, write_prefix) == 36,
              "MaskParams layout");

}  // namespace ddtree
