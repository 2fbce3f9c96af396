"""The hottest SASS lines of each kernel in an Nsight Compute source-page CSV
(`ncu --import R --page source --csv --print-source sass`): the lines with the most warp
stall samples, with their share of the kernel's samples, then its phases — the SASS cut
after each block or cluster barrier (`BAR.SYNC`, `UCGABAR_WAIT`) — with the most samples,
each with its share of the samples and of the executed instructions (tests/gpu_run.sh, step
ncu-build). Warps waiting at a barrier are sampled at it or at the line after it, so a
barrier's wait shows in the phase it closes or in the one it opens."""

import csv
import sys

TOP = 25
TOP_PHASES = 12


def number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def kernels(path: str):
    """(kernel name, column header, rows) per kernel: the CSV holds one table per kernel,
    each after a line naming it."""
    name, rows, header = None, [], None
    with open(path, newline="") as f:
        for rec in csv.reader(f):
            if not rec:
                continue
            if rec[0] == "Kernel Name":
                if name is not None and header:
                    yield name, header, rows
                name, rows, header = rec[1], [], None
            elif header is None:
                header = rec
            else:
                rows.append(rec)
    if name is not None and header:
        yield name, header, rows


BARRIERS = ("BAR.SYNC", "UCGABAR_WAIT")


def phases(texts, samples, executed):
    """(first line, last line, samples, executed instructions) of each phase: the lines up
    to and including a barrier, and the lines after the last one."""
    out, first, s, e = [], 0, 0.0, 0.0
    for i, (text, si, ei) in enumerate(zip(texts, samples, executed, strict=True)):
        s, e = s + si, e + ei
        if any(b in text for b in BARRIERS) or i == len(texts) - 1:
            out.append((first, i, s, e))
            first, s, e = i + 1, 0.0, 0.0
    return out


def print_phases(rows, header, col, src) -> None:
    ex = next((i for i, h in enumerate(header) if h.strip() == "Instructions Executed"), None)
    texts = [r[src].strip() for r in rows]
    samples = [number(r[col]) for r in rows]
    executed = [number(r[ex]) if ex is not None else 0.0 for r in rows]
    total_s, total_e = sum(samples) or 1.0, sum(executed) or 1.0
    found = sorted(phases(texts, samples, executed), key=lambda p: -p[2])[:TOP_PHASES]
    print(f"# the {len(found)} phases (SASS lines first-last, cut at barriers) with most samples")
    for first, last, s, e in found:
        print(
            f"{100 * s / total_s:5.1f} % samples {100 * e / total_e:5.1f} % instructions"
            f"  lines {first}-{last}  ends: {texts[last]}"
        )


def main() -> None:
    for name, header, rows in kernels(sys.argv[1]):
        col = next((i for i, h in enumerate(header) if "Warp Stall Sampling (All" in h), None)
        src = next((i for i, h in enumerate(header) if h.strip() == "Source"), 1)
        if col is None:
            print(f"\n## {name}: no stall-sampling column; columns: {header[:12]}")
            continue
        total = sum(number(r[col]) for r in rows) or 1.0
        print(f"\n## {name}: {total:.0f} stall samples; the {TOP} hottest SASS lines")
        for r in sorted(rows, key=lambda r: -number(r[col]))[:TOP]:
            print(f"{100 * number(r[col]) / total:5.1f} %  {r[src].strip()}")
        print_phases(rows, header, col, src)


if __name__ == "__main__":
    main()
