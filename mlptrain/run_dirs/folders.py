"""Run directories: `runs/<name>/`, never overwritten, never outside the runs folder."""

from __future__ import annotations

import itertools
import re
import time
from pathlib import Path

from mlptrain.config.safe_yaml import dump_yaml
from mlptrain.errors import UserError
from mlptrain.util.atomic import write_text

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_run_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise UserError(f"--name '{name}': use letters, digits, '.', '_' and '-' (not starting with '.' or '-'), "
                        "at most 128 characters")
    return name


def create_run_dir(runs_dir: Path, name: str | None, stem: str, suffix_on_clash: bool = False) -> Path:
    """Creates and returns `runs_dir/name`; a default name is `<stem>-<timestamp>`, with `-2`, `-3`... on a
    clash, as is a given name with `suffix_on_clash` (a sweep's trial: its folder must not fail it)."""
    explicit = name is not None and not suffix_on_clash
    name = check_run_name(name if name is not None else f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        runs_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"--runs-dir {runs_dir}: cannot create it ({err.strerror})") from None
    for suffix in itertools.count(1):
        run_dir = runs_dir / (name if suffix == 1 else f"{name}-{suffix}")
        try:
            run_dir.mkdir()
            return run_dir
        except FileExistsError:
            if explicit:
                raise UserError(f"{run_dir}: a run of that name exists; choose another --name "
                                "(runs are never overwritten)") from None
        except OSError as err:
            raise UserError(f"{run_dir}: cannot create the run directory ({err.strerror})") from None


def write_yaml(path: Path, data: dict) -> None:
    write_text(path, dump_yaml(data))
