//! Reads the table of contents of an nvcc fatbin: which machine code and PTX it holds.

/// One image inside a fatbin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Image {
    /// `true` for PTX (JIT-compiled by the driver), `false` for machine code (cubin).
    pub ptx: bool,
    /// Compute capability as `major * 10 + minor` (90 = sm_90, 120 = sm_120).
    pub arch: u32,
}

const MAGIC: u32 = 0xBA55_ED50;

/// Little-endian integers at a byte offset (also cubin.rs's ELF reader's).
pub(crate) fn u16_at(d: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(d.get(at..at + 2)?.try_into().ok()?))
}
pub(crate) fn u32_at(d: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(d.get(at..at + 4)?.try_into().ok()?))
}
pub(crate) fn u64_at(d: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(d.get(at..at + 8)?.try_into().ok()?))
}

/// Every image of a fatbin (header: magic, version, header size, body size; each entry:
/// kind 1 = PTX / 2 = ELF, header size, payload size, and the architecture at byte 28).
/// `None` if `data` is not a well-formed fatbin.
pub fn images(data: &[u8]) -> Option<Vec<Image>> {
    Some(entries(data)?.into_iter().map(|(i, _)| i).collect())
}

/// The machine code (an uncompressed ELF cubin, as nvcc 13.0 writes it) for `arch`, if the
/// fatbin holds one.
pub fn machine_code(data: &[u8], arch: u32) -> Option<&[u8]> {
    entries(data)?
        .into_iter()
        .find(|(i, _)| !i.ptx && i.arch == arch)
        .map(|(_, payload)| payload)
}

/// Every image with its payload.
fn entries(data: &[u8]) -> Option<Vec<(Image, &[u8])>> {
    if u32_at(data, 0)? != MAGIC {
        return None;
    }
    let header = u16_at(data, 6)? as usize;
    let end = header.checked_add(u64_at(data, 8)? as usize)?;
    if end > data.len() {
        return None;
    }
    let mut out = Vec::new();
    let mut at = header;
    while at < end {
        let kind = u16_at(data, at)?;
        let entry_header = u32_at(data, at + 4)? as usize;
        let payload = u64_at(data, at + 8)? as usize;
        let arch = u32_at(data, at + 28)?;
        if entry_header == 0 {
            return None;
        }
        let start = at.checked_add(entry_header)?;
        let body = data.get(start..start.checked_add(payload)?)?;
        match kind {
            1 => out.push((Image { ptx: true, arch }, body)),
            2 => out.push((Image { ptx: false, arch }, body)),
            _ => {}
        }
        at = start + payload;
    }
    Some(out)
}

/// Whether a device of compute capability `cc` can run something in `imgs`: machine code
/// of the same major version and no newer minor, or PTX no newer than the device.
pub fn runs_on(imgs: &[Image], cc: u32) -> bool {
    imgs.iter().any(|i| {
        if i.ptx {
            i.arch <= cc
        } else {
            i.arch / 10 == cc / 10 && i.arch <= cc
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(kind: u16, arch: u32, payload: usize) -> Vec<u8> {
        let mut e = vec![0u8; 64];
        e[0..2].copy_from_slice(&kind.to_le_bytes());
        e[4..8].copy_from_slice(&64u32.to_le_bytes());
        e[8..16].copy_from_slice(&(payload as u64).to_le_bytes());
        e[28..32].copy_from_slice(&arch.to_le_bytes());
        e.extend(std::iter::repeat_n(0xAB, payload));
        e
    }

    fn fatbin(entries: &[Vec<u8>]) -> Vec<u8> {
        let body: Vec<u8> = entries.concat();
        let mut d = MAGIC.to_le_bytes().to_vec();
        d.extend(1u16.to_le_bytes());
        d.extend(16u16.to_le_bytes());
        d.extend((body.len() as u64).to_le_bytes());
        d.extend(body);
        d
    }

    #[test]
    fn lists_machine_code_and_ptx() {
        let d = fatbin(&[
            entry(2, 90, 10),
            entry(1, 90, 3),
            entry(2, 120, 7),
            entry(1, 120, 0),
        ]);
        let imgs = images(&d).unwrap();
        assert_eq!(
            imgs,
            vec![
                Image {
                    ptx: false,
                    arch: 90
                },
                Image {
                    ptx: true,
                    arch: 90
                },
                Image {
                    ptx: false,
                    arch: 120
                },
                Image {
                    ptx: true,
                    arch: 120
                },
            ]
        );
        assert!(runs_on(&imgs, 90) && runs_on(&imgs, 120) && runs_on(&imgs, 121));
        assert!(!runs_on(&imgs, 80), "no image for an older device");
    }

    #[test]
    fn finds_an_architectures_machine_code() {
        let d = fatbin(&[entry(2, 90, 10), entry(1, 120, 3), entry(2, 120, 7)]);
        assert_eq!(machine_code(&d, 120).map(<[u8]>::len), Some(7));
        assert_eq!(machine_code(&d, 90).map(<[u8]>::len), Some(10));
        assert_eq!(machine_code(&d, 100), None, "PTX is not machine code");
    }

    #[test]
    fn rejects_garbage_and_truncation() {
        assert_eq!(images(b"not a fatbin at all"), None);
        let mut d = fatbin(&[entry(2, 90, 10)]);
        d.truncate(d.len() - 1);
        assert_eq!(images(&d), None);
    }

    #[test]
    fn ptx_only_runs_on_newer_devices() {
        let imgs = [Image {
            ptx: true,
            arch: 90,
        }];
        assert!(runs_on(&imgs, 100) && !runs_on(&imgs, 89));
        let sass = [Image {
            ptx: false,
            arch: 90,
        }];
        assert!(
            !runs_on(&sass, 100),
            "sm_90 machine code does not run on sm_100"
        );
    }
}
