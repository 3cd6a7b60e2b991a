"""Files mlptrain reads back (its caches, a run's records, a user's inputs) opened only when they are regular
files. A FIFO blocks `open()` until a writer comes, which may be never, and a device such as /dev/zero reads
without end; opening with O_NONBLOCK returns at once, so `fstat` can say what the path is before a byte is
read. What is not a regular file raises OSError("not a regular file"), which every caller already reports
as a file it cannot read."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

_FLAGS = {"rb": os.O_RDONLY, "r": os.O_RDONLY, "a": os.O_WRONLY | os.O_APPEND | os.O_CREAT,
          "a+": os.O_RDWR | os.O_APPEND | os.O_CREAT}


def open_regular(path: str | Path, mode: str = "rb"):
    """`open(path, mode)` for mode "rb", "r", "a" or "a+", refusing a FIFO, device or socket without blocking."""
    fd = os.open(path, _FLAGS[mode] | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, mode)
    except BaseException:
        os.close(fd)
        raise


def read_regular_bytes(path: str | Path) -> bytes:
    with open_regular(path) as file:
        return file.read()


def read_regular_text(path: str | Path) -> str:
    with open_regular(path, "r") as file:
        return file.read()
