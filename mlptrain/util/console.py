"""The terminal: the one rich console every command prints to (stderr, so stdout stays for results a
script reads), and the progress bar of a pass over a dataset outside training."""

from __future__ import annotations

import os
import warnings

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

MIN_WIDTH = 20  # narrower, Rich prints nothing at all (COLUMNS=0) or a word per line


def console_width() -> int | None:
    """The width to lay out for, when $COLUMNS would make Rich print nothing or next to nothing (COLUMNS=0
    made every refusal silent): the terminal's own, else 80. None lets Rich decide, as it does well
    otherwise."""
    columns = os.environ.get("COLUMNS", "").strip()
    if not columns.isdigit() or int(columns) >= MIN_WIDTH:
        return None
    try:
        return max(os.get_terminal_size(2).columns, MIN_WIDTH)
    except (OSError, ValueError):
        return 80


def make_console(**options) -> Console:
    """A Console on stderr at a sane width (`console_width`)."""
    return Console(stderr=True, width=console_width(), **options)


console = make_console()


def reopen_console() -> None:
    """Have the console decide afresh what stderr is, after a forked child pointed it at a log: Rich chose
    colours and a live display for the command's terminal when it was made."""
    console.__init__(stderr=True, width=console_width())  # the same object: every module holds it


def show_warnings_as_lines() -> None:
    """Python's warnings (NumPy's overflow in a diverging run, Pillow's on an odd image) as one line each,
    `warning: MESSAGE (Category)`, instead of the raw `file:line: Category: message` and its source line."""
    warnings.showwarning = _one_line


def warn(note: str) -> str:
    """Print `note` as one warning line (markup in it is rich's); returns it, for a run's records."""
    console.print(f"[bold yellow]warning:[/] {note}", highlight=False, soft_wrap=True)
    return note


def _one_line(message, category, filename, lineno, file=None, line=None) -> None:
    warn(f"{escape(' '.join(str(message).split()))} ({category.__name__})")


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
