"""`mlptrain run CONFIG [KEY=VALUE ...]`: validate everything, then create the run directory and train."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from mlptrain.backend import get_backend
from mlptrain.cli.configs import resolve_config
from mlptrain.config import config_to_dict, load_config
from mlptrain.data import load_dataset
from mlptrain.data.loader import check_val_size
from mlptrain.runs import check_run_name, create_run_dir, write_yaml
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
    backend = get_backend(cfg.backend)
    dataset = load_dataset(cfg.data.dataset, Path(cfg.data.root) if cfg.data.root else None)
    check_val_size(dataset, cfg.data.val_size)
    run_dir = create_run_dir(runs_dir, name, path.stem)
    write_yaml(run_dir / "config.yaml", config_to_dict(cfg))
    summary = train(cfg, backend, dataset, run_dir)
    table = Table("metric", "value")
    for key in ("test_acc", "test_loss", "val_acc", "epochs", "optimizer_steps", "samples_per_s", "wall_s"):
        value = summary[key]
        table.add_row(key, f"{value:.4f}" if isinstance(value, float) else str(value))
    console.print(table)
    console.print(f"run written to {run_dir} (tensorboard --logdir {run_dir.parent})")
