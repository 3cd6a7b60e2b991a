"""A run's TensorBoard images as PNG, made on its logger's thread or, for runs that train several at once on a GPU,
in a process of their own ("apart").

A packed sweep's lanes (mlptrain.packing.lane_group) are fed by one thread, and each lane's logger drew its
confusion images on a thread of its own: ~2.3 ms of drawing and ~4 ms of PNG compression an image, 16 lanes, one
or two images an epoch each, ~1.5 s of CPU in a 10-epoch sweep, holding the interpreter that the feeding thread
needs between its driver calls: that thread's calls took about twice their CPU time, and the GPU waited for it
at the reads. With no images drawn at all, a 16-lane sweep's GPU idled 0.19-0.31 s instead of 0.48-0.87 s on an
H100's host; drawn here, 0.35-0.49 s against 0.50-0.51 s (benchmarks/NOTES.md, issue 30 step 16). A process of
their own holds no interpreter of the training's.

A drawing process that cannot start or dies is a fallback: the images are drawn on the logger's thread, as
before, one warning line says so, and the run records it (`on_fallback`).
"""

from __future__ import annotations

import atexit
import io
import os
import signal
import threading
from concurrent.futures import Future

from mlptrain.util.console import warn

DRAWING_PROCESSES = 2  # a 16-lane sweep makes ~25 images an epoch of ~0.17 s, ~6 ms each


def png(draw) -> tuple[int, int, int, bytes]:
    """`draw()`'s (H, W, C) image (uint8, or floats in [0, 1], as tensorboardX's add_image takes them) as PNG:
    its height, width, channels and bytes."""
    # imported on first use: only a run that logs an image needs Pillow, and the sweep command forks its
    # processes before anything imports NumPy (mlptrain.sweep.prefork)
    import numpy as np
    from PIL import Image

    image = np.asarray(draw())
    if image.shape[2] == 1:  # grey, drawn as RGB (as add_image does)
        image = np.concatenate([image] * 3, axis=2)
    if image.dtype != np.uint8:
        image = (image * 255.0).astype(np.uint8)  # add_image's scaling
    height, width, channels = image.shape
    out = io.BytesIO()
    Image.fromarray(image).save(out, format="PNG")
    return height, width, channels, out.getvalue()


class Drawing:
    """Where images become PNG: `png_later(draw)` is a Future of `png(draw)`, made apart (in this process's
    drawing processes, started on first use) or here, on the caller's thread, when it is asked for."""

    def __init__(self, apart: bool, on_fallback=None):
        self.apart, self.on_fallback = apart, on_fallback
        self.fallback: str | None = None  # the line saying why images are drawn here after all

    def png_later(self, draw) -> Future | None:
        """None: drawn by `png_of`, on the logger's thread."""
        if self.apart and self.fallback is None:
            try:
                return _processes().submit(png, draw)
            except Exception as err:  # no process could start (or it died): drawn here, said once
                self._fall_back(err)
        return None

    def png_of(self, later: Future | None, draw) -> tuple[int, int, int, bytes]:
        """The PNG `png_later(draw)` made, or `png(draw)` made now where it made none (here, or its process
        failed)."""
        if later is not None:
            try:
                return later.result()
            except Exception as err:  # the process died or could not run it: a drawing error itself raises here
                if not _process_failure(err):
                    raise
                self._fall_back(err)
        return png(draw)

    def _fall_back(self, err: BaseException) -> None:
        with _POOL_LOCK:  # the logger's thread and the training's may both meet a dead process
            said, self.fallback = self.fallback, self.fallback or warn(
                "logging: TensorBoard images drawn beside the training, not in a process of their own "
                f"({type(err).__name__}: {err or 'no reason given'})")
        if said is None and self.on_fallback is not None:
            self.on_fallback(self.fallback)


def _process_failure(err: BaseException) -> bool:
    # imported on first use, as the pool itself (_processes): only runs drawn apart need it
    from concurrent.futures.process import BrokenProcessPool

    return isinstance(err, (BrokenProcessPool, OSError, EOFError))


_POOL: dict[int, object] = {}  # this process's drawing processes (by pid: a forked sweep worker makes its own)
_POOL_LOCK = threading.Lock()


def _processes():
    with _POOL_LOCK:
        pool = _POOL.get(os.getpid())
        if pool is None:
            # imported on first use: only runs drawn apart need processes
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            # spawned, not forked: a forked child of a process with a CUDA context and threads may hang
            pool = _POOL[os.getpid()] = ProcessPoolExecutor(DRAWING_PROCESSES, initializer=_deaf_to_ctrl_c,
                                                            mp_context=multiprocessing.get_context("spawn"))
            atexit.register(_close)
        return pool


def _deaf_to_ctrl_c() -> None:
    """A drawing process's start: Ctrl-C reaches the whole process group, and is the training's to handle (its
    runs stop after their step and write their checkpoints); a drawing process it ended would be a fallback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _close() -> None:
    """At exit, before the interpreter takes its modules apart: an executor collected after that prints an
    error from its own clean-up."""
    with _POOL_LOCK:  # this process's own: a forked child's copy of its parent's is no executor of its
        pool = _POOL.pop(os.getpid(), None)
    if pool is not None:
        pool.shutdown(wait=True)
