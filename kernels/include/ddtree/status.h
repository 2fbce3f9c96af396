// Per-request status codes, the same values as crates/ddtree-core/src/status.rs (whose
// tests check this file): a kernel that finds a bad value for one request writes its code
// and the stage's empty result for that request, and the rest of the batch runs normally.
#pragma once

namespace ddtree {

constexpr int kStatusOk = 0;
constexpr int kStatusNonFinite = 1;       // build: NaN/+inf draft logits
constexpr int kStatusRootOutOfVocab = 2;  // build: root token outside [0, V)
constexpr int kStatusNegativePrefix = 3;  // build: prefix length < 0
constexpr int kStatusBadTreeLink = 4;     // accept: a link outside [-1, Q), or a backward walk
constexpr int kStatusNodeOutOfRange = 5;  // commit: an accepted node outside [0, Q)
constexpr int kStatusSlotOutOfRange = 6;  // commit: a KV slot outside the caches

}  // namespace ddtree
