"""One process at a time in a run directory, and only where it can write.

A process that writes into a run (`run`, `run --resume`, a sweep's trial, `extract-features` and `svm`
writing their output there) first takes an exclusive `flock` on the run's `.lock` file and keeps it until
it exits or releases it: the kernel drops the lock when the process dies, however it dies, so a killed
run never leaves a stale lock behind. A second process asking for the same run is refused with one line.

Taking the lock also proves the folder writable (the lock file is created there); `check_space` then
compares the free space with what the run will write, so a read-only or full disk is one line before
any work is done rather than a failure after it.

The lock file is truncated and given the holder's pid, so it is opened without following a link and
must be the run's own file (mlptrain.util.regular_file): a `.lock` linked to a file outside the run is
refused, never overwritten.
"""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
import shutil
from contextlib import suppress
from pathlib import Path

from mlptrain.errors import UserError
from mlptrain.util.regular_file import open_regular

LOCK_NAME = ".lock"
_held: dict[Path, int] = {}  # run directory -> the open lock file's descriptor


def lock_run(run_dir: Path, purpose: str) -> None:
    """Hold `run_dir`'s lock until this process exits (or `release_run`); `purpose` says, in the refusal,
    what needs it (e.g. "--resume")."""
    key = Path(run_dir).resolve()
    if key in _held:
        return
    try:
        lock = open_regular(key / LOCK_NAME, "r+b", follow=False)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.EMLINK, errno.EINVAL):  # a link or a FIFO put in its place
            raise UserError(f"{run_dir / LOCK_NAME}: {err.strerror}; mlptrain writes nothing through it: remove "
                            "it (no process holds a lock there)") from None
        raise UserError(f"{run_dir}: cannot write in it ({_reason(err)}); {purpose} writes into the run "
                        "directory") from None
    fd = os.dup(lock.fileno())  # the descriptor is the lock: kept open, without a file object to close it
    lock.close()
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
        os.close(fd)
        if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise UserError(f"{run_dir}: cannot lock it ({_reason(err)})") from None
        raise UserError(f"{run_dir}: another process{f' (pid {holder})' if holder.isdigit() else ''} is working "
                        f"in this run, and {purpose} needs the run to itself; try again once that process has "
                        "finished (this command does not wait)") from None
    with suppress(OSError):  # the pid is only for the message above: a full disk must not stop the lock
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _held[key] = fd


def release_run(run_dir: Path) -> None:
    fd = _held.pop(Path(run_dir).resolve(), None)
    if fd is not None:
        os.close(fd)  # closing the descriptor drops the flock


def check_space(folder: Path, need: int, what: str) -> None:
    """Refuse when `folder`'s file system has less than `need` bytes free for `what`."""
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return  # a file system that does not say: the write itself will tell, in one line
    if free < need:
        raise UserError(f"{folder}: {free / 2**20:,.1f} MiB free on its disk, and {what} needs about "
                        f"{need / 2**20:,.1f} MiB; free some space or use another --runs-dir")


def _reason(err: OSError) -> str:
    return "read-only file system" if err.errno == errno.EROFS else err.strerror or str(err)


def claim_output(path: Path, purpose: str) -> None:
    """Before the work that ends in writing `path`: lock its folder when that is a run directory (else
    prove the folder writable), so a read-only disk or a busy run is one line before, not after."""
    folder = Path(path).parent
    if (folder / "config.yaml").is_file():
        lock_run(folder, purpose)
        return
    probe = folder / f".{Path(path).name}.{secrets.token_hex(4)}.probe"
    try:  # O_EXCL: a new file of a name nobody could foresee, never one made through a link put there
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666))
        probe.unlink()
    except OSError as err:
        raise UserError(f"{path}: cannot write in {folder} ({_reason(err)})") from None
