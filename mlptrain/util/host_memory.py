"""The host's memory as the operating system reports it, and how much of it mlptrain lets one thing take.

Below every layer that reads large files (datasets, the decoded-data cache, .npz headers) and below the
run's memory plan (training/memory_plan.py), which adds up what a whole run needs.
"""

from __future__ import annotations

import os

HEADROOM = 0.9  # of what is free: the allocator, the CUDA context and the interpreter need the rest


def host_available() -> int | None:
    """Bytes the host can still give (MemAvailable), or None where the system will not say."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def gib(n: int) -> str:
    return f"{n / 2**30:,.2f} GiB" if n >= 2**28 else f"{n / 2**20:,.1f} MiB"
