"""A run's checkpoint files written behind its training (packed runs in lanes), one write at a time, in order.

Runs in lanes (mlptrain.training.lane_group) step in lockstep: the group launches nothing until every lane has
ended its epoch, so each lane's checkpoint write (~8 MB written and synced for adam_mnist: 10-20 ms) held the
GPU idle for all of them in turn, 16 lanes x 10 epochs of it. Behind, a write runs on a thread of its own
while the lanes step on (np.savez and fsync give up the interpreter while they wait on the disk).

A write is the same atomic file write as before: a kill at any instant leaves the previous checkpoint intact.
The loop waits for the write in flight before anything that reads or names its files (the next checkpoint,
an interrupted run's "resume with" line, restoring the best epoch, the summary) and when the run ends however
it ends; an error of the write (a full disk) is raised there, where the loop turns it into its one line.
Alone, a run writes in place (`behind` False): nothing would overlap the write.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class CheckpointWriter:
    def __init__(self, behind: bool = False):
        self.behind = behind
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def submit(self, write: Callable[[], None]) -> None:
        """Run `write` (the files of one checkpoint) after the one in flight: on a thread when behind."""
        self.wait()
        if not self.behind:
            write()
            return
        self._thread = threading.Thread(target=self._run, args=(write,), name="mlptrain-checkpoint")
        self._thread.start()

    def _run(self, write: Callable[[], None]) -> None:
        try:
            write()
        except BaseException as err:  # raised in the loop's thread, at its next wait
            self._error = err

    def settle(self) -> None:
        """Until the write in flight is on disk, its error dropped: for a run already failing with its own."""
        try:
            self.wait()
        except Exception:  # the previous checkpoint is intact; the run's own error says what went wrong
            pass

    def wait(self) -> None:
        """Until the write in flight is on disk; its error, if it failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error
