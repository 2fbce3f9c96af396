"""The GPU's stage-1 normaliser (kernels/include/ddtree/fixed_sum.cuh), emulated in numpy, on
rows built to break it: its error analysis checked without a GPU.

numpy's float64 `exp` stands in for CUDA's `exp`, and the far terms' `exp_units` is followed
step by step with numpy's float64 `exp2`, rounded to float32, for the hardware's `ex2` (within
the 1 and 2 ulp CUDA documents for `exp` and `exp2f`), so this checks the design — the three
grades, the exact exponent, the reduced argument, the integer units — not the kernel's
bits; the GPU tests (tests/test_gpu.py, `test_z_within_one_ulp_where_it_is_small`) check
those. The emulation also keeps the fp32 exponent the kernel used before session 20, to
show these rows fail it.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from conftest import log_prob_rows

from ddtree import reference
from ddtree.bench_gpu import PRECISE_MAX

F32 = np.float32
HEADER = Path(__file__).resolve().parents[1] / "kernels/include/ddtree/fixed_sum.cuh"


def big_sum(units: np.ndarray) -> int:
    """The exact sum of non-negative integer-valued float64s below 2^64, as a Python int."""
    u = units.astype(np.uint64)
    high = (u >> np.uint64(32)).astype(np.int64).sum()
    low = (u & np.uint64(0xFFFFFFFF)).astype(np.int64).sum()
    return int(high) * 2**32 + int(low)


def precise_sum(exact: np.ndarray) -> tuple[int, float]:
    """Every term float64, in units of 2^-80 (precise_units: a high and a low word)."""
    e = np.where(exact > -60.0, np.exp(exact), 0.0)
    top = np.floor(e * 2.0**16)
    low = np.rint((e * 2.0**16 - top) * 2.0**64)
    return int(top.astype(np.int64).sum()) * 2**64 + big_sum(low), 2.0**80


def two_sum_error(x: np.ndarray, m: F32, d: np.ndarray) -> np.ndarray:
    """fixed_sum.cuh's two_diff_error: x - m = d + error exactly (TwoSum, in float32)."""
    bb = (d - x).astype(F32)
    return ((x - (d - bb)).astype(F32) + (F32(-m) - bb)).astype(F32)


def ex2(f: np.ndarray, ulps: int) -> np.ndarray:
    """2^f rounded to float32, then moved `ulps` ulps (toward +inf if positive): the
    hardware's ex2 is within 2 ulp, so ulps = +-2 is its worst case on every term at once."""
    t = np.exp2(f.astype(np.float64)).astype(F32)
    toward = F32(np.inf) if ulps > 0 else F32(0)
    for _ in range(abs(ulps)):
        t = np.nextafter(t, toward)
    return t


LOG2E_HI = F32(float.fromhex("0x1.715476p+0"))
LOG2E_LO = F32(float.fromhex("0x1.4ae0c0p-26"))


def exp_units(d: np.ndarray, ulps: int, bits: int = 52) -> np.ndarray:
    """fixed_sum.cuh's exp_units<bits>, e^d * 2^bits as a float64 (exact: a float32 times a
    power of two): d taken at -64 at least, j = d log2(e) to the nearest integer (even on a
    tie, as the kernel's magic-number fma), f = d log2(e) - j by two fmas (each product
    exact in float64), ex2(f) `ulps` off, times 2^(j + bits)."""
    c = np.maximum(d, F32(-64)).astype(np.float64)
    j = np.rint(c * np.float64(LOG2E_HI))
    f = (c * np.float64(LOG2E_HI) - j).astype(F32)
    f = (c * np.float64(LOG2E_LO) + f.astype(np.float64)).astype(F32)
    return ex2(f, ulps).astype(np.float64) * np.exp2(j + bits)


def header_constant(name: str) -> float:
    """A numeric constant of fixed_sum.cuh (`name = value` or `name = valuef;`)."""
    return float(re.search(name + r" = ([-\d.]+)f?;", HEADER.read_text()).group(1))


ABSOLUTE_BITS = 48
ABSOLUTE_RANGE = (6.0, 33.0)  # kAbsoluteFrom, kAbsoluteTo
ABSOLUTE_EXP_ABOVE = 11.0
ABSOLUTE_RUN_BELOW = 9.0


