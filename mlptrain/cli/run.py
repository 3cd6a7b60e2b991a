"""`mlptrain run CONFIG [KEY=VALUE ...]`: validate everything, then create the run directory and train."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from mlptrain.cli.configs import resolve_config
from mlptrain.config import load_config
from mlptrain.experiment import Resources, create_run
from mlptrain.runs import check_run_name
from mlptrain.tracking import console


def run(
    config: str = typer.Argument(..., help="a YAML config file or a built-in config name"),
    overrides: Optional[List[str]] = typer.Argument(None, help="KEY=VALUE overrides, e.g. optim.lr=3e-4"),
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="folder that holds the run directories"),
    name: Optional[str] = typer.Option(None, "--name", help="run name (default: <config>-<timestamp>)"),
) -> None:
    """Train a model from a config; writes runs/<name>/."""
    from mlptrain.train import train

    path = resolve_config(config)
    cfg = load_config(path, overrides or [])
    if name is not None:
        check_run_name(name)
    backend, dataset = Resources().prepare(cfg)
    run_dir = create_run(cfg, runs_dir, name, path.stem)
    summary = train(cfg, backend, dataset, run_dir)
    table = Table("metric", "value")
    for key in ("test_acc", "test_loss", "val_acc", "test_mse", "val_mse", "mean_image_mse", "epochs",
                "optimizer_steps", "samples_per_s", "wall_s"):
        if key not in summary:
            continue
        value = summary[key]
        table.add_row(key, f"{value:.4f}" if isinstance(value, float) else str(value))
    console.print(table)
    console.print(f"run written to {run_dir} (tensorboard --logdir {run_dir.parent})")
