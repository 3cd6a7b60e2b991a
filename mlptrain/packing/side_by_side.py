"""Several training runs side by side from one thread ("packed"): each run is a generator that yields after
queueing each optimizer step (mlptrain.training.loop.training), and `side_by_side` advances them in turn, one
step each. While the host queues one run's step, the GPU works on the steps the others queued: a small
model's kernels leave most of a GPU idle, and those of several runs overlap there.

Each run keeps the CUDA stream its backend made (a stream of its own: mlptrain.training.experiment.Resources
`with_own_stream`). The thread's launch stream (mlptrain.backends.thread_stream) is switched to a run's before
each of its steps, so each run's launches, copies and reads stay ordered on its stream and wait for nothing
of the others'. No run's arithmetic depends on another's, so a run trained beside others gives the bits it
gives alone.

One thread, not a thread per run: runs in threads take turns on the interpreter at every launch, and a run
here never waits for another's host work except in its turn.

MLP runs of one shape go further, in lanes of one group (mlptrain.packing.lane_group): their sessions share
their buffers' memory, one row each, and side_by_side launches all their windows at once (`lanes`).
"""

from __future__ import annotations

import signal
from collections.abc import Generator, Iterable
from contextlib import contextmanager

from mlptrain.backends.thread_stream import launch_stream, use_launch_stream
from mlptrain.errors import OutOfMemory, UserError
from mlptrain.training.steps import Period

MAX_PACK = 64  # runs side by side in one thread: past the GPU's gain, each adds only its memory


def check_pack(pack) -> int | str:
    """`--pack K` as given (text or a number): K, or "auto" (mlptrain.packing.auto measures it where the
    runs train); raises UserError unless 1 <= K <= MAX_PACK."""
    text = str(pack).strip()
    if text == "auto":
        return text
    try:
        count = int(text)
    except ValueError:
        raise UserError(f"--pack {pack}: must be a number of runs in [1, {MAX_PACK}], or auto") from None
    if not 1 <= count <= MAX_PACK:
        raise UserError(f"--pack {pack}: must be in [1, {MAX_PACK}], or auto")
    return count


class NoRoom(Exception):
    """A run that does not fit in the memory left beside the runs training already, where its slot gives way
    (`room_for`): its trial or seed goes back to the queue, for a slot that stays, and this slot ends."""


@contextmanager
def room_for(give_way: bool):
    """Around building a run's session: its OutOfMemory refusal (made before anything is allocated or written)
    becomes NoRoom where `give_way` (a packed worker's second and later slots); alone, it stays the run's
    failure."""
    try:
        yield
    except OutOfMemory as err:
        if give_way:
            raise NoRoom(str(err)) from None
        raise


class _Run:
    """One run of side_by_side: its steps, its launch stream, the mark it waits for (None: none), and the turns
    it still sits out (its start spread: Period)."""

    __slots__ = ("steps", "stream", "mark", "hold", "spread")

    def __init__(self, steps: Generator):
        self.steps, self.stream, self.mark, self.hold, self.spread = steps, launch_stream(), None, 0, False

    def yielded(self, value, index: int, runs: int) -> None:
        """Take what the run's step yielded: a mark to wait for, or its Period (the first one spreads it over
        `runs`; 0: not spread)."""
        self.mark = None
        if isinstance(value, Period):
            if not self.spread and runs:
                self.hold, self.spread = index * value.steps // runs, True
        elif value is not None:
            self.mark = value


def side_by_side(runs: Iterable[Generator], stop=None, lanes=None) -> list:
    """Advance every generator of `runs` one step in turn until all have ended; returns what each returned,
    in order. A run that yields a mark (Backend.mark: it is about to read what its steps computed) is passed
    over until the mark is done, so that the host queues the others' steps instead of waiting; when every run
    waits, the host waits for the first. When one raises, `stop.signum` is set (each run then ends after its
    current step, as on Ctrl-C: a run reads it after every optimizer step) and the others are advanced to
    their ends; then the first error is raised. Without `stop` the others are closed where they stand.

    `lanes` (an mlptrain.packing.lane_group.LaneGroup; run i in its lane i, where its run joined the lanes):
    a run in a lane hands its window in and is passed over until the group has launched it, which it does
    once every lane in training has handed one in (LaneGroup.ready), the runs' starts not spread (they step in
    lockstep); with the group's `stagger`, once every lane that is due has, the starts spread as side by side
    (their epochs' ends, when a lane is not due, come in turn while the other lanes step)."""
    active = {i: _Run(steps) for i, steps in enumerate(runs)}
    results, errors = [None] * len(active), []
    try:
        _rounds(active, results, errors, stop, lanes)
    except BaseException:  # the group's launch, a mark's wait: no run can go on, so each is closed here, its
        _close_all(active)  # files with it (left open, they were closed at the interpreter's exit, which hung there)
        raise
    if errors:
        raise errors[0]
    return results


def _rounds(active: dict, results: list, errors: list, stop, lanes) -> None:
    """side_by_side's rounds until every run of `active` has ended: each run's return value into `results`, each
    run's error into `errors` (the others stopped, or closed without a stop)."""
    count = len(active)
    while active:
        # marks seen not done this round, asked once: a lockstep group's lanes wait on one read's mark, and asking
        # the driver 16 times a read took ~170 ms of a 16-lane sweep's feeding thread (benchmarks/NOTES.md, issue 30
        # step 29)
        stepped, waiting, not_done = False, None, set()
        for i, run in list(active.items()):
            if i not in active:  # closed this round, after another's error
                continue
            if run.hold:  # its start spread (Period): it sits out whole rounds of the others
                run.hold -= 1
                continue
            if lanes is not None and lanes.waits(i):  # its window is not launched yet
                continue
            if run.mark is not None and (id(run.mark) in not_done or not run.mark.done()):
                not_done.add(id(run.mark))
                waiting = waiting or run
                continue
            stepped = True
            use_launch_stream(run.stream)
            try:
                run.yielded(next(run.steps), i, count if lanes is None or lanes.stagger else 0)
            except StopIteration as end:
                results[i] = end.value
                _ended(active, i, lanes)
            except BaseException as err:  # kept, raised once every other run has ended
                errors.append(err)
                _ended(active, i, lanes)
                if stop is not None:
                    stop.signum = stop.signum or signal.SIGTERM
                else:
                    _close_all(active)
            else:
                run.stream = launch_stream()  # the stream its backend made (or switched to) this step
        if lanes is not None and lanes.ready():
            lanes.flush(stop)
            stepped = True
        if not stepped and waiting is not None:  # every run waits for the device: so does the host
            waiting.mark.wait()


def _close_all(active: dict) -> None:
    """Close every run of `active` where it stands (its loop's cleanup runs now, in this thread), then forget them;
    a run whose cleanup raises does not keep the others open."""
    for run in active.values():
        try:
            run.steps.close()
        except Exception:  # the error being raised comes first: a run's own failure to close is secondary
            pass
    active.clear()


def _ended(active: dict, i: int, lanes) -> None:
    del active[i]
    if lanes is not None:
        lanes.leave(i)