def absolute_sum(x: np.ndarray, ulps: int = 0) -> tuple[int, float]:
    """The absolute grade: every term e^x * 2^48 to the nearest integer, no maximum taken;
    at or below 11 exp_units<48> `ulps` off, above it a float64 exp (there an integer
    already: its ulp is 2^11 or more)."""
    small = x <= F32(ABSOLUTE_EXP_ABOVE)
    units = np.rint(exp_units(x[small], ulps, ABSOLUTE_BITS))
    big = np.exp(x[~small].astype(np.float64)) * 2.0**ABSOLUTE_BITS
    return big_sum(units) + sum(int(b) for b in big), 2.0**ABSOLUTE_BITS


def fast_sum(
    x: np.ndarray, m: F32, exact: np.ndarray, fp32_exponent: bool, ulps: int = 0
) -> tuple[int, float]:
    """Float64 terms within 3 of the maximum, fp32 terms below, in units of 2^-52; the fp32
    difference's rounding error folded back (TwoSum), unless `fp32_exponent` (the old way);
    the hardware's ex2 `ulps` ulps off (`exp_units`)."""
    with np.errstate(invalid="ignore", over="ignore"):
        d = (x - m).astype(F32)
        near = d > F32(-3)
        far = ~near & (d > F32(-40))
        err = two_sum_error(x, m, d)
        if fp32_exponent:
            err = np.zeros_like(err)
        t = exp_units(d, ulps)
        t = (t + t * err.astype(np.float64)).astype(F32)  # fmaf: one rounding
    units = np.zeros(x.shape, np.float64)
    units[near] = np.rint(np.exp(d[near] if fp32_exponent else exact[near]) * 2.0**52)
    units[far] = np.rint(t[far].astype(np.float64))
    return big_sum(units), 2.0**52


def grade_of(m: F32) -> str:
    """fixed_sum.cuh's choice: absolute, else precise, else fast, by the maximum alone."""
    if ABSOLUTE_RANGE[0] <= m <= ABSOLUTE_RANGE[1]:
        return "absolute"
    return "precise" if PRECISE_MAX[0] < m < PRECISE_MAX[1] else "fast"


def emulated_z(
    row: np.ndarray, fp32_exponent: bool = False, ulps: int = 0, grade: str | None = None
) -> F32:
    """The kernel's Z, its grade by the row's maximum (or forced by `grade`)."""
    x = row.astype(F32)
    m = F32(x[np.isfinite(x)].max())
    exact = x.astype(np.float64) - np.float64(m)
    if fp32_exponent:
        exact = (x - m).astype(F32).astype(np.float64)
    grade = grade or grade_of(m)
    if grade == "absolute":
        total, unit = absolute_sum(x[np.isfinite(x)], ulps)
        return F32(np.log(float(total) / unit))
    if grade == "fast":
        total, unit = fast_sum(x, m, exact, fp32_exponent, ulps)
    else:
        total, unit = precise_sum(exact)
    return F32(np.float64(m) + np.log(float(total) / unit))


def ulps_off(z: F32, row: np.ndarray) -> float:
    """|z - Z| in ulps of the reference's Z, less float64's own rounding of m + log(sum),
    which is more than an fp32 ulp where |Z| is below about 1e-7 (docs/spec.md)."""
    ref = reference.logsumexp(row)
    slack = 4 * np.spacing(np.float64(abs(row.max())) + 1.0)
    return max(0.0, abs(float(z) - float(ref)) - slack) / float(np.spacing(abs(ref)))


def rows(top: float | None, seed: int) -> np.ndarray:
    """Log-probability rows (Z near 0), or the same rows with their maximum moved to `top`."""
    x = log_prob_rows(np.random.default_rng(seed), (1, 24, 20000))[0]
    if top is not None:
        x = x - x.max(axis=1, keepdims=True) + top
    return x.astype(F32)


def test_the_header_and_the_bench_name_the_same_grade_edges():
    assert (header_constant("kFastAtOrBelow"), header_constant("kFastAtOrAbove")) == PRECISE_MAX


TOPS = [None, 3.9, 4.0, 5.5, 5.9, 6.0, 7.9, 12.0, 20.0, 33.0, 33.5, 40.0, -25.0, -25.5, -30.0]


