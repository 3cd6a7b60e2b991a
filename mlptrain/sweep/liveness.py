"""Whether a trial's worker is alive: the process that claimed it (host, boot id, pid, start time), and its
heartbeat.

A heartbeat alone cannot tell a dead worker from a busy one: a worker starved of CPU misses its beats while
still training. So a trial whose worker ran on this machine is abandoned only when that process is gone (no
such pid, a zombie, or a pid reused by a process started later); the heartbeat decides only for workers on
other machines.
"""

from __future__ import annotations

import os
import socket
from functools import lru_cache
from pathlib import Path

WORKER = "mlptrain:worker"  # the trial's system attribute naming the process that runs it
HEARTBEAT_S = 10  # how often a running trial says it is alive
GRACE_S = 30  # silence after which its worker is taken for dead and the trial is queued again


@lru_cache(maxsize=1)
def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _stat_fields(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name (the state first); raises OSError."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def process_start(pid: int) -> int | None:
    """The process's start time (clock ticks after boot) from /proc, or None where there is no /proc."""
    try:
        return int(_stat_fields(pid)[19])
    except (OSError, IndexError):
        return None


def this_worker() -> dict:
    """What identifies this process among all workers of a study."""
    pid = os.getpid()
    return {"host": socket.gethostname(), "boot": _boot_id(), "pid": pid, "started": process_start(pid)}


def process_alive(pid: int, started: int | None) -> bool:
    """Whether process `pid` of this machine, started at `started` (ticks after boot), still runs."""
    try:
        fields = _stat_fields(pid)
    except FileNotFoundError:
        return False
    except OSError:  # no /proc (not Linux): the pid alone
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # someone else's process: it exists
            pass
        return True
    if fields[0] in ("Z", "X"):  # exited, not yet reaped by its parent
        return False
    return started is None or int(fields[19]) == started


def on_this_machine(worker: dict) -> bool:
    return worker.get("host") == socket.gethostname() and worker.get("boot") == _boot_id()


def gone(worker: dict | None, last_sign_of_life, now, grace_s: float) -> bool:
    """Whether a running trial's worker is gone: `worker` (this_worker() of the process that claimed it, None
    when none was recorded) dead on this machine, else silent for `grace_s` since `last_sign_of_life` (its
    latest heartbeat; None: none yet, which proves nothing)."""
    if worker is not None and on_this_machine(worker):
        return not process_alive(worker["pid"], worker.get("started"))
    return last_sign_of_life is not None and (now - last_sign_of_life).total_seconds() > grace_s
