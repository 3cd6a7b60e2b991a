"""Means, spreads and confidence intervals over seeds: Student's t without scipy.

The t distribution's CDF is the regularized incomplete beta function (Abramowitz and Stegun 26.7.1:
P(T <= t) = 1 - I_x(df/2, 1/2) / 2 for t >= 0, x = df / (df + t^2)), evaluated by its continued
fraction (Numerical Recipes 6.4, modified Lentz); a quantile inverts the CDF by bisection, so any real
df works (Welch's is rarely an integer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

CONFIDENCE = 0.95
# The largest |value| taken: every result over such values stays finite (a mean within it, a deviation
# within 1.5x, a half-width within 13x at n = 2, a difference's within 40x: far from float's 1.8e308).
MAX_VALUE = 1e300


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of I_x(a, b) (Numerical Recipes' betacf), by the modified Lentz method."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        for numerator in (m * (b - m) * x / ((qam + m2) * (a + m2)),
                          -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            return h
    raise ArithmeticError(f"the incomplete beta fraction did not converge for a={a}, b={b}, x={x}")


def regularized_incomplete_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b) for a, b > 0 and x in [0, 1]."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"x must be in [0, 1], got {x}")
    if x in (0.0, 1.0):
        return x
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):  # where the fraction converges fast; else use I_x(a,b) = 1 - I_1-x(b,a)
        return math.exp(log_front) * _beta_continued_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_continued_fraction(b, a, 1.0 - x) / b


def student_t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` > 0 degrees of freedom."""
    if df <= 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df}")
    tail = 0.5 * regularized_incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def student_t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p, for p in (0, 1): the CDF inverted by bisection to float precision."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if p < 0.5:
        return -student_t_quantile(1.0 - p, df)
    low, high = 0.0, 1.0
    while student_t_cdf(high, df) < p:
        low, high = high, 2.0 * high
    for _ in range(200):
        mid = 0.5 * (low + high)
        if mid in (low, high):
            break
        low, high = (mid, high) if student_t_cdf(mid, df) < p else (low, mid)
    return 0.5 * (low + high)


@dataclass(frozen=True)
class Spread:
    """A metric over n seeds: its mean, sample standard deviation (n - 1) and the half-width of its
    two-sided confidence interval, mean +- t(1 - (1 - confidence) / 2, n - 1) * std / sqrt(n). With one
    value the deviation and interval are None."""

    values: tuple[float, ...]
    mean: float
    std: float | None
    half_width: float | None

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def interval(self) -> tuple[float, float] | None:
        return None if self.half_width is None else (self.mean - self.half_width, self.mean + self.half_width)


def spread(values, confidence: float = CONFIDENCE) -> Spread:
    """The Spread of finite `values` within +-MAX_VALUE (ValueError otherwise). The sums and squares are taken
    in units of the largest |value| (_unit), so none overflows (1e300 ** 2) or underflows (1e-200 ** 2)."""
    values = tuple(float(v) for v in values)
    if not values:
        raise ValueError("no values")
    if not all(abs(v) <= MAX_VALUE for v in values):  # also NaN
        raise ValueError(f"values must be finite and within +-{MAX_VALUE:g}")
    n, scale = len(values), _unit(max(abs(v) for v in values))
    units = [v / scale for v in values]
    mean_units = math.fsum(units) / n
    mean = mean_units * scale
    if n == 1:
        return Spread(values, mean, None, None)
    deviations = [u - mean_units for u in units]
    # the corrected two-pass sum (Chan, Golub and LeVeque 1983): the second term takes back the rounding of
    # the mean, which matters where the values agree to many digits (3002399751580331 and ...79690)
    squares = math.fsum(d * d for d in deviations) - math.fsum(deviations) ** 2 / n
    std = math.sqrt(max(squares, 0.0) / (n - 1)) * scale
    return Spread(values, mean, std, student_t_quantile(0.5 + confidence / 2, n - 1) * std / math.sqrt(n))


def _unit(largest: float) -> float:
    """The power of two at or above `largest` (1 for 0): dividing by it is exact, so a result in these units
    is the one the plain formula gives wherever that one does not overflow."""
    return math.ldexp(1.0, math.frexp(largest)[1]) if largest else 1.0


@dataclass(frozen=True)
class Difference:
    """mean(b) - mean(a) and the half-width of its confidence interval by Welch's t (unequal variances,
    Welch-Satterthwaite degrees of freedom); None where either side has a single value."""

    delta: float
    half_width: float | None
    df: float | None

    @property
    def interval(self) -> tuple[float, float] | None:
        return None if self.half_width is None else (self.delta - self.half_width, self.delta + self.half_width)

    @property
    def excludes_zero(self) -> bool:
        lo_hi = self.interval
        return lo_hi is not None and (lo_hi[0] > 0 or lo_hi[1] < 0)


def welch(a: Spread, b: Spread, confidence: float = CONFIDENCE) -> Difference:
    """The variances are taken in units of the larger deviation (as in `spread`): the degrees of freedom
    are a ratio, the same in any unit, and no square overflows or underflows."""
    delta = b.mean - a.mean
    if a.std is None or b.std is None:
        return Difference(delta, None, None)
    if a.std == b.std == 0:  # both sides constant: the difference is exact
        return Difference(delta, 0.0, math.inf)
    scale = _unit(max(a.std, b.std))
    va, vb = (a.std / scale) ** 2 / a.n, (b.std / scale) ** 2 / b.n
    df = (va + vb) ** 2 / (va**2 / (a.n - 1) + vb**2 / (b.n - 1))
    return Difference(delta, student_t_quantile(0.5 + confidence / 2, df) * math.sqrt(va + vb) * scale, df)


def decimals(value: float | None, significant: int = 2) -> int:
    """Decimal places that show `significant` digits of `value` (a spread, an interval's half-width): a
    mean is worth printing to the digits its uncertainty has. 4 where the spread is unknown or zero."""
    if value is None or not math.isfinite(value) or value == 0:
        return 4
    return max(0, significant - 1 - math.floor(math.log10(abs(value))))