@pytest.mark.parametrize("top", TOPS)
def test_every_row_keeps_z_within_one_ulp(top):
    """The precise grade (log-prob rows, 3.9, -25), the fast grade at its edges (4.0, 5.9,
    33.5, -25.5) and beyond them, and the absolute grade at its edges (6, 33) and inside
    it, with the hardware's ex2 at its documented worst, 2 ulp, on every term it takes at
    once, both ways."""
    for row in rows(top, seed=5):
        for ulps in (-2, 0, 2):
            assert ulps_off(emulated_z(row, ulps=ulps), row) <= 1.0, (top, ulps)


@pytest.mark.parametrize("top", [6.0, 33.0])
def test_every_absolute_row_keeps_z_within_one_ulp_when_tied(top):
    """A row of many equal values at the grade's edges: every term carries the same ex2
    error, the case where the errors cannot cancel."""
    row = np.full(150_000, F32(top - 7.25), F32)
    row[::977] = F32(top)
    for ulps in (-2, 2):
        assert ulps_off(emulated_z(row, ulps=ulps), row) <= 1.0, (top, ulps)


def test_the_absolute_grade_follows_the_header_and_stays_in_its_words():
    """The emulation's constants are the header's; a run of eight terms under
    kAbsoluteRunBelow sums under 2^64 (the kernel's 64-bit run sum), a term at or below
    kAbsoluteExpAbove is under 2^64 (its conversion), with ex2 2 ulp high; and V < 2^31
    terms of rows at most kAbsoluteTo sum under 2^127, the bound the header states (the
    128-bit sum is unsigned: a bit to spare)."""
    assert header_constant("kAbsoluteUnitBits") == ABSOLUTE_BITS
    assert (header_constant("kAbsoluteFrom"), header_constant("kAbsoluteTo")) == ABSOLUTE_RANGE
    assert header_constant("kAbsoluteExpAbove") == ABSOLUTE_EXP_ABOVE
    assert header_constant("kAbsoluteRunBelow") == ABSOLUTE_RUN_BELOW
    assert "exp_units<kAbsoluteUnitBits>(x)" in HEADER.read_text()
    below_nine = np.array([np.nextafter(F32(ABSOLUTE_RUN_BELOW), F32(0))], F32)
    for dtype in ("bfloat16", "float16"):
        values = all_values(dtype)
        below_nine = np.append(below_nine, values[values < F32(ABSOLUTE_RUN_BELOW)].max())
    assert 8 * exp_units(below_nine, 2, ABSOLUTE_BITS).max() < 2.0**64
    assert exp_units(np.array([ABSOLUTE_EXP_ABOVE], F32), 2, ABSOLUTE_BITS)[0] < 2.0**64
    assert 2.0**31 * (np.exp(ABSOLUTE_RANGE[1]) * 2.0**ABSOLUTE_BITS + 1) < 2.0**127


def test_exp_units_follows_the_header_and_its_reduction_error_bound():
    """The emulated exp_units takes the header's steps (its clamp, magic number and log2(e)
    pair), and with ex2 correctly rounded it is within 0.35 * 2^-22 of e^d * 2^52 on a
    dense grid of (-40, -3]: half an ulp of ex2's result (0.25) plus the reduced
    argument's two roundings (0.09), the header's account less ex2's 2 ulp."""
    header = HEADER.read_text()
    steps = ("fmaxf(d, -64.0f)", "12582912.0f + kBits", "int kBits = kFastUnitBits")
    steps += ("kFastUnitBits = 52;",)
    for step in steps + ("0x1.715476p+0f", "0x1.4ae0c0p-26f"):
        assert step in header, step
    d = np.linspace(-40.0, -3.0, 1_000_001).astype(F32)
    exact = np.exp(d.astype(np.float64)) * 2.0**52
    assert np.abs(exp_units(d, 0) / exact - 1).max() <= 0.35 * 2.0**-22
    assert np.abs(exp_units(d, 2) / exact - 1).max() > 2.0**-22  # the bound can fail


