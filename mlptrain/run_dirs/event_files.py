"""TensorBoard event files, written by one thread of the process for all the runs it logs.

tensorboardX's SummaryWriter gives each event file a multiprocessing queue: every event is pickled by the queue's
feeder thread, sent through a pipe and unpickled by a logger thread of the file's own, which writes it. A packed
sweep's 16 lanes made 32 such threads beside the one thread that feeds the GPU, and each event cost that thread
~118 µs of waiting on the 2-core dev machine (2,560 events of five scalars: 302 ms of wall time for 43 ms of its
CPU; here 31 ms for 28), a writer ~1.2 ms to make (benchmarks/NOTES.md, issue 30 step 17). Here an event is put
on a queue as it is (no pickling), and one thread serialises and writes the events of every open file in order.

The files are what tensorboardX writes: its protobuf classes, its file names
(`events.out.tfevents.<seconds>.<host><suffix>`), a first event naming the format (`brain.Event:2`), then each
event framed as TFRecord (length, masked CRC-32C of the length, data, masked CRC-32C of the data). The thread
flushes a file once the queue is empty, so TensorBoard sees a live run's events as soon as they are written; `close`
waits for the file's events and syncs it to disk, and raises the first OSError its writes met (a full disk).
"""

from __future__ import annotations

import os
import queue
import secrets
import socket
import struct
import sys
import threading
import time
from pathlib import Path

FILE_VERSION = "brain.Event:2"
CLOSE_POLL_S = 0.5  # how often a close waiting for the writing thread asks whether the interpreter is exiting


def import_tensorboardx():
    """tensorboardX's package, imported without PyTorch: tensorboardX imports torch whenever it is installed, only
    to accept torch tensors (4.1 of a warm MNIST run's 9 s on the GPU machine), and we hand it NumPy. torch is
    hidden during that one import, unless something already imported it."""
    if "torch" in sys.modules:
        # tensorboardX only once a run writes its events (it may import torch: see import_tensorboardx)
        import tensorboardX

        return tensorboardX
    sys.modules["torch"] = None  # `import torch` raises ImportError, which tensorboardX handles
    try:
        # tensorboardX only once a run writes its events (it may import torch: see import_tensorboardx)
        import tensorboardX
    finally:
        del sys.modules["torch"]
    return tensorboardX


def summary_class():
    """tensorboardX's Summary protobuf class."""
    import_tensorboardx()
    # tensorboardX only once a run writes its events; import_tensorboardx has imported it without torch
    from tensorboardX.proto.summary_pb2 import Summary

    return Summary


def event_suffix(suffix: str = "") -> str:
    """The end of a new TensorBoard event file's name. Its name is otherwise the second and the host, as
    tensorboardX's, which two writers in a run's folder can share: random digits keep them apart (and EventFile
    makes the file new, never through a link put at its name beforehand)."""
    return f".{secrets.token_hex(4)}{suffix}"


def _masked_crc(data: bytes) -> int:
    """TFRecord's masked CRC-32C of `data`."""
    # the C package (a dependency): tensorboardX's own CRC-32C is pure Python, ~1 ms per 4 KB
    from crc32c import crc32c

    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord(data: bytes) -> bytes:
    """`data` framed as a TFRecord: its length, the length's masked CRC-32C, `data`, its masked CRC-32C."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", _masked_crc(length)) + data + struct.pack("<I", _masked_crc(data))


class EventFile:
    """A new event file in `logdir`: `add(summary, step)` queues an event of a Summary protobuf; `close` waits for
    the file's events, syncs and closes it. The file is made here, new (O_EXCL: never through a link put at its
    name); an OSError making it propagates."""

    def __init__(self, logdir: Path, suffix: str = ""):
        writer = _writer()  # first: tensorboardX's protobuf classes, which a file is no use without
        self.path = Path(logdir) / f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}{suffix}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
        self.file = os.fdopen(os.open(self.path, flags, 0o666), "wb")
        self.error: BaseException | None = None  # the first error the writing thread met with this file
        self.closed = threading.Event()  # set by the writing thread once the file is closed
        self.closing = False
        writer.put((self, time.time(), None, None, FILE_VERSION))

    def add(self, summary, step: int | None = None, walltime: float | None = None) -> None:
        """An event of `summary` at `step` (None: the event has no step, as a layout's), stamped now."""
        if self.closing:
            raise ValueError(f"{self.path}: the event file is closed")
        _writer().put((self, time.time() if walltime is None else walltime, step, summary, None))

    def close(self) -> None:
        """Once every event added is written: the file synced and closed. Raises the first error its writes met
        (an OSError for a full or read-only disk)."""
        if not self.closing:
            self.closing = True
            _writer().put((self, None, None, None, None))
        while not self.closed.wait(CLOSE_POLL_S):
            if sys.is_finalizing():  # a run's loop closed at the interpreter's exit: the writing thread (a daemon)
                return  # runs no more, and waiting for it hung the process (benchmarks/NOTES.md, issue 30 step 33)
        if self.error is not None:
            raise self.error


class _Writer:
    """The thread writing every event file of this process, each file's events in the order they were added."""

    def __init__(self):
        import_tensorboardx()
        # tensorboardX only once a run writes its events; import_tensorboardx has imported it without torch
        from tensorboardX.proto.event_pb2 import Event

        self.event = Event
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.pid = os.getpid()
        threading.Thread(target=self.run, name="mlptrain-events", daemon=True).start()

    def put(self, item) -> None:
        self.queue.put(item)

    def run(self) -> None:
        dirty: set[EventFile] = set()
        while True:
            try:
                item = self.queue.get(block=False)
            except queue.Empty:  # all that was asked is written: flushed, so that TensorBoard reads it live
                for file in dirty:
                    _kept(file, file.file.flush)
                dirty.clear()
                item = self.queue.get()
            file, wall, step, summary, version = item
            if wall is None:  # its close
                dirty.discard(file)
                self.finish(file)
            elif file.error is None:
                _kept(file, lambda: self.write(file, wall, step, summary, version))
                dirty.add(file)

    def write(self, file: EventFile, wall: float, step: int | None, summary, version: str | None) -> None:
        """One event into the file's buffer, as tensorboardX's FileWriter makes it."""
        event = self.event(wall_time=wall, file_version=version) if version else self.event(wall_time=wall,
                                                                                              summary=summary)
        if step is not None:
            event.step = int(step)
        file.file.write(tfrecord(event.SerializeToString()))

    @staticmethod
    def finish(file: EventFile) -> None:
        """The file flushed, synced and closed, then its `close` released."""
        try:
            if file.error is None:
                _kept(file, file.file.flush)
                _kept(file, lambda: os.fsync(file.file.fileno()))
            _kept(file, file.file.close)
        finally:
            file.closed.set()


def _kept(file: EventFile, job) -> None:
    """`job()`, its error kept for the file's `close` to raise on the run's own thread; the writing thread goes on
    with the other files."""
    try:
        job()
    except Exception as err:  # raised by close, where the run handles its errors
        if file.error is None:
            file.error = err


_WRITER: list[_Writer] = []
_WRITER_LOCK = threading.Lock()


def _writer() -> _Writer:
    """The process's writing thread, started on first use (and again in a forked child, which has no threads)."""
    with _WRITER_LOCK:
        if not _WRITER or _WRITER[0].pid != os.getpid():
            _WRITER[:] = [_Writer()]
        return _WRITER[0]
