"""A run folder holds its own files, never links to others.

mlptrain writes into a run folder (its lock, metrics.jsonl, checkpoints, summary.json, reports) and reads
its records back; a symbolic link put there would send a write to a file outside the run (as root, a system
file) or make a run report another run's checkpoint or config as its own. Files opened one by one refuse a
link themselves (mlptrain.util.regular_file, `follow=False`); a whole-file write replaces a link by its
rename rather than writing through it. What is checked here, before a command reads or writes a run, is
the folder as a whole: no entry of the run folder or of its checkpoints/ folder is a link, so a refusal is
one line before any work, and the checkpoints folder itself is checked again each time a checkpoint is
written into it.
"""

from __future__ import annotations

import os
from pathlib import Path

from mlptrain.errors import UserError

CHECKPOINTS = "checkpoints"


def check_no_links(run_dir: Path, what: str = "run") -> None:
    """Refuse, in one line, a `run_dir` with a symbolic link among its entries or its checkpoints/ entries
    (`what` names the folder in the refusal: run, seed group)."""
    for folder in (run_dir, run_dir / CHECKPOINTS):
        try:
            entries = list(os.scandir(folder))
        except OSError:  # absent, or not a folder: the command's own checks say so
            continue
        for entry in sorted(entries, key=lambda e: e.name):
            if entry.is_symlink():
                _refuse(Path(entry.path), what)


def checkpoint_file(run_dir: Path, name: str) -> Path:
    """`run_dir/checkpoints/<name>.npz`, its folder made when missing and never a link to another."""
    folder = run_dir / CHECKPOINTS
    try:
        folder.mkdir(exist_ok=True)
    except FileExistsError:  # a dangling link, or a file of that name
        pass
    except OSError as err:
        raise UserError(f"{folder}: cannot create it ({err.strerror or err})") from None
    if folder.is_symlink():
        _refuse(folder, "run")
    return folder / f"{name}.npz"


def _refuse(path: Path, what: str) -> None:
    try:
        target = f" (to {os.readlink(path)})"
    except OSError:
        target = ""
    raise UserError(f"{path}: a symbolic link{target} inside a {what} folder; mlptrain never reads or writes a "
                    f"{what}'s files through a link: put the file itself there, or remove the link")
