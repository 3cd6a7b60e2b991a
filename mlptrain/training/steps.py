"""A run's training as steps: the loop (mlptrain.training.loop) is a generator that yields after queueing each
optimizer step, so that a caller can train several runs side by side from one thread (mlptrain.packing);
`finish` runs one to its end, and `Period` is what a run yields before its first step.
"""

from __future__ import annotations

from collections.abc import Generator


class Period:
    """What a run yields before its first step: the steps from one of its epochs' ends to the next, when its
    host does an epoch's evaluation, checkpoints and logs (milliseconds, in which the GPU runs only what the
    other runs queued before). side_by_side holds run i of K back for i/K of that at its start, so that runs
    started together do not all end their epochs at once."""

    __slots__ = ("steps",)

    def __init__(self, steps: int):
        self.steps = steps


def finish(steps: Generator):
    """Run a generator of steps to its end; returns what it returns. A mark it yields is passed over: its next
    step waits for the device itself (a read)."""
    while True:
        try:
            next(steps)
        except StopIteration as end:
            return end.value
