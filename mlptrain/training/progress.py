"""The training progress line, one line that fits the terminal:

    epoch 2/10 ━━━━━━━━━━━━━━━ 200/430 loss 0.3085 acc 0.9124 302k samples/s 0:00:03 eta 0:01:06

The bar and the step count are this epoch's optimizer steps; `samples/s` is the run's steady pace so far,
the same figure as summary.json's `samples_per_s` (the median of the reads' throughputs, so the first
window's compilation does not drag it down): the last one shown is the one the summary reports; `eta` is the whole run's end, from the average pace since
training started (evaluations included), counting down between the loop's reads; `stopped` in its place
once the run was interrupted. When the terminal is
narrow the bar shrinks and goes first, then the throughput, then the accuracy, then the loss: the epoch,
the step count, the elapsed time and the ETA are never cut.
"""

from __future__ import annotations

import time

from rich.progress import Progress, ProgressColumn
from rich.text import Text

BAR_MIN = 6  # narrower than this, the bar says nothing: it is left out


def clock(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def compact(rate: float) -> str:
    """302062 -> '302k', 1042 -> '1,042'."""
    return f"{rate / 1e6:.1f}M" if rate >= 1e6 else f"{rate / 1e3:.0f}k" if rate >= 1e5 else f"{rate:,.0f}"


class TrainingLine(ProgressColumn):
    """The whole line as one column, laid out for the console's width (Rich would cut every column)."""

    def __init__(self, console):
        super().__init__()
        self.console = console

    def render(self, task) -> Text:
        f = task.fields
        label = Text(f"epoch {f['epoch']}/{f['epochs']}", style="bold")
        steps = f"{int(task.completed)}/{int(task.total)}"
        eta = "stopped" if f.get("stopped") else "eta ?" if f["ends_at"] is None else \
            f"eta {clock(f['ends_at'] - time.monotonic())}"
        times = f"{clock(task.elapsed or 0)} {eta}"
        optional = [f"loss {f['loss']:.4f}" if f["loss"] is not None else "",
                    f"acc {f['acc']:.4f}" if f["acc"] is not None else "",
                    f"{compact(f['rate'])} samples/s" if f["rate"] else ""]
        optional = [part for part in optional if part]
        width = self.console.width - 1
        parts = [steps, *optional, times]
        while len(label) + sum(len(p) + 1 for p in parts) > width and len(parts) > 2:
            parts.pop(-2)  # the least important first: throughput, then accuracy, then loss
        used = len(label) + sum(len(p) + 1 for p in parts)
        line = label.copy()
        bar = width - used - 1
        if bar >= BAR_MIN:
            done = int(bar * task.completed / task.total) if task.total else 0
            line.append(" ")
            line.append("━" * done, style="bar.complete")
            line.append("━" * (bar - done), style="bar.back")
        line.append(" " + " ".join(parts))
        return line


def training_progress(console, show: bool = True) -> Progress:
    """The progress bar on `console`; with `show` false it keeps its counts but draws nothing."""
    return Progress(TrainingLine(console), console=console, transient=False, disable=not show)
