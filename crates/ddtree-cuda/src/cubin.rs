//! Reads what each kernel of a cubin (the ELF machine code inside a fatbin) asks of an SM:
//! registers, threads, local-memory frame and static shared memory, so that a test can check
//! an architecture's limits on code no GPU here runs (sm_120's, on the build machine).

/// One kernel's resources, as ptxas wrote them into the cubin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelResources {
    pub name: String,
    /// Registers per thread (EIATTR_REGCOUNT).
    pub registers: u32,
    /// Threads per block the kernel was compiled for (`__launch_bounds__`, EIATTR_MAX_THREADS:
    /// x * y * z), 0 when it has none.
    pub max_threads: u32,
    /// Local memory per thread (EIATTR_FRAME_SIZE): spilled registers and local arrays.
    pub frame_bytes: u32,
    /// Static shared memory (the size of its `.nv.shared.<name>` section, which includes
    /// the 1 KB the system reserves a block on sm_90 and later).
    pub static_smem: u32,
}

use crate::fatbin::{self, u16_at, u32_at};

// EIATTR record ids and formats (`.nv.info` sections).
const EIATTR_MAX_THREADS: u8 = 0x05;
const EIATTR_FRAME_SIZE: u8 = 0x11;
const EIATTR_REGCOUNT: u8 = 0x2f;
const EIFMT_NVAL: u8 = 0x01;
const EIFMT_HVAL: u8 = 0x03;
const EIFMT_SVAL: u8 = 0x04;

/// An 8-byte offset or size, as a usize.
fn u64_at(d: &[u8], at: usize) -> Option<usize> {
    usize::try_from(fatbin::u64_at(d, at)?).ok()
}

/// A section of a 64-bit little-endian ELF: its name, contents' offset and size, and
/// `sh_info` (for a `.text.<kernel>` section, the kernel's symbol index).
struct Section {
    name: String,
    offset: usize,
    size: usize,
    info: u32,
}

fn sections(elf: &[u8]) -> Option<Vec<Section>> {
    if elf.get(0..4)? != b"\x7fELF" || elf[4] != 2 || elf[5] != 1 {
        return None; // not ELF64, little-endian
    }
    let (shoff, entsize) = (u64_at(elf, 0x28)?, u16_at(elf, 0x3A)? as usize);
    let (count, strndx) = (u16_at(elf, 0x3C)? as usize, u16_at(elf, 0x3E)? as usize);
    let header = |i: usize| shoff.checked_add(i.checked_mul(entsize)?);
    let raw = (0..count)
        .map(|i| {
            let h = header(i)?;
            Some((
                u32_at(elf, h)?,
                u64_at(elf, h + 24)?,
                u64_at(elf, h + 32)?,
                u32_at(elf, h + 44)?,
            ))
        })
        .collect::<Option<Vec<_>>>()?;
    let strtab = raw.get(strndx)?.1;
    raw.iter()
        .map(|&(name, offset, size, info)| {
            let start = strtab.checked_add(name as usize)?;
            let len = elf.get(start..)?.iter().position(|&b| b == 0)?;
            Some(Section {
                name: String::from_utf8_lossy(&elf[start..start + len]).into_owned(),
                offset,
                size,
                info,
            })
        })
        .collect()
}

/// The (attribute, value bytes) records of an `.nv.info` section.
fn records(data: &[u8]) -> Option<Vec<(u8, &[u8])>> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < data.len() {
        let (format, attr) = (*data.get(at)?, *data.get(at + 1)?);
        let (value, next) = match format {
            EIFMT_NVAL => (&data[at..at], at + 2),
            EIFMT_SVAL => {
                let len = u16_at(data, at + 2)? as usize;
                (data.get(at + 4..at + 4 + len)?, at + 4 + len)
            }
            EIFMT_HVAL => (data.get(at + 2..at + 4)?, at + 4),
            _ => (data.get(at + 2..at + 4)?, at + 4), // EIFMT_BVAL and others: 2 bytes
        };
        out.push((attr, value));
        at = next;
    }
    Some(out)
}

