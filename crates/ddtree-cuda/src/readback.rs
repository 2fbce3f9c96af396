//! The readback ring (`kernels/include/ddtree/readback.cuh`): a kernel stores each
//! acceptance into the next slot of pinned host memory through its device mapping and
//! advances the ring's cursor in device memory, so replays of any graph that captured the
//! call write fresh slots. [`SlotLayout`] is the slot format both sides read, and
//! [`RingReader`] the host's reader (the Python ring turns the slot it copies into tensors).

use crate::device::{enter_device, Device};
use crate::{CudaError, Kernel, Params};

/// The ring as the kernel takes it (by value; layout asserted in readback.cuh).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadbackRing {
    /// Device address of the mapped pinned slots, `[nslots, slot_words]` int64.
    pub slots: u64,
    /// Device address of the cursor (uint64): readback writes issued so far.
    pub cursor: u64,
    pub slot_words: i64,
    pub nslots: i32,
}

/// The acceptance fields a readback copies (device addresses) and their shape.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadbackSrc {
    pub accept_len: u64,
    pub bonus: u64,
    pub accepted_tokens: u64,
    pub status: u64,
    pub bs: i32,
    pub path_len: i32,
}

/// Words of a slot's header: begin stamp, bs, path_len, one spare (`kReadbackHeader`).
pub const HEADER_WORDS: usize = 4;
const READBACK_THREADS: u32 = 256;

/// Where each field of a slot lies, in int64 words, for `bs` requests and paths of
/// `path_len`: what the kernel writes and the host reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotLayout {
    pub accept_len: usize,
    pub bonus: usize,
    pub accepted_tokens: usize,
    pub status: usize,
    /// One past the payload.
    pub end: usize,
}

impl SlotLayout {
    pub fn of(bs: usize, path_len: usize) -> Self {
        let accept_len = HEADER_WORDS;
        let bonus = accept_len + bs;
        let accepted_tokens = bonus + bs;
        let status = accepted_tokens + bs * path_len;
        Self {
            accept_len,
            bonus,
            accepted_tokens,
            status,
            end: status + bs,
        }
    }

    /// Words of a slot that holds any batch up to `max_batch`: the payload, then the end
    /// stamp in the last word.
    pub fn slot_words(max_batch: usize, path_len: usize) -> usize {
        Self::of(max_batch, path_len).end + 1
    }
}

/// The host's side of the ring: finds the newest whole slot without a sync or an event.
///
/// A slot is `[begin stamp, bs, path_len, spare, payload..., end stamp]`; the kernel writes
/// the begin stamp, then the payload, then the end stamp (each after a system fence). The
/// reader is a seqlock: it reads a slot's end stamp, copies the slot, then re-reads its begin
/// stamp; a slot rewritten meanwhile shows a newer begin stamp and is skipped, never
/// returned torn.
pub struct RingReader {
    /// Host address of the pinned slots, `[nslots, slot_words]` int64.
    host: *const i64,
    nslots: usize,
    slot_words: usize,
}

impl RingReader {
    /// # Safety
    /// `host` must address `nslots * slot_words` live int64 words (the pinned ring) for as
    /// long as the reader is used.
    pub unsafe fn new(host: *const i64, nslots: usize, slot_words: usize) -> Self {
        assert!(slot_words >= 2, "a slot holds at least its two stamps");
        Self {
            host,
            nslots,
            slot_words,
        }
    }

    fn word(&self, slot: usize, i: usize) -> i64 {
        // SAFETY: (`new`'s contract) `host` holds nslots * slot_words live words; the GPU
        // writes them concurrently, so every read is volatile.
        unsafe { std::ptr::read_volatile(self.host.add(slot * self.slot_words + i)) }
    }

