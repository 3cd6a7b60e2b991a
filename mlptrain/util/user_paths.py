"""Paths a user gives through the environment or a config (`~/data`, `~alice/cache`), with `~` expanded, and
the user's cache folder. Path.expanduser() and Path.home() raise RuntimeError for a `~user` with no such user
or a process with no home directory (no $HOME, no passwd entry: a container's arbitrary uid); that becomes
one line naming the setting."""

from __future__ import annotations

import os
from pathlib import Path

from mlptrain.errors import UserError


def expand_user(value: str, what: str) -> Path:
    """Path(value) with a leading `~` or `~user` expanded; UserError naming `what` when it cannot be."""
    try:
        return Path(value).expanduser()
    except RuntimeError:
        tilde = value.split("/", 1)[0]
        raise UserError(f"{what}={value}: cannot expand {tilde} (no such user, or no home directory); give the "
                        f"full path") from None


def readable(text: str) -> str:
    """`text` with the bytes of a non-UTF-8 file name shown as \\xNN: Python keeps such bytes in a str as lone
    surrogates ('\\udcff'), which no UTF-8 writer accepts (TensorBoard's protobuf strings ended a run in a
    UnicodeEncodeError before its summary.json). For what is shown, not for a path to open again."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


OFF = ("", "0", "off", "none", "false")  # a cache variable set to one of these turns that cache off


def cache_folder(env: str, name: str) -> Path | None:
    """The folder of one of mlptrain's caches: $`env` (None when it says off), else the user cache
    folder's mlptrain/`name`."""
    value = os.environ.get(env)
    if value is not None:
        return None if value.strip().lower() in OFF else expand_user(value, env)
    return user_cache_dir() / "mlptrain" / name


def user_cache_dir() -> Path:
    """$XDG_CACHE_HOME, else ~/.cache."""
    base = os.environ.get("XDG_CACHE_HOME")
    if base:
        return expand_user(base, "XDG_CACHE_HOME")
    try:
        return Path.home() / ".cache"
    except RuntimeError:
        raise UserError("no home directory to keep mlptrain's caches in ($HOME is unset and the user has "
                        "none); set XDG_CACHE_HOME, or MLPTRAIN_DATA_DIR and the cache variables") from None
