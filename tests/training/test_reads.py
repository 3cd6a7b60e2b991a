"""The loop's periodic reads are queued (a copy of the step state and a backend mark) and reported a period
later: each report holds the step state and the losses as they were at its own step, not at the step the
host had reached when it reported (on the GPU the device has run further steps by then)."""

import numpy as np
import pytest

from mlptrain.backends.cpu import CpuBackend
from mlptrain.backends.cuda import CudaBackend, ResidentCopies
from mlptrain.config.load import config_from_dict
from mlptrain.training.loop import epoch_steps, train_epoch, window_spans
from mlptrain.training.steps import finish
from mlptrain.training.session import build_session
from tests.training.test_train_backends import tiny_dataset

CONFIG = {"backend": "cpu", "seed": 0, "model": {"hidden": [8]}, "data": {"val_size": 10},
          "optim": {"name": "adam", "lr": 0.01}, "schedule": {"name": "cosine"},
          "train": {"batch_size": 2, "epochs": 1, "log_every": 3}}


def reads_of_one_epoch(backend, rng):
    session = build_session(config_from_dict(CONFIG), backend, tiny_dataset(rng, train=40))
    reads = []
    train_epoch(session, 1, reads.append)
    lrs = session.step.backend.to_host(session.step.lr_table)
    return session, reads, lrs


def check_reads(session, reads, lrs):
    assert [r["step_in_epoch"] for r in reads] == [3, 6, 9, 12, 15]  # 15 steps: the last one read too
    for r in reads:  # the state as it was at the read's own step
        assert r["step"] == r["step_in_epoch"]
        assert r["lr"] == pytest.approx(lrs[r["step"] - 1] if r["step"] else lrs[0])
    rows = session.backend.to_host(session.window.row_loss)
    edges = [0, *[r["step_in_epoch"] * 2 for r in reads]]
    for r, lo, hi in zip(reads, edges, edges[1:]):
        assert r["samples"] == hi - lo and r["loss"] == pytest.approx(rows[lo:hi].astype(np.float64).mean())


def test_a_span_of_windows_runs_to_the_next_read():
    """A packed lane's loop hands in its windows up to its next read before it yields (window_spans): every span
    ends at a read (each log_every-th window, and the epoch's last), a resumed epoch's first included."""
    assert list(window_spans(0, 10, 4, True)) == [(0, 3), (4, 7), (8, 9)]
    assert list(window_spans(5, 10, 4, True)) == [(5, 7), (8, 9)]
    assert list(window_spans(0, 8, 4, True)) == [(0, 3), (4, 7)]
    assert list(window_spans(0, 3, 50, True)) == [(0, 2)]
    assert list(window_spans(2, 5, 4, False)) == [(2, 2), (3, 3), (4, 4)]  # a run's own: a window at a time
    assert list(window_spans(3, 3, 4, True)) == []


def test_each_read_reports_its_own_step_on_the_cpu():
    check_reads(*reads_of_one_epoch(CpuBackend(), np.random.default_rng(0)))


@pytest.mark.real_gpu  # the simulator takes minutes for these 15 steps; its path is the CPU's (no marks)
def test_each_read_reports_its_own_step_on_the_gpu():
    check_reads(*reads_of_one_epoch(CudaBackend(), np.random.default_rng(0)))


def test_the_steps_yield_a_mark_before_each_report():
    session = build_session(config_from_dict(CONFIG), CpuBackend(), tiny_dataset(np.random.default_rng(0)))
    reads, steps = [], epoch_steps(session, 1, lambda read: reads.append(read["step_in_epoch"]))
    yielded = []
    while True:
        try:
            yielded.append(next(steps))
        except StopIteration as end:
            assert end.value == 15
            break
    assert len(yielded) == 15 + 5 and reads == [3, 6, 9, 12, 15]  # a step each, and a mark before each report
    assert finish(epoch_steps(session, 2, lambda read: None)) == 15


def test_the_backends_copy_and_read_after_a_mark():
    for backend in (CpuBackend(), CudaBackend()):
        source, kept = backend.to_device(np.arange(5.0)), backend.zeros((5,), np.float64)
        backend.copy(kept, source)
        mark = backend.mark()
        backend.copy_from_host(source, np.zeros(5))  # queued after the mark: the kept copy is not its
        np.testing.assert_array_equal(backend.to_host_after(kept, mark), np.arange(5.0))
        if mark is not None:
            assert mark.done() is True


