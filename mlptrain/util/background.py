"""Threads of this process that do host work behind the one that trains: writing files, telling a study.

A packed sweep's lanes (mlptrain.packing.lane_group) end their epochs together, and the host's work for each
lane, taken in turn while the GPU waits, bounds the sweep. Work that nothing waits for right away goes here, and
its caller waits for it where the result is needed (a Future). The pools are made on first use in each process:
a forked sweep worker (mlptrain.sweep.forked) makes its own, as a parent's threads do not survive a fork.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

_POOLS: dict[tuple[int, str], ThreadPoolExecutor] = {}
_LOCK = threading.Lock()


def pool(name: str, threads: int) -> ThreadPoolExecutor:
    """This process's pool `name`, of `threads` threads (tasks of a one-thread pool run in the order given)."""
    with _LOCK:
        key = (os.getpid(), name)
        found = _POOLS.get(key)
        if found is None:
            found = _POOLS[key] = ThreadPoolExecutor(threads, thread_name_prefix=f"mlptrain-{name}")
        return found


class Waitable:
    """A Future as a packed run yields it (mlptrain.packing.side_by_side passes a run over until its mark is
    done, and waits for the first when every run waits)."""

    __slots__ = ("future",)

    def __init__(self, future: Future):
        self.future = future

    def done(self) -> bool:
        return self.future.done()

    def wait(self) -> None:
        self.future.exception()  # returns once the task ended; its error is raised where its result is taken
