"""The `mlptrain` command: a thin Typer app over plain functions.

Every `UserError` raised below becomes one red line on stderr and exit code 2 (or its own
`exit_code`: 130 for a run interrupted by Ctrl-C).
"""

from __future__ import annotations

import sys

import typer

from mlptrain.cli import cache, configs, features, run, svm, sweep, warmup
from mlptrain.errors import UserError
from mlptrain.tracking import console

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Train small neural networks on NVIDIA GPUs with hand-written Numba CUDA kernels.")
app.command("run")(run.run)
app.command("sweep")(sweep.sweep)
app.command("extract-features")(features.extract_features)
app.command("svm")(svm.svm)
app.command("warmup")(warmup.warmup)
app.add_typer(configs.app, name="configs")
app.add_typer(cache.app, name="cache")


def main() -> None:
    try:
        app()
    except UserError as err:
        code = getattr(err, "exit_code", 2)
        label = "error:" if code == 2 else "stopped:"
        console.print(f"[bold red]{label}[/] {err}", highlight=False, soft_wrap=True)
        sys.exit(code)
