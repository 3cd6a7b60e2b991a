"""Several training runs side by side from one thread ("packed"): each run is a generator that yields after
queueing each optimizer step (mlptrain.training.loop.training), and `side_by_side` advances them in turn, one
step each. While the host queues one run's step, the GPU works on the steps the others queued: a small
model's kernels leave most of a GPU idle, and those of several runs overlap there.

Each run keeps the CUDA stream its backend made (a stream of its own: mlptrain.training.experiment.Resources
`with_own_stream`). The thread's launch stream (mlptrain.backends.thread_stream) is switched to a run's before
each of its steps, so each run's launches, copies and reads stay ordered on its stream and wait for nothing
of the others'. No run's
arithmetic depends on another's, so a run trained beside others gives the bits it gives alone.

One thread, not a thread per run: runs in threads take turns on the interpreter at every launch, and a run
here never waits for another's host work except in its turn.
"""

from __future__ import annotations

import signal
from collections.abc import Generator, Iterable

from mlptrain.backends.thread_stream import launch_stream, use_launch_stream
from mlptrain.errors import UserError

MAX_PACK = 64  # runs side by side in one thread: past the GPU's gain, each adds only its memory


def check_pack(pack: int) -> None:
    """`--pack K`: raises UserError unless 1 <= K <= MAX_PACK."""
    if not 1 <= pack <= MAX_PACK:
        raise UserError(f"--pack {pack}: must be in [1, {MAX_PACK}]")


def finish(steps: Generator):
    """Run a generator of steps to its end; returns what it returns."""
    while True:
        try:
            next(steps)
        except StopIteration as end:
            return end.value


def side_by_side(runs: Iterable[Generator], stop=None) -> list:
    """Advance every generator of `runs` one step in turn until all have ended; returns what each returned,
    in order. When one raises, `stop.signum` is set (each run then ends after its current step, as on Ctrl-C:
    a run reads it after every optimizer step) and the others are advanced to their ends; then the first
    error is raised. Without `stop` the others are closed where they stand."""
    active = {i: [run, launch_stream()] for i, run in enumerate(runs)}
    results, errors = [None] * len(active), []
    while active:
        for i, entry in list(active.items()):
            if i not in active:  # closed this round, after another's error
                continue
            run, stream = entry
            use_launch_stream(stream)
            try:
                next(run)
            except StopIteration as end:
                results[i] = end.value
                del active[i]
            except BaseException as err:  # kept, raised once every other run has ended
                errors.append(err)
                del active[i]
                if stop is not None:
                    stop.signum = stop.signum or signal.SIGTERM
                else:
                    for other, _ in active.values():
                        other.close()
                    active.clear()
            else:
                entry[1] = launch_stream()  # the stream its backend made (or switched to) this step
    if errors:
        raise errors[0]
    return results
