"""Where compiled kernels live on disk: one file per kernel, written atomically, checked when read.

An entry is `MAGIC`, the sha256 of its payload, a newline, then the payload (numba-cuda's pickled
kernel: PTX and cubin). A reader that finds a bad magic, a digest that does not match (a truncated
or flipped file) or a payload that does not load drops the entry with one warning and the kernel is
compiled again. Writers write a temporary file in the entry's folder and rename it into place, so
two processes filling the cache at once each leave a whole entry (the last rename wins; both are
the same kernel). A folder that cannot be written (read-only, full disk) turns the store off for the
rest of the process with one warning: kernels are then compiled in memory, as without a cache.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

from mlptrain.util.atomic import replacing
from mlptrain.util.regular_file import read_regular_bytes, read_regular_text
from mlptrain.util.user_paths import cache_folder

CACHE_ENV = "MLPTRAIN_KERNEL_CACHE"
MAGIC = b"MLPTRAIN-KERNEL-1\n"
SUFFIX = ".kernel"
SHARD = re.compile(r"[0-9a-f]{2}")  # an entry's folder: its key's first two digits
ENTRY = re.compile(r"[0-9a-f]{64}\.kernel")  # a sha256 key
STRAY = re.compile(r"\.[0-9a-f]{16}\..*\.tmp")  # a write that did not finish (see `put`)
LAST_RUN = "last-run.json"  # what the latest process that trained did with the cache (`mlptrain cache`)


def default_dir() -> Path | None:
    """$MLPTRAIN_KERNEL_CACHE (a folder; `off` disables the cache), else the user cache folder:
    $XDG_CACHE_HOME/mlptrain/kernels or ~/.cache/mlptrain/kernels."""
    return cache_folder(CACHE_ENV, "kernels")


def warn(message: str) -> None:
    """One warning line on stderr (the kernel package knows nothing of the CLI's console)."""
    print(f"warning: {message}", file=sys.stderr, flush=True)


def _listing(folder: Path) -> list[Path]:
    """What `folder` holds; nothing when it cannot be read (as a glob would see it)."""
    try:
        return list(folder.iterdir())
    except OSError:
        return []


class KernelStore:
    """Entries by key (a hex digest) under `root`; `None` as root stores nothing."""

    def __init__(self, root: Path | str | None):
        self.root = None if root is None else Path(root)
        self.writable = root is not None
        self.dropped = 0  # corrupt entries found and removed

    def path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}{SUFFIX}"

    def contains(self, key: str) -> bool:
        return self.root is not None and self.path(key).is_file()

    def get(self, key: str) -> bytes | None:
        """The payload stored under `key`, or None (absent, unreadable or corrupt: then removed)."""
        if self.root is None:
            return None
        path = self.path(key)
        try:
            data = read_regular_bytes(path)  # a FIFO would block, a device never end
        except FileNotFoundError:
            return None
        except OSError as err:
            warn(f"kernel cache entry {path} could not be read ({err.strerror}); compiling it")
            return None
        head, _, payload = data[len(MAGIC):].partition(b"\n")
        if not data.startswith(MAGIC) or head.decode("ascii", "replace") != hashlib.sha256(payload).hexdigest():
            self.drop(key, "is corrupt or truncated")
            return None
        return payload

    def drop(self, key: str, why: str) -> None:
        """Remove a bad entry (one warning line); the caller compiles the kernel again."""
        self.dropped += 1
        path = self.path(key)
        warn(f"kernel cache entry {path.name} {why}; rebuilding it")
        try:
            path.unlink()
        except OSError:
            pass

    def put(self, key: str, payload: bytes) -> bool:
        """Store `payload` under `key` atomically; False (and the store off) when the folder cannot be
        written."""
        if not self.writable:
            return False
        path = self.path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with replacing(path, durable=False, prefix=f".{key[:16]}.") as f:
                f.write(MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)
            return True
        except OSError as err:
            self.writable = False
            warn(f"the kernel cache {self.root} cannot be written ({err.strerror or err}); "
                 "compiling kernels in memory for this run")
            return False

    def empty(self) -> bool:
        """No entry at all (cheaper than listing them)."""
        return not any(ENTRY.fullmatch(p.name) for shard in self.shards() for p in _listing(shard))

    def shards(self) -> list[Path]:
        """The two-hex-digit folders entries live in: only these are ever listed or removed, so a cache
        folder pointed at a folder that holds other things (MLPTRAIN_KERNEL_CACHE=~) loses none of them."""
        if self.root is None or not self.root.is_dir():
            return []
        return sorted(p for p in _listing(self.root) if SHARD.fullmatch(p.name) and p.is_dir())

    def entries(self) -> list[Path]:
        return sorted(p for shard in self.shards() for p in _listing(shard) if ENTRY.fullmatch(p.name))

    def clear(self) -> int:
        """Remove every entry, the temporary files of interrupted writes and the shards left empty;
        returns the entries removed."""
        removed = 0
        for path in self.entries():
            path.unlink(missing_ok=True)
            removed += 1
        for shard in self.shards():
            for stray in _listing(shard):
                if STRAY.fullmatch(stray.name):
                    stray.unlink(missing_ok=True)
            try:
                shard.rmdir()  # only when empty: otherwise the OS refuses, and it stays
            except OSError:
                pass
        if self.root is not None and self.root.is_dir():
            for stray in self.root.glob(".last-run.*.tmp"):
                stray.unlink(missing_ok=True)
        return removed

    def size(self) -> int:
        return sum(path.stat().st_size for path in self.entries())

    def write_last_run(self, record: dict) -> None:
        """Record a process's hits and misses for `mlptrain cache info`; a folder that cannot be written
        has already said so, so this stays quiet."""
        if not self.writable:
            return
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            with replacing(self.root / LAST_RUN, binary=False, durable=False, prefix=".last-run.") as f:
                json.dump(record, f, indent=1)
        except OSError:
            pass

    def last_run(self) -> dict | None:
        """The record write_last_run left, or None when there is none or it is no JSON object."""
        try:
            record = json.loads(read_regular_text(self.root / LAST_RUN))
        except (OSError, ValueError, TypeError, RecursionError):  # RecursionError: nested too deeply
            return None
        return record if isinstance(record, dict) else None
