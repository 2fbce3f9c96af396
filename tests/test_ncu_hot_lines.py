"""tests/ncu_hot_lines.py: a kernel's SASS cut into phases at its barriers (CPU)."""

from ncu_hot_lines import kernels, phases

TEXTS = [
    "LDG.E.128 R4, desc[UR4][R2.64]",
    "BAR.SYNC.DEFER_BLOCKING 0x0",
    "UMOV UR6, 0x400",
    "FFMA R1, R2, R3, R4",
    "UCGABAR_WAIT",
    "EXIT",
]


def test_phases_end_at_each_barrier_and_at_the_last_line():
    samples = [5.0, 7.0, 11.0, 1.0, 3.0, 2.0]
    executed = [10.0, 10.0, 10.0, 40.0, 10.0, 10.0]
    assert phases(TEXTS, samples, executed) == [
        (0, 1, 12.0, 20.0),
        (2, 4, 15.0, 60.0),
        (5, 5, 2.0, 10.0),
    ]


def test_a_kernel_that_ends_at_a_barrier_has_no_empty_phase():
    texts = TEXTS[:5]
    got = phases(texts, [1.0] * 5, [1.0] * 5)
    assert [(a, b) for a, b, _, _ in got] == [(0, 1), (2, 4)]
    assert sum(s for _, _, s, _ in got) == 5.0


def test_kernels_splits_the_csv_per_kernel(tmp_path):
    csv = tmp_path / "sass.csv"
    csv.write_text(
        '"Kernel Name","k1",\n"Address","Source","Warp Stall Sampling (All Samples)"\n'
        '"0x0","  BAR.SYNC 0x0","3"\n"0x10","  EXIT","1"\n'
        '"Kernel Name","k2",\n"Address","Source","Warp Stall Sampling (All Samples)"\n'
        '"0x0","  EXIT","4"\n'
    )
    got = [(name, len(rows)) for name, _, rows in kernels(str(csv))]
    assert got == [("k1", 2), ("k2", 1)]