    /// Copies the newest whole slot whose stamp is above `after` into `out` (slot_words
    /// words) and returns its stamp (round + 1), or None when there is none.
    pub fn newest(&self, after: i64, out: &mut [i64]) -> Option<i64> {
        let last = self.slot_words - 1;
        let mut order: Vec<(i64, usize)> =
            (0..self.nslots).map(|i| (self.word(i, last), i)).collect();
        order.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        for (stamp, i) in order {
            if stamp <= 0 || stamp <= after {
                return None;
            }
            std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
            for (w, o) in out.iter_mut().enumerate().take(self.slot_words) {
                *o = self.word(i, w);
            }
            std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
            if self.word(i, 0) == stamp && out[last] == stamp && out[0] == stamp {
                return Some(stamp);
            }
        }
        None
    }
}

/// The slot round `round` writes (the cursor's value when the kernel ran).
pub fn slot_of(round: u64, nslots: usize) -> usize {
    (round % nslots as u64) as usize
}

/// Writes the acceptance `src` into the ring's next slot and advances its cursor.
///
/// # Safety
/// `src`'s pointers address live device memory of its shape; `ring.slots` is the device
/// mapping of pinned memory of `nslots * slot_words` int64 words and `ring.cursor` a live
/// device uint64, on device `ordinal`; `src.bs`/`path_len` fit the slot.
pub unsafe fn readback(
    ordinal: usize,
    stream: u64,
    ring: ReadbackRing,
    src: ReadbackSrc,
) -> Result<(), CudaError> {
    let (dev, _ctx) = enter_device(ordinal)?;
    let k = readback_kernel(&dev, &ring, &src)?;
    let mut p = Params::new();
    p.arg(&ring).arg(&src);
    k.launch(stream, &mut p)
}

/// The readback's launch (its arguments: `ring`, then `src`), after checking that a slot
/// holds `src`.
pub(crate) fn readback_kernel(
    dev: &Device,
    ring: &ReadbackRing,
    src: &ReadbackSrc,
) -> Result<Kernel, CudaError> {
    let need = SlotLayout::of(src.bs as usize, src.path_len as usize).end + 1;
    if ring.nslots < 1 || (ring.slot_words as usize) < need {
        return Err(CudaError::arg(format!(
            "readback: a slot of {} words cannot hold bs={} x path {}",
            ring.slot_words, src.bs, src.path_len
        )));
    }
    Ok(Kernel {
        call: "cuLaunchKernel(readback)",
        f: dev.readback,
        grid: (1, 1, 1),
        block: READBACK_THREADS,
        smem: 0,
    })
}

/// The device address of pinned host memory at `host`, when the driver maps it into the
/// device's address space (pinned allocations are mapped under unified addressing), so
/// the readback kernel can store into it.
pub fn mapped_host_pointer(ordinal: usize, host: u64) -> Result<u64, CudaError> {
    let (_dev, _ctx) = enter_device(ordinal)?;
    let mut out: u64 = 0;
    // SAFETY: the attribute query writes one CUdeviceptr into `out`.
    let rc = unsafe {
        cudarc::driver::sys::cuPointerGetAttribute(
            (&mut out as *mut u64).cast(),
            cudarc::driver::sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_POINTER,
            host,
        )
    };
    rc.result()
        .map_err(|e| CudaError::driver("cuPointerGetAttribute(DEVICE_POINTER)", e))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ring the way the kernel leaves it: slot `round % nslots` holds round `round`.
    fn ring(nslots: usize, words: usize, rounds: &[i64]) -> Vec<i64> {
        let mut host = vec![0i64; nslots * words];
        for &r in rounds {
            let at = (r as usize % nslots) * words;
            host[at] = r + 1;
            for w in 1..words - 1 {
                host[at + w] = 100 * (r + 1) + w as i64;
            }
            host[at + words - 1] = r + 1;
        }
        host
    }

    fn reader(host: &[i64], nslots: usize, words: usize) -> RingReader {
        assert_eq!(host.len(), nslots * words);
        // SAFETY: `host` holds nslots * words words and outlives the reader in each test.
        unsafe { RingReader::new(host.as_ptr(), nslots, words) }
    }

    #[test]
    fn the_reader_returns_the_newest_round_once() {
        let host = ring(4, 8, &[0, 1, 2, 3, 4, 5]);
        let r = reader(&host, 4, 8);
        let mut out = vec![0; 8];
        assert_eq!(r.newest(0, &mut out), Some(6));
        assert_eq!(out[1], 601);
        assert_eq!(r.newest(6, &mut out), None); // returned already: nothing fresh
        assert_eq!(r.newest(0, &mut [0; 8]), Some(6)); // wait=True asks again
        assert_eq!(reader(&[0; 32], 4, 8).newest(0, &mut out), None); // nothing written
    }

    #[test]
    fn a_slot_being_rewritten_is_skipped_for_the_next_newest() {
        let mut host = ring(4, 8, &[2, 3, 4, 5]);
        // Round 6 has begun in slot 2 (begin stamp 7) while its old end stamp (3) remains;
        // round 5's slot is being rewritten too: its begin stamp moved on, its end did not.
        host[2 * 8] = 7;
        host[8] = 10;
        let mut out = vec![0; 8];
        assert_eq!(reader(&host, 4, 8).newest(0, &mut out), Some(5)); // round 4, whole
        assert_eq!(out[1], 501);
    }
}

