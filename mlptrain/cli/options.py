"""Option values the commands parse themselves, so that a bad one is one line (Click's own type errors
print a usage block)."""

from __future__ import annotations

from mlptrain.errors import UserError


def positive_int(text: str, flag: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise UserError(f"{flag} {text}: not an integer; give a positive one") from None
    if value < 1:
        raise UserError(f"{flag} {text}: must be >= 1")
    return value
