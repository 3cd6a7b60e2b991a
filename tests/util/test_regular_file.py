"""open_regular: what mlptrain reads back is a regular file; a FIFO or a device is refused at once, where a
plain open() of a FIFO blocks until a writer comes (the run, `cache` or resume hung) and /dev/zero never ends."""

import os
import signal
from contextlib import contextmanager

import pytest

from mlptrain.errors import UserError
from mlptrain.run_dirs.records import RunLogger
from mlptrain.util.regular_file import open_regular, read_regular_bytes, read_regular_text


@contextmanager
def within(seconds: int):
    """Fail, rather than hang the suite, when the block blocks."""
    def expire(*_):
        raise TimeoutError(f"blocked for {seconds} s")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_a_fifo_or_device_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    with within(5):
        for read in (read_regular_bytes, read_regular_text):
            for path in (tmp_path / "fifo", "/dev/zero"):
                with pytest.raises(OSError, match="not a regular file"):
                    read(path)
        with pytest.raises(OSError):  # no reader: ENXIO, at once
            open_regular(tmp_path / "fifo", "a")
    (tmp_path / "f").write_text("text")
    assert read_regular_text(tmp_path / "f") == "text" and read_regular_bytes(tmp_path / "f") == b"text"
    with open_regular(tmp_path / "new", "a") as file:
        file.write("x")
    assert (tmp_path / "new").read_text() == "x"


@pytest.mark.parametrize("make", [os.mkfifo, os.mkdir])
def test_a_run_whose_metrics_file_is_not_a_file_is_refused_in_one_line(tmp_path, make):
    """RunLogger opened metrics.jsonl outside the run's error handling: a directory there was a traceback,
    a FIFO a hang; and a refused run left a new TensorBoard event file behind."""
    make(tmp_path / "metrics.jsonl")
    with within(5), pytest.raises(UserError, match="metrics.jsonl: cannot append to it"):
        RunLogger(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]
