"""TensorBoard event files written by the process's one writing thread (mlptrain.run_dirs.event_files): what
tensorboardX's SummaryWriter writes, read back by TensorBoard's own loader (which checks every record's CRCs);
each file's events in order from many threads; written as they come, not only at close; a failed write raised by
close, as one line from the run's logger."""

import errno
import os
import threading
import time

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

from mlptrain.errors import UserError
from mlptrain.run_dirs import event_files
from mlptrain.run_dirs.event_files import EventFile, import_tensorboardx, summary_class
from mlptrain.run_dirs.records import RunLogger


def events(folder):
    (path,) = folder.glob("events.out.tfevents.*")
    return list(EventFileLoader(str(path)).Load())


def summaries(count: int):
    summary = summary_class()
    return [summary(value=[summary.Value(tag=f"loss/{k}", simple_value=float(np.float32(i / 7 + k)))
                           for k in range(3)]) for i in range(count)]


def test_the_file_holds_what_tensorboardx_writes(tmp_path):
    ours_dir, theirs_dir = tmp_path / "ours", tmp_path / "theirs"
    ours_dir.mkdir()
    ours = EventFile(ours_dir, ".x")
    with import_tensorboardx().SummaryWriter(logdir=str(theirs_dir)) as theirs:
        for step, summary in enumerate(summaries(5)):
            ours.add(summary, step, walltime=1000.0 + step)
            theirs.file_writer.add_summary(summary, step, walltime=1000.0 + step)
        ours.add(summaries(1)[0])  # no step, as a layout's
        theirs.file_writer.add_summary(summaries(1)[0])
    ours.close()
    a, b = events(ours_dir), events(theirs_dir)
    assert a[0].file_version == b[0].file_version == "brain.Event:2"
    for x, y in zip(a[1:], b[1:], strict=True):
        assert x.step == y.step and x.summary == y.summary
    assert [x.wall_time for x in a[1:-1]] == [1000.0 + step for step in range(5)]
    assert a[-1].step == 0  # none written
    assert ours.path.name.startswith("events.out.tfevents.") and ours.path.name.endswith(".x")


def test_each_files_events_stay_in_order_from_many_threads(tmp_path):
    folders = [tmp_path / f"run{i}" for i in range(4)]
    files = []
    for folder in folders:
        folder.mkdir()
        files.append(EventFile(folder))

    def log(file):
        for step, summary in enumerate(summaries(200)):
            file.add(summary, step)
        file.close()

    threads = [threading.Thread(target=log, args=(file,)) for file in files]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for folder in folders:
        assert [event.step for event in events(folder)[1:]] == list(range(200))


def test_events_are_written_as_they_come_not_only_at_close(tmp_path):
    """TensorBoard reads a live run: the thread flushes once it has written all it was given."""
    file = EventFile(tmp_path)
    file.add(summaries(1)[0], 3)
    deadline = time.monotonic() + 10
    while len(events(tmp_path)) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [event.step for event in events(tmp_path)] == [0, 3]
    file.close()


def test_a_failed_write_is_raised_by_close_and_is_one_line_from_the_logger(tmp_path, monkeypatch):
    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(event_files.os, "fsync", full)
    file = EventFile(tmp_path)
    file.add(summaries(1)[0], 1)
    with pytest.raises(OSError, match="No space left"):
        file.close()
    with pytest.raises(OSError):  # again: the error stays the file's
        file.close()
    (tmp_path / "run").mkdir()
    logger = RunLogger(tmp_path / "run")
    logger.scalars(1, {"loss/train": 0.5})
    with pytest.raises(UserError, match=r"run: cannot write to it \(No space left on device\)"):
        logger.close()
    with pytest.raises(ValueError, match="closed"):
        file.add(summaries(1)[0], 2)


def test_the_file_is_made_new_never_through_a_link(tmp_path, monkeypatch):
    monkeypatch.setattr(event_files.time, "time", lambda: 1234.5)
    monkeypatch.setattr(event_files.socket, "gethostname", lambda: "host")
    target = tmp_path / "elsewhere"
    (tmp_path / "events.out.tfevents.1234.host.x").symlink_to(target)
    with pytest.raises(FileExistsError):
        EventFile(tmp_path, ".x")
    assert not target.exists()


def test_a_close_at_the_interpreters_exit_does_not_wait_for_a_writer_that_runs_no_more(tmp_path, monkeypatch):
    """A run's loop left open is closed at the interpreter's exit, when the writing thread (a daemon) no longer runs:
    its close returns instead of waiting forever (a packed sweep hung there after an error)."""
    file = EventFile(tmp_path)
    file.closing = True  # its close asked already, and never to be done: as with a writer that runs no more
    monkeypatch.setattr(event_files, "CLOSE_POLL_S", 0.01)
    monkeypatch.setattr(event_files.sys, "is_finalizing", lambda: True)
    began = time.perf_counter()
    file.close()
    assert time.perf_counter() - began < 5 and not file.closed.is_set()
    monkeypatch.undo()
    file.closing = False
    file.close()  # the real close, for the writer to close the file
    assert file.closed.is_set()
