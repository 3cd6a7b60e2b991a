"""Numbers read back from a file (summary.json, seeds.json, metrics.jsonl): JSON holds integers of any
length and floats up to 1.8e308, and arithmetic on either overflows (float(10**400) and 1e308 ** 2 raise
OverflowError; 1e308 * 10 is inf). A value is taken as a number only once it is a finite float."""

from __future__ import annotations

import math


def finite_float(value) -> float | None:
    """`value` as a finite float; None for what is no number (None, a bool, a string, a list) or is not
    finite as a float (NaN, infinity, an integer beyond float's range)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int of more than 309 digits
        return None
    return number if math.isfinite(number) else None
