"""`mlptrain configs` lists the built-in configs; `mlptrain configs show NAME` prints one."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.syntax import Syntax
from rich.table import Table

from mlptrain.config import read_yaml
from mlptrain.errors import UserError
from mlptrain.tracking import console

BUILTIN_DIR = Path(__file__).resolve().parents[1] / "configs"
SWEEP_PREFIX = "sweep_"  # built-in sweep files live beside the configs but are not configs

app = typer.Typer(help="List and show the built-in configs.", invoke_without_command=True)


def builtin_configs() -> dict[str, Path]:
    return {p.stem: p for p in sorted(BUILTIN_DIR.glob("*.yaml")) if not p.stem.startswith(SWEEP_PREFIX)}


def resolve_config(name_or_path: str) -> Path:
    """A path to a YAML file, or a built-in config by name (`adam_mnist`, `configs/adam_mnist.yaml` from anywhere)."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    builtin = builtin_configs().get(path.stem)
    if builtin is None or str(path.parent) not in (".", "configs"):
        raise UserError(f"{name_or_path}: no such config file or built-in config "
                        f"(built-in: {', '.join(builtin_configs())})")
    return builtin


@app.callback()
def list_configs(ctx: typer.Context) -> None:
    """List the built-in configs with their descriptions."""
    if ctx.invoked_subcommand is not None:
        return
    table = Table("name", "description", title="built-in configs (mlptrain configs show NAME)")
    for name, path in builtin_configs().items():
        table.add_row(name, str(read_yaml(path).get("description", "")))
    console.print(table)


@app.command()
def show(name: str = typer.Argument(..., help="a built-in config name, e.g. adam_mnist")) -> None:
    """Print one built-in config."""
    path = builtin_configs().get(Path(name).stem)
    if path is None:
        raise UserError(f"configs show: no built-in config '{name}' (built-in: {', '.join(builtin_configs())})")
    if console.is_terminal:
        console.print(Syntax(path.read_text(), "yaml"))
    else:  # plain text, so `mlptrain configs show x > my.yaml` gives a usable file
        typer.echo(path.read_text(), nl=False)
