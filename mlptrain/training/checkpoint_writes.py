"""A run's checkpoints on their way to the disk: `checkpoint_at` holds one as it is at a position (its device
arrays copied behind the host's back), `write_checkpoints` hands `last` (and a held `best`) to threads that write
them behind the training, and `written` waits for those writes, raising the error one met.

A run that writes `last` only every few epochs (a sweep's trial: once, at its end) holds its best epoch's
checkpoint until then, since best.npz must never run ahead of last.npz. At a 16-lane sweep's end that was 14
held bests beside the 16 lasts: 30 files of 8 MB written and fsynced while every run's summary and its trial's
result waited for them (benchmarks/NOTES.md, issue 30 step 24). So a held best that a later evaluation did not
beat is written ahead (`write_best_ahead`), while the GPU trains, to a hidden file that write_checkpoints renames
to best.npz once `last` is written; one that a later epoch beats after all is discarded."""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import Future
from pathlib import Path

from mlptrain.errors import TrainingDiverged
from mlptrain.run_dirs.links import CHECKPOINTS, checkpoint_file
from mlptrain.training.checkpoint import save_checkpoint, save_checkpoint_ahead
from mlptrain.training.resume import HeldCheckpoint, Position, checkpoint_later
from mlptrain.training.session import Session
from mlptrain.util.atomic import TEMP_SUFFIX, commit_ahead, discard_ahead, link_whole
from mlptrain.util.background import pool

CHECKPOINT_WRITERS = 4  # threads writing checkpoints: a packed group's lanes end their runs together


def write_checkpoints(s: Session, run_dir: Path, last: HeldCheckpoint) -> None:
    """`last`, then `best` where one is held (a second name of `last` where it is that one), written by a thread
    behind the training (mlptrain.util.background): ~17 ms each, the npz and its fsync, on the GPU machine,
    which a packed sweep's lanes paid in turn at their last epoch's end while the GPU idled. The arrays are
    taken here, so a diverged checkpoint is refused here as before. The run's earlier writes are waited for
    first: its files are written in order, and a write that failed ends the run at its next checkpoint (or
    before its summary), the file it was to replace intact."""
    ahead = _take_ahead(s)  # first: a failed write ahead is not this run's error (best is written below instead)
    try:
        written(s)
        held, writes = [last], [(checkpoint_file(run_dir, "last"), last.arrays())]
        if s.unsaved_best is not None:  # kept until `last` is written: best.npz never runs ahead of it
            best, s.unsaved_best = s.unsaved_best, None
            if best is not last:
                held.append(best)
            writes.append((checkpoint_file(run_dir, "best"), None if best is last else ahead or best.arrays()))
        if ahead is not None and all(arrays is not ahead for _, arrays in writes):  # its best is not written here
            discard_ahead(ahead)
    except BaseException:  # an earlier write's failure, a diverged `last`: nothing written ahead is left behind
        if ahead is not None:
            discard_ahead(ahead)
        raise
    s.writing = pool("checkpoints", CHECKPOINT_WRITERS).submit(_write_files, writes, held)


def write_best_ahead(s: Session, run_dir: Path) -> None:
    """The held best (an earlier epoch's, which the latest evaluation did not beat) written now, behind the
    training, to a hidden file beside best.npz (util.atomic.write_ahead), which write_checkpoints renames to
    best.npz once `last` is written. Once a held best; not where its parameters are not finite (its refusal comes
    where it would have been written, as before)."""
    best = s.unsaved_best
    if best is None or s.best_ahead is not None:
        return
    try:
        arrays = best.arrays()
    except TrainingDiverged:
        return
    written(s)
    s.writing = s.best_ahead = pool("checkpoints", CHECKPOINT_WRITERS).submit(
        save_checkpoint_ahead, checkpoint_file(run_dir, "best"), arrays)


def discard_best_ahead(s: Session) -> None:
    """The held best's file written ahead, removed (a later epoch beat it, or the run failed) by a writer thread:
    an unlink of 8 MB took ~1.4 ms of the feeding thread, 16 lanes in a row at a packed sweep's last epoch end
    (benchmarks/NOTES.md, issue 30 step 30). The run's next write, and its end, wait for it (`written`)."""
    ahead = _take_ahead(s)
    if ahead is not None:
        s.writing = pool("checkpoints", CHECKPOINT_WRITERS).submit(_discard_after, s.writing, ahead)


def discard_stale_ahead(run_dir: Path) -> None:
    """Files a best written ahead left in `run_dir`'s checkpoints folder when its process was killed before it
    renamed or discarded them (a run's folder is its process's alone: mlptrain.run_dirs.lock), removed at the
    run's start."""
    folder = run_dir / CHECKPOINTS
    if folder.is_symlink() or not folder.is_dir():  # a link is refused where a checkpoint is written, not read here
        return
    for stale in folder.glob(f".best.npz.*{TEMP_SUFFIX}"):
        discard_ahead(stale)


def _discard_after(earlier: Future | None, ahead: Path) -> None:
    """`ahead` removed; then `earlier`'s outcome, the run's write before it (submitted to the same pool first, so
    running or done by now), whose error is the run's."""
    discard_ahead(ahead)
    if earlier is not None:
        earlier.result()


def _take_ahead(s: Session) -> Path | None:
    """The held best's file written ahead, once its write is done; None where none was, or where the write failed
    (the best is then written with `last`, where a lasting fault is reported as before)."""
    future, s.best_ahead = s.best_ahead, None
    if future is None:
        return None
    if s.writing is future:
        s.writing = None
    return None if future.exception() is not None else future.result()


def _write_files(writes: list[tuple[Path, dict | Path | None]], held: list[HeldCheckpoint]) -> None:
    """Each checkpoint in turn (None: a second name of the first, link_whole; a Path: a file written ahead,
    renamed), then `held`, whose arrays they are, dropped: their memory (pinned, on a GPU) goes back for later
    copies, written or not. A file written ahead that an earlier write's failure leaves unrenamed is removed."""
    try:
        for i, (path, arrays) in enumerate(writes):
            try:
                if arrays is None:
                    link_whole(writes[0][0], path)
                elif isinstance(arrays, Path):
                    commit_ahead(arrays, path)
                else:
                    save_checkpoint(path, arrays)
            except BaseException:
                for _, later in writes[i + 1:]:
                    if isinstance(later, Path):
                        discard_ahead(later)
                raise
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
