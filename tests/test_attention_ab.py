"""tests/attention_ab.py: two builds' attention rows from one call, compared (CPU)."""

from attention_ab import table, times

A = """# ddtree tree attention, ...
shape | ddtree µs | tile | splits | TFLOP/s | GB/s KV | SDPA flash no mask µs (x) | SDPA dense...
mla8 bs=1 N=256 P=65536 | 1400 | d576vk | 4 | 210.0 | 55 | not run | not run
gqa bs=8 N=64 P=4096 | 170 | d128 | 2 | 200.0 | 800 | not run | not run
mla8 bs=1 N=256 P=65536 | 1300 | d576vk | 4 | 226.0 | 59 | not run | not run
gqa bs=8 N=64 P=4096 | 180 | d128 | 2 | 190.0 | 760 | not run | not run
""".splitlines()
B = """mla8 bs=1 N=256 P=65536 | 1250 | d576vk | 4 | 235.0 | 61 | not run | not run
mla8 bs=1 N=256 P=65536 | 1200 | d576vk | 4 | 245.0 | 63 | not run | not run
""".splitlines()


def test_a_shape_keeps_every_pass_in_order_and_headers_are_skipped():
    assert times(A) == {
        "mla8 bs=1 N=256 P=65536": [1400.0, 1300.0],
        "gqa bs=8 N=64 P=4096": [170.0, 180.0],
    }


def test_the_table_takes_each_sides_fastest_pass_and_only_shared_shapes():
    text = table(times(A), times(B), ("main", "new"))
    lines = text.splitlines()
    assert lines[0] == "| shape | main µs | new µs | main ÷ new | passes |"
    assert lines[2] == "| mla8 bs=1 N=256 P=65536 | 1300 | 1200 | 1.08× | 2 / 2 |"
    assert len(lines) == 3  # gqa ran on one side only