/// Every kernel of a cubin with its resources; `None` if `elf` is not a well-formed cubin.
pub fn kernel_resources(elf: &[u8]) -> Option<Vec<KernelResources>> {
    let secs = sections(elf)?;
    let body = |s: &Section| elf.get(s.offset..s.offset.checked_add(s.size)?);
    let global = secs.iter().find(|s| s.name == ".nv.info").and_then(body);
    let global = records(global.unwrap_or(&[]))?;
    // (symbol index, value) of a global record.
    let keyed = |attr: u8, sym: u32| {
        global
            .iter()
            .filter(|(a, v)| *a == attr && v.len() == 8 && u32_at(v, 0) == Some(sym))
            .find_map(|(_, v)| u32_at(v, 4))
    };
    let mut out = Vec::new();
    for text in secs.iter().filter(|s| s.name.starts_with(".text.")) {
        let name = &text.name[".text.".len()..];
        let own = |prefix: &str| secs.iter().find(|s| s.name == format!("{prefix}{name}"));
        let max_threads = match own(".nv.info.").and_then(body) {
            Some(info) => records(info)?
                .iter()
                .find(|(a, v)| *a == EIATTR_MAX_THREADS && v.len() == 12)
                .map_or(0, |(_, v)| {
                    (0..3).map(|i| u32_at(v, 4 * i).unwrap_or(0)).product()
                }),
            None => 0,
        };
        out.push(KernelResources {
            name: name.to_string(),
            registers: keyed(EIATTR_REGCOUNT, text.info)?,
            max_threads,
            frame_bytes: keyed(EIATTR_FRAME_SIZE, text.info).unwrap_or(0),
            static_smem: own(".nv.shared.").map_or(0, |s| s.size as u32),
        });
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal cubin: a null section, .shstrtab, .nv.info (register count 40 and frame 8
    /// for symbol 7), .nv.info.k (max threads 128 x 1 x 1), .text.k (symbol 7), and
    /// .nv.shared.k of 1024 bytes.
    fn cubin() -> Vec<u8> {
        let names = b"\0.shstrtab\0.nv.info\0.nv.info.k\0.text.k\0.nv.shared.k\0".to_vec();
        let name_at = |n: &str| {
            let pos = names
                .windows(n.len() + 1)
                .position(|w| &w[..n.len()] == n.as_bytes() && w[n.len()] == 0)
                .unwrap();
            pos as u32
        };
        let sval = |attr: u8, v: &[u32]| {
            let mut r = vec![EIFMT_SVAL, attr];
            r.extend(((v.len() * 4) as u16).to_le_bytes());
            v.iter().for_each(|x| r.extend(x.to_le_bytes()));
            r
        };
        let mut global = sval(EIATTR_REGCOUNT, &[7, 40]);
        global.extend(sval(EIATTR_FRAME_SIZE, &[7, 8]));
        global.extend([EIFMT_NVAL, 0x4c]); // a record without a value, skipped
        let own = sval(EIATTR_MAX_THREADS, &[128, 1, 1]);
        let text = vec![0u8; 16];
        // Layout: 64-byte header, then the contents, then the section headers.
        let mut elf = vec![0u8; 64];
        elf[0..4].copy_from_slice(b"\x7fELF");
        elf[4] = 2;
        elf[5] = 1;
        let mut place = |bytes: &[u8]| {
            let at = elf.len();
            elf.extend_from_slice(bytes);
            at
        };
        let contents = [
            (0, 0, 0, 0),
            (name_at(".shstrtab"), place(&names), names.len(), 0),
            (name_at(".nv.info"), place(&global), global.len(), 0),
            (name_at(".nv.info.k"), place(&own), own.len(), 0),
            (name_at(".text.k"), place(&text), text.len(), 7),
            (name_at(".nv.shared.k"), 0, 1024, 0),
        ];
        let shoff = elf.len();
        for (name, offset, size, info) in contents {
            let mut h = vec![0u8; 64];
            h[0..4].copy_from_slice(&name.to_le_bytes());
            h[24..32].copy_from_slice(&(offset as u64).to_le_bytes());
            h[32..40].copy_from_slice(&(size as u64).to_le_bytes());
            h[44..48].copy_from_slice(&(info as u32).to_le_bytes());
            elf.extend(h);
        }
        elf[0x28..0x30].copy_from_slice(&(shoff as u64).to_le_bytes());
        elf[0x3A..0x3C].copy_from_slice(&64u16.to_le_bytes());
        elf[0x3C..0x3E].copy_from_slice(&6u16.to_le_bytes());
        elf[0x3E..0x40].copy_from_slice(&1u16.to_le_bytes());
        elf
    }

    #[test]
    fn reads_registers_threads_frame_and_shared_memory() {
        let k = kernel_resources(&cubin()).unwrap();
        assert_eq!(
            k,
            vec![KernelResources {
                name: "k".into(),
                registers: 40,
                max_threads: 128,
                frame_bytes: 8,
                static_smem: 1024,
            }]
        );
    }

    #[test]
    fn rejects_what_is_not_a_cubin() {
        assert_eq!(kernel_resources(b"not an elf"), None);
        let mut elf = cubin();
        elf.truncate(elf.len() - 40); // the last section header cut short
        assert_eq!(kernel_resources(&elf), None);
    }
}
