"""`mlptrain compare RESULT RESULT [...]`: runs or seed groups side by side, each final metric's mean with
its 95% confidence interval and every result's difference from the first with Welch's interval."""

from __future__ import annotations

from pathlib import Path
from typing import List

import typer

from mlptrain.errors import UserError
from mlptrain.util.console import console


def compare(
    results: List[Path] = typer.Argument(..., metavar="RESULT RESULT [...]",
                                         help="run directories, or directories of `mlptrain run --seeds` "
                                              "(their seeds.json); the first is the baseline"),
) -> None:
    """Compare the final metrics of runs or seed groups, with 95% confidence intervals."""
    # the command's own modules, imported when it runs: --help and the other commands start without them
    from mlptrain.seeds.report import compare_table, legend
    from mlptrain.seeds.results import load_result

    if len(results) < 2:
        raise UserError("compare needs two or more results (run directories or --seeds directories)")
    loaded = [load_result(path) for path in results]
    table = compare_table(loaded)  # refuses results that measure different things before printing any
    for line in legend(loaded):
        console.print(line, highlight=False, soft_wrap=True)
    console.print(table)
