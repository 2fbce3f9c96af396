"""Two builds' tree attention times from one device call, side by side (tests/gpu_run.sh,
step attention-ab): python3 tests/attention_ab.py A.txt B.txt [NAME_A NAME_B], each file
the rows of one or more passes of ``python -m ddtree bench --attention`` with one build.
A shape's time is its fastest pass (the first call after an install often runs slow); the
ratio is B's speed over A's (above 1: B is faster)."""

import os
import sys


def times(lines) -> dict[str, list[float]]:
    """Shape -> ddtree µs of every pass, in the order the rows came."""
    out: dict[str, list[float]] = {}
    for line in lines:
        cells = [c.strip() for c in line.split("|")]
        if len(cells) < 2 or line.startswith("#"):
            continue
        try:
            us = float(cells[1])
        except ValueError:  # the header
            continue
        out.setdefault(cells[0], []).append(us)
    return out


def table(a: dict[str, list[float]], b: dict[str, list[float]], names=("A", "B")) -> str:
    rows = [
        f"| shape | {names[0]} µs | {names[1]} µs | {names[0]} ÷ {names[1]} | passes |",
        "|---|---|---|---|---|",
    ]
    for shape, ta in a.items():
        if shape not in b:
            continue
        tb = b[shape]
        ratio = min(ta) / min(tb)
        cells = f"{min(ta):.0f} | {min(tb):.0f} | {ratio:.2f}× | {len(ta)} / {len(tb)}"
        rows.append(f"| {shape} | {cells} |")
    return "\n".join(rows)


def main() -> None:
    with open(sys.argv[1]) as fa, open(sys.argv[2]) as fb:
        names = sys.argv[3:5] or [os.path.splitext(os.path.basename(f))[0] for f in sys.argv[1:3]]
        print(table(times(fa), times(fb), names))


if __name__ == "__main__":
    main()
