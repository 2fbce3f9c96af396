//! SPEC stage 5 — commit: which verify-window KV slots survive the round.

/// Kept slots in path order (`-1` padded) and the release mask of one request.
///
/// `window_slots[i]` is the KV slot the verify pass wrote for node `i` (SGLang's
/// `out_cache_loc`); `accepted_nodes` is the walk's path, `-1` padded.
pub fn kept_slots(
    window_slots: &[i64],
    accepted_nodes: &[i64],
    kept: &mut [i64],
    release: &mut [bool],
) {
    kept.fill(-1);
    release.fill(true);
    for (p, &node) in accepted_nodes.iter().take_while(|&&n| n >= 0).enumerate() {
        kept[p] = window_slots[node as usize];
        release[node as usize] = false;
    }
}
