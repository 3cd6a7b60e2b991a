"""Option values the commands parse themselves, so that a bad one is one line (Click's own type errors
print a usage block)."""

from __future__ import annotations

from pathlib import Path

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


def new_output(path: Path, force: bool) -> Path:
    """`path` may be written: its folder exists, it is not a folder, and it does not exist unless `force`
    (results are not replaced without a word)."""
    if path.is_dir():
        raise UserError(f"--out {path}: is a directory; name a file in it")
    if not path.parent.is_dir():
        raise UserError(f"--out {path}: no such directory {path.parent}")
    if path.exists() and not force:
        raise UserError(f"{path} exists; add --force to overwrite it, or --out another file")
    return path


BACKEND_HELP = "where the model runs: cpu (the default), cuda or auto"


def backend_name(text: str) -> str:
    if text not in ("cpu", "cuda", "auto"):
        raise UserError(f"--backend {text}: use cpu, cuda or auto")
    return text
