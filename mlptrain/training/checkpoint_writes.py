"""A run's checkpoints on their way to the disk: `checkpoint_at` holds one as it is at a position (its device
arrays copied behind the host's back), `write_checkpoints` hands `last` (and a held `best`) to threads that write
them behind the training, and `written` waits for those writes, raising the error one met."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from mlptrain.run_dirs.links import checkpoint_file
from mlptrain.training.checkpoint import save_checkpoint
from mlptrain.training.resume import HeldCheckpoint, Position, checkpoint_later
from mlptrain.training.session import Session
from mlptrain.util.atomic import link_whole
from mlptrain.util.background import pool

CHECKPOINT_WRITERS = 4  # threads writing checkpoints: a packed group's lanes end their runs together


def write_checkpoints(s: Session, run_dir: Path, last: HeldCheckpoint) -> None:
    """`last`, then `best` where one is held (a second name of `last` where it is that one), written by a thread
    behind the training (mlptrain.util.background): ~17 ms each, the npz and its fsync, on the GPU machine,
    which a packed sweep's lanes paid in turn at their last epoch's end while the GPU idled. The arrays are
    taken here, so a diverged checkpoint is refused here as before. The run's earlier writes are waited for
    first: its files are written in order, and a write that failed ends the run at its next checkpoint (or
    before its summary), the file it was to replace intact."""
    written(s)
    held, writes = [last], [(checkpoint_file(run_dir, "last"), last.arrays())]
    if s.unsaved_best is not None:  # kept until `last` is written: best.npz never runs ahead of it
        best, s.unsaved_best = s.unsaved_best, None
        if best is not last:
            held.append(best)
        writes.append((checkpoint_file(run_dir, "best"), None if best is last else best.arrays()))
    s.writing = pool("checkpoints", CHECKPOINT_WRITERS).submit(_write_files, writes, held)


def _write_files(writes: list[tuple[Path, dict | None]], held: list[HeldCheckpoint]) -> None:
    """Each checkpoint in turn (None: a second name of the first, link_whole), then `held`, whose arrays they are,
    dropped: their memory (pinned, on a GPU) goes back for later copies, written or not."""
    try:
        for path, arrays in writes:
            if arrays is None:
                link_whole(writes[0][0], path)
            else:
                save_checkpoint(path, arrays)
    finally:
        for checkpoint in held:
            checkpoint.drop()


def written(s: Session) -> None:
    """Once the run's checkpoint files are written (the error a write met raised here)."""
    writing, s.writing = s.writing, None
    if writing is not None:
        writing.result()


def checkpoint_at(s: Session, position: Position, copies=None) -> HeldCheckpoint:
    """A checkpoint of `s` at `position` (see mlptrain.training.resume.checkpoint_later), with the run's seconds
    so far: its device arrays copied behind the host's back (a sweep's trial holds its best epoch's for epochs,
    writing it at its end), taken when written; `copies`: those copied already, at `position`."""
    position = dataclasses.replace(position, wall_s=s.wall_before + time.perf_counter() - s.started)
    # inside an epoch: its samples' losses so far, for the epoch's training means
    extra = s.window.rows_done(position.window) if position.window else None
    return checkpoint_later(s.model, s.step, s.plateau, position, s.config, s.selection[0], extra, copies)
