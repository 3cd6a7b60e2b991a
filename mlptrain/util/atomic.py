"""Every file mlptrain writes whole goes through `replacing`: the run's files (config.yaml, summary.json,
checkpoints, features, reports) through `atomic_write`, the caches (kernels, decoded datasets) and
downloads directly. A kill, a crash or a full disk at any instant leaves the previous file or the new
one, never part of one, and no temporary file outlives the call (also on Ctrl-C).

The bytes go to a hidden temporary file in the same directory (so the rename stays on one file system),
named with random digits (several sweep workers, or threads, may write one file at once) and created
with the umask's permissions, like any file the user writes (`mkstemp`'s 0600 would hide a shared data
root's downloads from its other users). A durable write is flushed and fsynced before the rename, so the
rename cannot reach the disk before the data; cache entries skip that, since a torn entry fails its
checksum when read and is rebuilt.
"""

from __future__ import annotations

import os
import secrets
from contextlib import contextmanager, suppress
from pathlib import Path

from mlptrain.errors import UserError

TEMP_SUFFIX = ".tmp"


@contextmanager
def replacing(path: Path, binary: bool = True, durable: bool = True, prefix: str | None = None):
    """A file to write `path`'s new content to; it replaces `path` when the block ends without an error.
    OSError propagates (the caller decides what a failed write means); `prefix` names the temporary
    file (default `.NAME.`) for callers that sweep up their own interrupted writes."""
    path = Path(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    while True:
        tmp = path.with_name(f"{prefix or '.' + path.name + '.'}{secrets.token_hex(4)}{TEMP_SUFFIX}")
        try:
            fd = os.open(tmp, flags, 0o666)
            break
        except FileExistsError:  # 2^32 names: another writer's, try the next
            continue
    try:
        # text as UTF-8 whatever the locale; a non-UTF-8 file name's bytes (Python's surrogate escapes, in a data
        # path a results table or a config echoes) written back as they are, not a UnicodeEncodeError
        text = {} if binary else {"encoding": "utf-8", "errors": "surrogateescape"}
        with os.fdopen(fd, "wb" if binary else "w", **text) as file:
            yield file
            if durable:
                file.flush()
                os.fsync(file.fileno())
        os.replace(tmp, path)
        tmp = None
    finally:
        if tmp is not None:
            with suppress(OSError):  # already failing: the error that matters is the one being raised
                tmp.unlink()


@contextmanager
def atomic_write(path: Path, binary: bool = False, durable: bool = True):
    """`replacing`, for a run's own files: an OSError (a full or read-only disk) becomes one UserError line
    naming the file. `durable=False` skips the fsync, for a file derived from records that are themselves
    durable and written again soon (a sweep's results after each trial): still whole, old or new."""
    try:
        with replacing(path, binary, durable) as file:
            yield file
    except OSError as err:
        raise UserError(f"{path}: cannot write it ({err.strerror or err}); the previous file, if any, "
                        "is intact") from None


def write_text(path: Path, text: str, durable: bool = True) -> None:
    with atomic_write(path, durable=durable) as file:
        file.write(text)
