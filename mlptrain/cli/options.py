"""Option values the commands parse themselves, so that a bad one is one line (Click's own type errors
print a usage block)."""

from __future__ import annotations

from mlptrain.errors import UserError
from mlptrain.safe_yaml import brief_text


MAX_INT = 2**31 - 1  # what liblinear's iteration count and a batch's rows (int32 offsets) can hold


def positive_int(text: str, flag: str, maximum: int = MAX_INT) -> int:
    shown = brief_text(text, 40)
    try:
        value = int(text) if len(text) < 40 else None
    except ValueError:
        value = None
    if value is None:
        raise UserError(f"{flag} {shown}: not an integer; give one in [1, {maximum:,}]") from None
    if not 1 <= value <= maximum:
        raise UserError(f"{flag} {shown}: must be in [1, {maximum:,}]")
    return value
