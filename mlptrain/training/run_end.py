"""A run's last files, written by a thread behind the one that trains.

When a packed group's lanes end their runs together, each run's last files (its event files and metrics closed
and synced, the grad-norm record, summary.json, the kernel cache's last-run record) took ~12 ms of writes and
fsyncs, 16 runs in turn on the thread that feeds the GPU (benchmarks/NOTES.md, issue 30 step 20). Here they
are written by a pool of threads, a run's in order (summary.json last: a run folder holding it is complete),
while the thread goes on with the other runs. What they read from the device is read before, on that thread.
"""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path

import numpy as np

from mlptrain.run_dirs.records import write_json
from mlptrain.training.compilation import write_last_run
from mlptrain.training.session import Session
from mlptrain.training.summary import GRAD_NORMS, fallbacks
from mlptrain.util.atomic import atomic_write
from mlptrain.util.background import pool

RUN_END_WRITERS = 4  # threads: the fsyncs of several runs' files overlap


def close_run(s: Session, logger, run_dir: Path, summary: dict, windows: int) -> Future:
    """A Future of `summary` (its `fallbacks` added), once the run's last files are written: `logger` closed,
    then the grad-norm record of its `windows` accumulation windows (the step state's count), the kernel cache's
    last-run record and summary.json. Its error (a UserError naming the file) is raised where its result is
    taken."""
    norms = np.asarray(s.step.grad_norm_history(0, windows), np.float32)  # read from the device here
    return pool("run-ends", RUN_END_WRITERS).submit(_close, s, logger, run_dir, norms, summary)


def save_grad_norms(path: Path, norms: np.ndarray) -> None:
    """`norms` as .npy, written atomically."""
    with atomic_write(path, binary=True) as file:
        np.save(file, norms)


def _close(s: Session, logger, run_dir: Path, norms: np.ndarray, summary: dict) -> dict:
    logger.close()
    save_grad_norms(run_dir / GRAD_NORMS, norms)
    write_last_run(summary, run_dir.name)
    summary["fallbacks"] = fallbacks(s)  # with one the logger's close met (its images drawn here after all)
    write_json(run_dir / "summary.json", summary)
    return summary
