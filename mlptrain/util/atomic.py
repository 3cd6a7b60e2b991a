"""Every file mlptrain writes whole goes through `replacing`: the run's files (config.yaml, summary.json,
checkpoints, features, reports) through `atomic_write`, the caches (kernels, decoded datasets) and
downloads directly. A kill, a crash or a full disk at any instant leaves the previous file or the new
one, never part of one, and no temporary file outlives the call (also on Ctrl-C), but `write_ahead`'s, which
its owner holds until it commits or discards it.

The bytes go to a hidden temporary file in the same directory (so the rename stays on one file system),
named with random digits (several sweep workers, or threads, may write one file at once) and created
with the umask's permissions, like any file the user writes (`mkstemp`'s 0600 would hide a shared data
root's downloads from its other users). A durable write is flushed and fsynced before the rename, so the
rename cannot reach the disk before the data; cache entries skip that, since a torn entry fails its
checksum when read and is rebuilt.

A command's output written without --force must not replace a file, also one that another process made
while this one worked (two `export --out x` at once): with `overwrite=False` the finished temporary file
is hard-linked to the final name, which fails if the name exists, rather than renamed over it. A file
system without hard links gets the name claimed with O_CREAT | O_EXCL and then replaced by the rename.
The final name, a link or not, is replaced by the rename, never written through.
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
from contextlib import contextmanager, suppress
from pathlib import Path

from mlptrain.errors import UserError

TEMP_SUFFIX = ".tmp"


@contextmanager
def replacing(path: Path, binary: bool = True, durable: bool = True, prefix: str | None = None,
              overwrite: bool = True):
    """A file to write `path`'s new content to; it replaces `path` when the block ends without an error
    (without `overwrite`, it becomes `path` only where no file has that name: FileExistsError otherwise).
    OSError propagates (the caller decides what a failed write means); `prefix` names the temporary
    file (default `.NAME.`) for callers that sweep up their own interrupted writes."""
    path = Path(path)
    tmp, fd = _temporary(path, prefix)
    try:
        # text as UTF-8 whatever the locale; a non-UTF-8 file name's bytes (Python's surrogate escapes, in a data
        # path a results table or a config echoes) written back as they are, not a UnicodeEncodeError
        text = {} if binary else {"encoding": "utf-8", "errors": "surrogateescape"}
        with os.fdopen(fd, "wb" if binary else "w", **text) as file:
            yield file
            if durable:
                file.flush()
                os.fsync(file.fileno())
        if overwrite:
            os.replace(tmp, path)
        else:
            _link_new(tmp, path)
        tmp = None
    finally:
        if tmp is not None:
            with suppress(OSError):  # already failing: the error that matters is the one being raised
                tmp.unlink()


def _temporary(path: Path, prefix: str | None) -> tuple[Path, int]:
    """A new hidden file beside `path` (named `prefix` or `.NAME.`, random digits, TEMP_SUFFIX) and its
    descriptor, open for writing."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    while True:
        tmp = path.with_name(f"{prefix or '.' + path.name + '.'}{secrets.token_hex(4)}{TEMP_SUFFIX}")
        try:
            return tmp, os.open(tmp, flags, 0o666)
        except FileExistsError:  # 2^32 names: another writer's, try the next
            continue


def write_ahead(path: Path, write) -> Path:
    """`path`'s next content, written by `write(file)` (binary) to a hidden temporary file beside it, flushed and
    fsynced, whose name is returned: it becomes `path` at `commit_ahead`, once the files that must reach the
    disk before it have, or goes at `discard_ahead`. For a file whose bytes are known long before it may
    appear (a run's held `best` checkpoint, which must not run ahead of its `last`: written while the GPU
    trains instead of at the run's end). An OSError becomes one UserError line naming `path`, the
    temporary file removed."""
    path = Path(path)
    tmp = None
    try:
        tmp, fd = _temporary(path, None)
        with os.fdopen(fd, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        return tmp
    except BaseException as err:
        if tmp is not None:
            discard_ahead(tmp)
        if isinstance(err, OSError):
            raise _cannot_write(path, err) from None
        raise


def commit_ahead(tmp: Path, path: Path) -> None:
    """`write_ahead`'s file `tmp` renamed over `path`; an OSError becomes one UserError line, `tmp` removed."""
    try:
        os.replace(tmp, path)
    except OSError as err:
        discard_ahead(tmp)
        raise _cannot_write(path, err) from None


def discard_ahead(tmp: Path) -> None:
    """`write_ahead`'s file `tmp` removed, where it still is."""
    with suppress(OSError):
        tmp.unlink()


def _link_new(tmp: Path, path: Path) -> None:
    """`tmp` renamed to `path` where `path` does not exist; FileExistsError where it does."""
    try:
        os.link(tmp, path, follow_symlinks=False)
    except OSError as err:
        if err.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP):
            raise  # FileExistsError among them: the name is another's
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666))
        os.replace(tmp, path)  # over the empty file this process made just above
        return
    with suppress(OSError):  # `path` is written whole: the temporary name is only a second link to it
        tmp.unlink()


@contextmanager
def atomic_write(path: Path, binary: bool = False, durable: bool = True, overwrite: bool = True):
    """`replacing`, for a run's own files and the commands' outputs: an OSError (a full or read-only disk)
    becomes one UserError line naming the file, as does a file made at `path` meanwhile when not
    `overwrite`. `durable=False` skips the fsync, for a file derived from records that are themselves
    durable and written again soon (a sweep's results after each trial): still whole, old or new."""
    try:
        with replacing(path, binary, durable, overwrite=overwrite) as file:
            yield file
    except OSError as err:
        if not overwrite and isinstance(err, FileExistsError):
            raise UserError(f"{path} exists (another process made it while this one worked); add --force to "
                            "overwrite it") from None
        raise _cannot_write(path, err) from None


def _cannot_write(path: Path, err: OSError) -> UserError:
    return UserError(f"{path}: cannot write it ({err.strerror or err}); the previous file, if any, is intact")


def link_whole(source: Path, path: Path) -> None:
    """`path` made a second name of the file `source`, written whole already (a run's `best` checkpoint
    when it holds the same arrays as the `last` just written: 8 MB and 15-20 ms not written again). The
    link is made under a temporary name and renamed over `path`, so a kill leaves the previous `path` or the
    new one; a later write of either name replaces that name (`replacing`), never the shared file. Where
    the file system has no hard links, `path` is written as a copy. An OSError becomes one UserError line,
    as in `atomic_write`."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}{TEMP_SUFFIX}")
    try:
        try:
            os.link(source, tmp, follow_symlinks=False)
        except OSError as err:
            if err.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP):
                raise
            with replacing(path) as file, open(source, "rb") as whole:
                shutil.copyfileobj(whole, file)
            return
        try:
            os.replace(tmp, path)
        except BaseException:
            with suppress(OSError):  # already failing: the error that matters is the one being raised
                tmp.unlink()
            raise
    except OSError as err:
        raise _cannot_write(path, err) from None


def write_text(path: Path, text: str, durable: bool = True, overwrite: bool = True) -> None:
    with atomic_write(path, durable=durable, overwrite=overwrite) as file:
        file.write(text)