def test_urgent_work_runs_in_order_with_the_backends_own():
    for backend in (CpuBackend(), CudaBackend(own_stream=True)):
        a = backend.to_device(np.arange(6.0))
        kept = backend.zeros((6,), np.float64)
        with backend.urgent():  # after what was queued before, and before what is queued after
            backend.copy(kept, a)
            during = backend.to_host(kept)
        backend.copy_from_host(a, np.ones(6))
        np.testing.assert_array_equal(during, np.arange(6.0))
        np.testing.assert_array_equal(backend.to_host(a), np.ones(6))


def test_the_backends_of_one_gpu_share_their_resident_data():
    """Packed trials' backends (each with a stream of its own) given one ResidentCopies put a dataset on the GPU
    once for all of them; a backend of its own keeps its own."""
    copies = ResidentCopies()
    first, second = (CudaBackend(own_stream=True, resident=copies) for _ in range(2))
    images = np.arange(12, dtype=np.uint8).reshape(3, 4)
    assert not second.holds(images)
    shared = first.resident(images)
    assert second.holds(images) and second.resident(images) is shared
    np.testing.assert_array_equal(second.to_host(shared), images)
    alone = CudaBackend(own_stream=True)
    assert not alone.holds(images) and alone.resident(images) is not shared


def test_an_epochs_evaluation_yields_a_mark_per_split_before_reading_it():
    """The epoch-end evaluation as steps: each split's batches are queued, then its mark is yielded (packed runs
    queue their steps meanwhile), then it is read; the step is asked after both; the record is the one the
    synchronous evaluation gives."""
    session = build_session(config_from_dict(CONFIG), CpuBackend(), tiny_dataset(np.random.default_rng(0)))
    train_epoch(session, 1, lambda read: None)
    ev, asked = session.evaluator, []
    steps = ev.record_steps(session.val, session.test, 1, lambda: asked.append(1) or 15)
    yielded = []
    while True:
        try:
            yielded.append(next(steps))
            assert asked == []  # not before the splits are read
        except StopIteration as end:
            record = end.value
            break
    assert yielded == [None, None] and asked == [1]  # the CPU backend's marks: None, one per split
    assert record == ev.record(session.val, session.test, 1, 15)
    assert list(record) == ["epoch", "step", "val_loss", "val_acc", "test_loss", "test_acc"]


def test_a_read_waits_on_its_copies_own_mark_where_they_have_one():
    """A read's copies that land behind the host carry a mark after them (so after the period's steps): the read
    waits on it, and a packed group's lanes, whose reads share one set of copies, share one event; copies made at
    once have none, and the backend's own mark is taken."""
    from types import SimpleNamespace

    from mlptrain.training.reads import queue_read

    class Copies:
        def __init__(self, mark):
            self.mark = mark

    marks = []
    backend = SimpleNamespace(mark=lambda: marks.append("recorded") or "the backend's mark")
    landing = Copies("after the copies")
    s = SimpleNamespace(backend=backend, evaluator=SimpleNamespace(classifies=True),
                        window=SimpleNamespace(read_copies=lambda lo, hi, outcomes: landing))
    read = queue_read(s, 1, 4, 0, 10)
    assert read.mark == "after the copies" and read.copies is landing and not marks
    landing = Copies(None)
    assert queue_read(s, 1, 9, 10, 20).mark == "the backend's mark" and marks == ["recorded"]


@pytest.mark.real_gpu
def test_an_event_seen_done_is_not_asked_again(monkeypatch):
    """A packed group's lanes wait on one event (their shared read's): once seen done it answers without the driver."""
    from mlptrain.backends.driver import api

    backend = CudaBackend(own_stream=True)
    if backend.mark() is None:
        pytest.skip("numba's path (MLPTRAIN_CUDA_LAUNCH=numba) marks nothing")
    event = api.Event().record(backend.stream)
    event.wait()
    asked = []
    monkeypatch.setattr(api.cu, "cuEventQuery", lambda handle: asked.append(handle))
    assert event.done() and event.done() and not asked
    fresh = api.Event().record(backend.stream)
    monkeypatch.undo()
    assert fresh.done() or (fresh.wait() is None and fresh.done())
