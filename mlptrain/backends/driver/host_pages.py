"""Host memory made for the driver to page-lock (api.pinned): an anonymous mapping of its own, in transparent huge
pages where it spans whole ones, its pages faulted in here, kept until the process ends.

Why not cuMemHostAlloc: on the GPU machine (a VM) it took ~2 ms a MB, and meanwhile every driver call of the
process's other threads waited for it: a memset ~10 ms where it takes 20 µs. A packed sweep's 16 lanes were built
(their memsets, uploads and memory queries) while their checkpoints' buffers were pinned on another thread.
Registering memory whose pages are present already, in huge pages, took 0.24 ms a MB, with the other threads'
calls at ~30 µs beside it (benchmarks/NOTES.md, issue 30 step 29).
"""

from __future__ import annotations

import mmap

import numpy as np

HUGE_PAGE = 2 << 20  # x86-64's transparent huge page: the driver maps 512x fewer pages
PAGE = mmap.PAGESIZE
_KEPT: list[mmap.mmap] = []  # registered memory is never unmapped: the driver holds its pages until the process ends


def mapped(nbytes: int) -> np.ndarray:
    """A new zeroed uint8 array of `nbytes` rounded up to whole pages (at least one), in a mapping of its own with
    every page present. Where it spans a huge page it starts on one's boundary and asks the kernel for huge pages
    (which the kernel may decline: /sys/kernel/mm/transparent_hugepage)."""
    size = -(-max(int(nbytes), 1) // PAGE) * PAGE
    huge = size >= HUGE_PAGE
    flags = getattr(mmap, "MAP_PRIVATE", None), getattr(mmap, "MAP_ANONYMOUS", None)
    length = size + (HUGE_PAGE if huge else 0)  # room to start on a huge page's boundary
    if None in flags:
        mapping = mmap.mmap(-1, length)
    else:  # private: shared anonymous memory gets huge pages only where shmem's setting allows them
        mapping = mmap.mmap(-1, length, flags=flags[0] | flags[1])
    _KEPT.append(mapping)
    whole = np.frombuffer(mapping, np.uint8)
    start = (-whole.ctypes.data) % HUGE_PAGE if huge else 0
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if huge and advice is not None:
        mapping.madvise(advice, start, size // HUGE_PAGE * HUGE_PAGE)
    pages = whole[start:start + size]
    pages[::PAGE] = 0  # each page faulted in here, not while the driver pins it (under its lock)
    return pages
