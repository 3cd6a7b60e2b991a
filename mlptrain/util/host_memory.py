"""The host's memory as the operating system reports it, and how much of it mlptrain lets one thing take.

Below every layer that reads large files (datasets, the decoded-data cache, .npz headers) and below the
run's memory plan (training/memory_plan.py), which adds up what a whole run needs.

What this process may still take is the least of three: what the host has free (MemAvailable), what its
own address-space limit leaves (`ulimit -v`, RLIMIT_AS, less what the process has mapped already), and
what its control group leaves (a container's or a systemd slice's memory limit, less what the group
uses). A run sized by the first alone ended, under either of the others, in a MemoryError traceback.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path

HEADROOM = 0.9  # of what is free: the allocator, the CUDA context and the interpreter need the rest
THREADS_RESERVED = 8  # threads a run may still start (the event writer's, its queue's, BLAS's): each maps a stack
CGROUP_ROOT = Path("/sys/fs/cgroup")
# (limit, usage) files of cgroup v2 and of v1's memory controller; an unlimited one reads "max" or a huge number
CGROUP_FILES = (("memory.max", "memory.current"), ("memory.limit_in_bytes", "memory.usage_in_bytes"))


def host_available() -> int | None:
    """Bytes this process can still allocate: the least of the host's, its address-space limit's and its
    control group's; None where none of them says."""
    return _least()[0]


def binding_limit() -> str:
    """Which limit `host_available` reports, in words for a refusal: "" for the host's free memory."""
    return _least()[1]


def _least() -> tuple[int | None, str]:
    known = [(n, why) for n, why in ((_meminfo_available(), ""), (address_space_available(), "ulimit -v"),
                                     (cgroup_available(), "the control group's memory limit")) if n is not None]
    return min(known, key=lambda pair: pair[0]) if known else (None, "")


def _meminfo_available() -> int | None:
    """Bytes the host can still give (MemAvailable)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def address_space_available(status: Path = Path("/proc/self/status")) -> int | None:
    """What RLIMIT_AS (`ulimit -v`) leaves: the limit less what the process maps now (VmSize) and the stacks
    of the threads it may still start; None when there is no limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    mapped = 0
    try:
        for line in status.read_text().splitlines():
            if line.startswith("VmSize:"):
                mapped = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    stack, _ = resource.getrlimit(resource.RLIMIT_STACK)
    stack = 8 * 2**20 if stack == resource.RLIM_INFINITY or stack <= 0 else stack
    return max(soft - mapped - THREADS_RESERVED * stack, 0)


def cgroup_available(root: Path = CGROUP_ROOT, membership: Path = Path("/proc/self/cgroup")) -> int | None:
    """What the memory limits of this process's control group and of every group above it leave (limit less
    usage, the least of them); None where no limit is set or none can be read. Inside a container the path
    /proc/self/cgroup names may not exist under the mount, whose root is then the container's own group."""
    least = None
    for folder in _cgroup_folders(root, membership):
        for limit_name, usage_name in CGROUP_FILES:
            try:
                limit_text = (folder / limit_name).read_text().strip()
                if limit_text == "max":
                    continue
                left = int(limit_text) - int((folder / usage_name).read_text().strip())
            except (OSError, ValueError):
                continue
            if int(limit_text) < 2**60:  # v1 writes "no limit" as the largest page-aligned int64
                least = max(left, 0) if least is None else min(least, max(left, 0))
    return least


def _cgroup_folders(root: Path, membership: Path) -> list[Path]:
    """The folders of this process's memory groups (v2's unified one, v1's memory controller) and their
    ancestors, as far as they exist under `root`."""
    try:
        lines = membership.read_text().splitlines()
    except OSError:
        lines = []
    folders = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3 or not (parts[0] == "0" or "memory" in parts[1].split(",")):
            continue
        mounts = (root, root / "unified") if parts[0] == "0" else (root / "memory",)
        for mount in mounts:
            path = mount / parts[2].lstrip("/")
            while True:
                if path.is_dir() and path not in folders:
                    folders.append(path)
                if path == mount or mount not in path.parents:
                    break
                path = path.parent
    return folders


def out_of_memory(err: BaseException) -> str:
    """The one line for an allocation that failed (a MemoryError, or a thread that could not start): what was
    asked, where NumPy says, and which limit binds."""
    said = str(err).strip()
    asked = said.replace("Unable to allocate", "allocating") if said.startswith("Unable to allocate") else \
        "starting a thread" if "thread" in said else "an allocation"
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    limits = [f"ulimit -v {soft // 1024} (kB)"] if soft != resource.RLIM_INFINITY else []
    if cgroup_available() is not None:
        limits.append("its control group's memory limit")
    bound = f" under {' and '.join(limits)}" if limits else ""
    return (f"out of memory: {asked} failed{bound}; use a smaller model, batch or dataset"
            f"{', or raise the limit' if limits else ', or free some memory'}")


def is_out_of_memory(err: BaseException) -> bool:
    """A MemoryError, or Python's "can't start new thread" (a thread's stack is memory too)."""
    return isinstance(err, MemoryError) or (isinstance(err, RuntimeError) and "can't start new thread" in str(err))


def gib(n: int) -> str:
    return f"{n / 2**30:,.2f} GiB" if n >= 2**28 else f"{n / 2**20:,.1f} MiB"
