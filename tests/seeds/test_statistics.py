"""Student's t without scipy: the CDF and quantile against a printed t-table and scipy (a dependency of
scikit-learn, so present wherever the tests run), and the spreads and Welch intervals by hand."""

import math
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as scipy_stats

from mlptrain.seeds.statistics import (
    MAX_VALUE,
    decimals,
    regularized_incomplete_beta,
    spread,
    student_t_cdf,
    student_t_quantile,
    welch,
)

# two-sided 95% critical values, t(0.975, df), as printed in every t-table
T_TABLE = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 9: 2.262, 10: 2.228, 29: 2.045, 120: 1.980}


@pytest.mark.parametrize("df, value", sorted(T_TABLE.items()))
def test_quantile_matches_the_table(df, value):
    assert student_t_quantile(0.975, df) == pytest.approx(value, abs=5e-4)


@pytest.mark.parametrize("df", [0.7, 1, 1.5, 2, 2.37, 3, 4.9, 7, 12.5, 30, 250, 1e5])
@pytest.mark.parametrize("p", [0.001, 0.025, 0.1, 0.5, 0.8, 0.95, 0.975, 0.995])
def test_quantile_and_cdf_match_scipy(df, p):
    t = student_t_quantile(p, df)
    assert t == pytest.approx(scipy_stats.t.ppf(p, df), rel=1e-9, abs=1e-9)
    assert student_t_cdf(t, df) == pytest.approx(p, rel=1e-10)


def test_large_df_tends_to_the_normal():
    assert student_t_quantile(0.975, 1e7) == pytest.approx(1.959964, abs=1e-5)


@pytest.mark.parametrize("a, b, x", [(0.5, 0.5, 0.3), (2.0, 3.0, 0.9), (50.0, 0.5, 0.99), (1.0, 1.0, 0.25)])
def test_incomplete_beta_matches_scipy(a, b, x):
    from scipy.special import betainc
    assert regularized_incomplete_beta(a, b, x) == pytest.approx(betainc(a, b, x), rel=1e-12)


def test_bad_arguments():
    for call in (lambda: student_t_quantile(1.0, 3), lambda: student_t_quantile(0.0, 3),
                 lambda: student_t_cdf(1.0, 0), lambda: regularized_incomplete_beta(1, 1, 1.5), lambda: spread([])):
        with pytest.raises(ValueError):
            call()


def test_spread_by_hand():
    s = spread([0.97, 0.98, 0.99])
    assert s.n == 3 and s.mean == pytest.approx(0.98)
    assert s.std == pytest.approx(0.01)  # the sample deviation, n - 1
    assert s.half_width == pytest.approx(4.303 * 0.01 / math.sqrt(3), rel=1e-3)
    assert s.interval == pytest.approx((0.98 - s.half_width, 0.98 + s.half_width))
    one = spread([0.5])
    assert one.std is None and one.half_width is None and one.interval is None


def test_welch_by_hand_and_against_scipy():
    a, b = [0.970, 0.972, 0.971, 0.969], [0.975, 0.979, 0.977]
    d = welch(spread(a), spread(b))
    va, vb = spread(a).std ** 2 / 4, spread(b).std ** 2 / 3
    df = (va + vb) ** 2 / (va**2 / 3 + vb**2 / 2)
    assert d.delta == pytest.approx(sum(b) / 3 - sum(a) / 4)
    assert d.df == pytest.approx(df)
    assert d.half_width == pytest.approx(scipy_stats.t.ppf(0.975, df) * math.sqrt(va + vb), rel=1e-9)
    # scipy's Welch test agrees on which side of zero the interval lies
    assert d.excludes_zero == (scipy_stats.ttest_ind(b, a, equal_var=False).pvalue < 0.05)
    assert not welch(spread([1.0, 2.0]), spread([1.5, 1.6])).excludes_zero


def test_welch_edge_cases():
    assert welch(spread([1.0]), spread([2.0, 3.0])).interval is None
    exact = welch(spread([1.0, 1.0]), spread([2.0, 2.0]))
    assert exact.interval == (1.0, 1.0) and exact.excludes_zero


def test_decimals_show_two_digits_of_the_spread():
    assert decimals(0.0027) == 4  # 0.9712 +- 0.0027
    assert decimals(0.00012) == 5  # 0.00503 +- 0.00012
    assert decimals(3.4) == 1 and decimals(25.0) == 0
    assert decimals(None) == 4 and decimals(0.0) == 4


finite_values = st.lists(st.floats(-MAX_VALUE, MAX_VALUE, allow_nan=False, allow_subnormal=True), min_size=1,
                         max_size=8)


@settings(max_examples=150, deadline=None)
@given(a=finite_values, b=finite_values)
def test_no_statistic_overflows_on_finite_values_and_each_matches_exact_arithmetic(a, b):
    """1e308-scale values squared overflowed (an OverflowError from `compare`); tiny ones squared underflowed
    to a zero spread. Any values within +-MAX_VALUE give finite results, as exact rational arithmetic does."""
    for values in (a, b):
        s, exact = spread(values), [Fraction(v) for v in values]
        mean = sum(exact) / len(exact)
        assert math.isfinite(s.mean) and s.mean == pytest.approx(float(mean), rel=1e-12, abs=1e-300)
        if len(values) > 1:
            variance = sum((v - mean) ** 2 for v in exact) / (len(exact) - 1)
            assert math.isfinite(s.std) and math.isfinite(s.half_width) and all(map(math.isfinite, s.interval))
            unit = max(map(abs, values)) or 1.0  # the exact deviation is past float's range squared
            assert s.std == pytest.approx(math.sqrt(float(variance / Fraction(unit) ** 2)) * unit, rel=1e-9,
                                          abs=1e-300)
    d = welch(spread(a), spread(b))
    assert math.isfinite(d.delta) and (d.interval is None or all(map(math.isfinite, d.interval)))


def test_the_issue_values_and_their_limits():
    s = spread([1e300, -1e300])
    assert s.mean == 0 and s.std == pytest.approx(math.sqrt(2) * 1e300) and math.isfinite(s.half_width)
    tiny = spread([1e-200, 3e-200])  # (1e-200) ** 2 is 0.0 in floats
    assert tiny.std == pytest.approx(math.sqrt(2) * 1e-200)
    assert welch(tiny, spread([2e-200, 2e-200])).df == pytest.approx(1.0)
    for values in ([1e308, -1e308], [float("nan"), 1.0], [float("inf")]):
        with pytest.raises(ValueError, match="finite and within"):
            spread(values)
