"""Checkpoint files written behind a run's training (mlptrain.training.checkpoint_writer): in order, one at a
time, waited for before anything reads them, and a failed write raised at the loop's next wait."""

import threading

import pytest

from mlptrain.training.checkpoint_writer import CheckpointWriter


def test_behind_writes_run_on_a_thread_one_at_a_time_in_order():
    writer, done, release = CheckpointWriter(behind=True), [], threading.Event()

    def first():
        release.wait(5)
        done.append(("first", threading.current_thread() is threading.main_thread()))

    writer.submit(first)
    assert done == []  # submit returned while the write waits
    release.set()
    writer.submit(lambda: done.append(("second", None)))  # waits for the first
    writer.wait()
    assert done == [("first", False), ("second", None)]


def test_in_place_writes_run_at_once():
    writer, done = CheckpointWriter(), []
    writer.submit(lambda: done.append(threading.current_thread() is threading.main_thread()))
    assert done == [True]


def test_a_failed_write_is_raised_at_the_next_wait_and_dropped_by_settle():
    writer = CheckpointWriter(behind=True)

    def full_disk():
        raise OSError(28, "No space left on device")

    writer.submit(full_disk)
    with pytest.raises(OSError, match="No space left"):
        writer.wait()
    writer.wait()  # raised once
    writer.submit(full_disk)
    with pytest.raises(OSError, match="No space left"):
        writer.submit(lambda: None)  # the next submit waits for it first
    writer.submit(full_disk)
    writer.settle()
    writer.wait()
