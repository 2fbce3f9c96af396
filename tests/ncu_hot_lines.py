"""The hottest SASS lines of each kernel in an Nsight Compute source-page CSV
(`ncu --import R --page source --csv --print-source sass`): the lines with the most warp
stall samples, with their share of the kernel's samples (tests/gpu_run.sh, step ncu-build)."""

import csv
import sys

TOP = 25


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


if __name__ == "__main__":
    main()
