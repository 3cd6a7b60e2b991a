"""Every file mlptrain writes whole (config.yaml, summary.json, checkpoints, features, reports) goes
through `atomic_write`: a kill, a crash or a full disk at any instant leaves the previous file or the new
one, never part of one.

The bytes go to a temporary file in the same directory (so the rename stays on one file system), are
flushed and fsynced (so the rename cannot reach the disk before the data), then `os.replace`d onto the
name; on any failure the temporary file is removed and the old file is untouched. The temporary name
carries the process id: several sweep workers may write one results file at once.
"""

from __future__ import annotations

import os
from contextlib import contextmanager, suppress
from pathlib import Path

from mlptrain.errors import UserError


@contextmanager
def atomic_write(path: Path, binary: bool = False):
    """A file to write `path`'s new content to; it replaces `path` when the block ends without an error.
    An OSError (a full or read-only disk) becomes one UserError line naming the file."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb" if binary else "w") as file:
            yield file
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        with suppress(OSError):  # already failing: the error that matters is the one being raised
            tmp.unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise UserError(f"{path}: cannot write it ({err.strerror or err}); the previous file, if any, "
                            "is intact") from None
        raise


def write_text(path: Path, text: str) -> None:
    with atomic_write(path) as file:
        file.write(text)