@pytest.mark.parametrize("grade", ["fast", "absolute"])
def test_the_fp32_grades_miss_below_their_edge(grade):
    """Why the grade is chosen by |Z|: with ex2 2 ulp off on every fp32 term, rows whose
    maximum is -5 (precise; Z from about -5 to 2, its ulp down to 2^-24 and less) summed
    in the fast or the absolute grade land many ulps away."""
    for ulps in (-2, 2):
        off = [ulps_off(emulated_z(row, ulps=ulps, grade=grade), row) for row in rows(-5.0, 5)]
        assert max(off) > 1.0


def test_the_fp32_exponent_misses_on_these_rows():
    """What session 20 fixed: x - m rounded in fp32 repeats its error in every tied term."""
    off = [ulps_off(emulated_z(row, fp32_exponent=True), row) for row in rows(None, seed=5)]
    assert max(off) > 1.0


def all_values(dtype: str) -> np.ndarray:
    """Every finite value of a 16-bit float type, and -inf, as float32."""
    bits = np.arange(1 << 16, dtype=np.uint32)
    if dtype == "bfloat16":
        values = (bits << np.uint32(16)).view(F32)
    else:
        values = bits.astype(np.uint16).view(np.float16).astype(F32)
    values = values[np.isfinite(values)]
    return np.concatenate([values, np.array([-np.inf], F32)])


def maxima(values: np.ndarray) -> np.ndarray:
    """Row maxima of the fast grade: at or above kFastAtOrAbove, at or below kFastAtOrBelow."""
    below, above = (F32(e) for e in PRECISE_MAX)
    fast = values[(values >= above) | (values <= below)]
    pick = np.random.default_rng(1).choice(fast, 300, replace=False)
    edges = np.array([above, below, 4.03125, 7.96875, -26.0, -32.0, 9.0, 1024.0, 65504.0], F32)
    return np.concatenate([pick, edges])


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_far_run_error_is_twosums_where_the_term_counts(dtype):
    """far_term16 takes the exponent's rounding error by Fast2Sum, x - (d + m), where
    fixed_term takes TwoSum's: for every value of the type below every fast-grade maximum
    (x <= m) whose term the far path computes (-40 < d <= -3), the two errors are equal, so
    the 16-bit runs sum fixed_term's integers."""
    header = HEADER.read_text()
    assert "const float err = x - (d + m);" in header
    values = all_values(dtype)
    checked = inexact = 0
    for m in maxima(values):
        x = values[values <= m]
        with np.errstate(invalid="ignore", over="ignore"):
            d = (x - m).astype(F32)
            two_sum = two_sum_error(x, m, d)
            fast_two_sum = (x - (d + m).astype(F32)).astype(F32)
        computed = (d > F32(-40)) & (d <= F32(-3))
        assert np.array_equal(two_sum[computed], fast_two_sum[computed]), f"m = {m}"
        checked += int(computed.sum())
        inexact += int((two_sum[computed] != 0).sum())
    assert checked > 100_000 and inexact > 1_000  # rows where the error is folded back


def exact_from(m: F32, significand: int) -> F32:
    """fixed_sum.cuh's exact_from<P>: 2^(e - (21 - P)), e the exponent of m."""
    e = int((np.array(m, F32).view(np.uint32) >> np.uint32(23)) & np.uint32(0xFF)) - 127
    return F32(2.0 ** (e - (21 - significand)))


@pytest.mark.parametrize("dtype, significand", [("bfloat16", 8), ("float16", 11)])
def test_a_run_at_or_above_exact_from_has_exact_differences(dtype, significand):
    """far_term16_exact drops far_term16's error term: for every value of the type at or
    above exact_from(m) in magnitude, below every fast-grade maximum, either fp32(x - m) is
    exact (the error is 0, the two give the same bits) or both the exact and the rounded
    difference are -40 or less (both give the term 0)."""
    header = HEADER.read_text()
    assert "e - (21 - P) + 127" in header
    values = all_values(dtype)
    checked = 0
    for m in maxima(values):
        x = values[(values <= m) & (np.abs(values) >= exact_from(m, significand))]
        with np.errstate(invalid="ignore", over="ignore"):
            d = (x - m).astype(F32)
            exact = x.astype(np.float64) - np.float64(m)
        same = (d.astype(np.float64) == exact) | np.isneginf(x)
        assert np.all(same | ((d <= F32(-40)) & (exact <= -40.0))), f"m = {m}"
        checked += int(((exact > -40.0) & np.isfinite(exact)).sum())
    assert checked > 10_000
