//! The readback ring (`kernels/include/ddtree/readback.cuh`): a kernel stores each
//! acceptance into the next slot of pinned host memory through its device mapping and
//! advances the ring's cursor in device memory, so replays of any graph that captured the
//! call write fresh slots. [`SlotLayout`] is the slot format both sides read; the host's
//! reader lives with the Stepper (Python), which only needs the layout's word offsets.

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

    #[test]
    fn the_kernel_structs_have_the_header_layout() {
        // The same numbers as the static_asserts in readback.cuh.
        assert_eq!(std::mem::size_of::<ReadbackRing>(), 32);
        assert_eq!(std::mem::offset_of!(ReadbackRing, slot_words), 16);
        assert_eq!(std::mem::offset_of!(ReadbackRing, nslots), 24);
        assert_eq!(std::mem::size_of::<ReadbackSrc>(), 40);
        assert_eq!(std::mem::offset_of!(ReadbackSrc, status), 24);
        assert_eq!(std::mem::offset_of!(ReadbackSrc, path_len), 36);
        let header = include_str!("../../../kernels/include/ddtree/readback.cuh");
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
