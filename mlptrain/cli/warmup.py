"""`mlptrain warmup CONFIG [KEY=VALUE ...]`: compile every GPU kernel a config needs into the kernel cache,
then exit, so that later runs (a cluster image's, a sweep's workers) start at once."""

from __future__ import annotations

from typing import List, Optional

import typer

from mlptrain.cli.configs import resolve_config
from mlptrain.util.console import console


def warmup(
    config: str = typer.Argument(..., help="a YAML config file or a built-in config name"),
    overrides: Optional[List[str]] = typer.Argument(None, help="KEY=VALUE overrides, e.g. train.precision=bf16"),
) -> None:
    """Compile the kernels a config needs into the kernel cache (`mlptrain cache` shows it), then exit."""
    # the command's own modules, imported when it runs: --help and the other commands start without them
    from mlptrain.config.load import load_config
    from mlptrain.training.compilation import compile_kernels
    from mlptrain.training.experiment import Resources
    from mlptrain.training.session import build_session

    cfg = load_config(resolve_config(config), overrides or [])
    backend, dataset = Resources().prepare(cfg, start_compilers=True, logs=False)
    if backend.name != "cuda":
        console.print(f"backend {backend.name}: the NumPy kernels need no compiling")
        return
    compile_kernels(build_session(cfg, backend, dataset))