#[cfg(test)]
mod layout_tests {
    use super::*;

    #[test]
    fn the_kernel_structs_have_the_header_layout() {
        // The same numbers as the static_asserts in readback.cuh, field by field, and the
        // header must state each.
        use std::mem::{offset_of, size_of};
        let header = include_str!("../../../kernels/include/ddtree/readback.cuh");
        for (line, got) in [
            (
                "sizeof(ReadbackRing) == 32",
                size_of::<ReadbackRing>() == 32,
            ),
            (
                "offsetof(ReadbackRing, cursor) == 8",
                offset_of!(ReadbackRing, cursor) == 8,
            ),
            (
                "offsetof(ReadbackRing, slot_words) == 16",
                offset_of!(ReadbackRing, slot_words) == 16,
            ),
            (
                "offsetof(ReadbackRing, nslots) == 24",
                offset_of!(ReadbackRing, nslots) == 24,
            ),
            ("sizeof(ReadbackSrc) == 40", size_of::<ReadbackSrc>() == 40),
            (
                "offsetof(ReadbackSrc, bonus) == 8",
                offset_of!(ReadbackSrc, bonus) == 8,
            ),
            (
                "offsetof(ReadbackSrc, accepted_tokens) == 16",
                offset_of!(ReadbackSrc, accepted_tokens) == 16,
            ),
            (
                "offsetof(ReadbackSrc, status) == 24",
                offset_of!(ReadbackSrc, status) == 24,
            ),
            (
                "offsetof(ReadbackSrc, bs) == 32",
                offset_of!(ReadbackSrc, bs) == 32,
            ),
            (
                "offsetof(ReadbackSrc, path_len) == 36",
                offset_of!(ReadbackSrc, path_len) == 36,
            ),
        ] {
            assert!(got, "Rust differs from `{line}`");
            assert!(header.contains(line), "readback.cuh lacks `{line}`");
        }
        assert!(header.contains(&format!("kReadbackHeader = {HEADER_WORDS};")));
    }

    #[test]
    fn slots_hold_fields_back_to_back_and_the_end_stamp_last() {
        let l = SlotLayout::of(3, 5);
        assert_eq!(
            (l.accept_len, l.bonus, l.accepted_tokens, l.status),
            (4, 7, 10, 25)
        );
        assert_eq!(l.end, 28);
        assert_eq!(SlotLayout::slot_words(3, 5), 29);
        // A smaller batch's payload ends before the largest one's end stamp.
        assert!(SlotLayout::of(1, 5).end < SlotLayout::slot_words(3, 5) - 1);
    }

    #[test]
    fn rounds_take_slots_in_turn() {
        let slots: Vec<usize> = (0..9).map(|r| slot_of(r, 4)).collect();
        assert_eq!(slots, [0, 1, 2, 3, 0, 1, 2, 3, 0]);
    }
}
