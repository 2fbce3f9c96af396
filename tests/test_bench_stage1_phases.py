"""The stage-1 diagnostics table of ``python -m ddtree bench --device cuda``
(`bench_gpu.stage1_phases`): what it makes of the slots a diagnostics build writes, on
slots written here by hand (the kernels' own are checked on the GPU, test_gpu.py)."""

from __future__ import annotations

import torch

from ddtree import bench_gpu

P = {name: i for i, name in enumerate(bench_gpu.PHASES)}


def row(marks: dict, start_ns: int, end_ns: int, sm: int) -> list:
    r = [0] * bench_gpu.PHASE_SLOTS
    for name, clock in marks.items():
        r[P[name]] = clock
    r[bench_gpu.START_NS], r[bench_gpu.END_NS], r[bench_gpu.SM] = start_ns, end_ns, sm
    return r


def test_a_release_build_writes_nothing_and_gets_no_table():
    assert bench_gpu.stage1_phases(torch.zeros(6, bench_gpu.PHASE_SLOTS, dtype=torch.int64)) is None


def test_each_gap_goes_to_the_phase_that_ends_it():
    one_read = row(
        {"start": 100, "first floor": 150, "one read": 1150, "reduce": 1200, "row floor": 1300,
         "keep": 1310, "select": 1400, "normaliser": 1450, "write": 1500},
        start_ns=1_000, end_ns=2_000, sm=0,
    )  # fmt: skip
    # A row the one read handed to the two reads: its first floor, then the two reads'.
    two_reads = row(
        {"start": 7, "first floor": 57, "max pass": 1057, "floor": 1157, "sum+collect": 2157,
         "select": 2257, "normaliser": 2307, "write": 2407},
        start_ns=1_500, end_ns=3_000, sm=2,
    )  # fmt: skip
    p = bench_gpu.stage1_phases(torch.tensor([one_read, two_reads]))
    assert p["rows"] == 2
    assert p["cycles"]["first floor"] == 50  # both rows, 50 each
    assert p["cycles"]["one read"] == 500  # 1000 on one row of two
    assert p["cycles"]["sum+collect"] == 500
    assert p["cycles"]["select"] == (90 + 100) / 2
    assert p["taken"]["one read"] == 1 and p["taken"]["max pass"] == 1
    assert p["taken"]["write"] == 2 and p["taken"]["second read"] == 0
    # The phases add up to the row: write minus start.
    assert sum(p["cycles"].values()) == p["row_cycles"] == (1400 + 2400) / 2
    assert p["row_us"] == (1.0 + 1.5) / 2
    assert p["span_us"] == 2.0  # 1000 ns to 3000 ns
    assert p["open"] == 2.5 / 2.0
    assert p["sm_rows"] == (1, 1)  # SMs 0 and 2 ran a row each; SM 1 none


def test_the_table_prints_only_for_a_diagnostics_build(capsys):
    marks = {"start": 1, "max pass": 5, "floor": 6, "sum+collect": 9, "select": 10,
             "normaliser": 11, "write": 12}  # fmt: skip
    slots = torch.tensor([row(marks, 10, 20, 0), row(marks, 10, 30, 0)])
    rows = [{"bs": 1, "B": 63, "stage1": None}, {"bs": 2, "B": 63}]
    bench_gpu.print_stage1_phases(rows)
    assert capsys.readouterr().out == ""
    bench_gpu.print_stage1_phases([{"bs": 1, "B": 63, "stage1": bench_gpu.stage1_phases(slots)}])
    out = capsys.readouterr().out.splitlines()
    phases = "0 | 0 | 0 | 0 | 0 | 0 | 4 | 1 | 3 | 1 | 1 | 1"
    # Two rows of 10 and 20 ns over a span of 20 ns: 1.5 open; both on SM 0.
    assert out[-1] == f"1 | 63 | {phases} | 11 | 0.0 | 0.0 | 1.5 | 2–2"
