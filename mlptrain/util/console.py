"""The terminal: the one rich console every command prints to (stderr, so stdout stays for results a
script reads), and the progress bar of a pass over a dataset outside training."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

console = Console(stderr=True)


class _FirstTaskProgress(Progress):
    """A Progress whose display starts with its first task, so that a command refused before any pass
    (a bad flag checked after loading the model) prints its one line and nothing else."""

    def __enter__(self) -> "_FirstTaskProgress":
        return self

    def add_task(self, *args, **kwargs):
        if not self.live.is_started:
            self.start()
        return super().add_task(*args, **kwargs)

    def stop(self) -> None:
        if self.live.is_started:  # rich's own stop prints a blank line even when nothing was shown
            super().stop()


def pass_progress() -> Progress:
    """A pass over a dataset outside training (feature extraction): images done per split."""
    return _FirstTaskProgress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                              TextColumn("images"), TimeElapsedColumn(), TimeRemainingColumn(), console=console,
                              transient=False)
