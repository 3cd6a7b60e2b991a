"""stdout and stderr whose reader may go away: `mlptrain run ... | head -1` closes the pipe after one line.

Python ignores SIGPIPE, so the next write raises BrokenPipeError wherever it happens: inside Rich (which
then raised SystemExit(1) from the middle of training), Click (which exits 1 without a word) or the
interpreter's last flush. The streams are wrapped once, before any command runs: the first failed write
points the stream's descriptor at /dev/null (so no later write, nor the final flush, fails again) and
raises `OutputClosed`, which the command's cleanup and the CLI's exit (141, as SIGPIPE's) understand.
"""

from __future__ import annotations

import errno
import os
import sys

from mlptrain.errors import OutputClosed


GONE = (errno.EPIPE, errno.EIO)  # the pipe's reader exited; the terminal hung up


class ClosableStream:
    """A text stream that turns a write to a reader gone into one `OutputClosed`; everything else is the
    stream's."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text):
        try:
            return self.stream.write(text)
        except OSError as err:
            self.closed_by(err)

    def flush(self):
        try:
            self.stream.flush()
        except OSError as err:
            self.closed_by(err)

    def closed_by(self, err: OSError):
        """Raise `OutputClosed` for a reader gone (EPIPE) or a terminal hung up (EIO); `err` itself otherwise."""
        if err.errno not in GONE:
            raise err
        self.silence()
        raise OutputClosed() from None

    def silence(self) -> None:
        """Send whatever is still to come (buffered text included) to /dev/null."""
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.stream.fileno())
            os.close(devnull)
        except (OSError, ValueError):  # no descriptor (a test's StringIO): nothing to redirect
            pass

    def __getattr__(self, name):
        return getattr(self.stream, name)


def guard_output() -> None:
    """Wrap sys.stdout and sys.stderr (once) so that a reader's going away is an `OutputClosed`."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, ClosableStream):
            if name == "stdout" and hasattr(stream, "reconfigure"):
                # a non-UTF-8 file name (surrogate-escaped in a str) goes out as its own bytes, as `ls` writes it
                stream.reconfigure(errors="surrogateescape")
            setattr(sys, name, ClosableStream(stream))

