"""Files mlptrain reads back (its caches, a run's records, a user's inputs) opened only when they are regular
files. A FIFO blocks `open()` until a writer comes, which may be never, and a device such as /dev/zero reads
without end; opening with O_NONBLOCK returns at once, so `fstat` can say what the path is before a byte is
read. What is not a regular file raises OSError("not a regular file"), which every caller already reports
as a file it cannot read.

A run's own files (its lock, metrics.jsonl, checkpoints, a sweep's logs) are opened with `follow=False`: a
symbolic link put in their place is refused (OSError "a symbolic link, not the run's own file"), so that
nothing is ever appended or truncated through it (a `.lock` linked to a system file, opened as root, would
destroy that file), nor read through it into a report or a refusal's quoted line. A file opened for writing
must also have no other hard link, for the same reason."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

_FLAGS = {"rb": os.O_RDONLY, "r": os.O_RDONLY, "a": os.O_WRONLY | os.O_APPEND | os.O_CREAT,
          "a+": os.O_RDWR | os.O_APPEND | os.O_CREAT, "r+b": os.O_RDWR | os.O_CREAT}
LINK = "a symbolic link, not the run's own file"


def open_regular(path: str | Path, mode: str = "rb", follow: bool = True):
    """`open(path, mode)` for mode "rb", "r", "a", "a+" (read and append, made when missing) or "r+b" (read and
    write, made when missing), refusing a FIFO, device or socket without blocking; with `follow=False` also a
    symbolic link, and for writing a file with another hard link."""
    fd = open_descriptor(path, _FLAGS[mode] | os.O_NONBLOCK, follow)
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        if not follow and mode not in ("r", "rb") and status.st_nlink > 1:
            raise OSError(errno.EMLINK, "a hard link to another file, not the run's own file", str(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, mode)
    except BaseException:
        os.close(fd)
        raise


def open_descriptor(path: str | Path, flags: int, follow: bool = True, mode: int = 0o666) -> int:
    """`os.open`; with `follow=False` a symbolic link at `path` raises OSError(ELOOP, LINK)."""
    flags |= os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        return os.open(path, flags, mode)
    except OSError as err:
        if not follow and err.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, LINK, str(path)) from None
        raise


def read_regular_bytes(path: str | Path, follow: bool = True) -> bytes:
    with open_regular(path, follow=follow) as file:
        return file.read()


def read_regular_text(path: str | Path, follow: bool = True) -> str:
    with open_regular(path, "r", follow) as file:
        return file.read()
