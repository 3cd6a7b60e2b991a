"""`mlptrain configs` (or `configs list`) lists the built-in configs and sweeps; `mlptrain configs show NAME
[KEY=VALUE ...]` prints one (with overrides or --resolved: the config a run would use, every default filled
in); `mlptrain configs copy NAME [DEST]` writes one to a file of your own to edit (torchtune's `tune cp`)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from mlptrain.config.builtins import builtin_configs, builtin_sweeps
from mlptrain.config.load import read_yaml
from mlptrain.config.suggestions import suggest_value
from mlptrain.errors import UserError
from mlptrain.util.atomic import write_text
from mlptrain.util.console import console


app = typer.Typer(help="List, show and copy the built-in configs and sweeps.", invoke_without_command=True)


def unknown_builtin(name: str, kind: str, names: list[str], where: str = "") -> UserError:
    """One line for a name that is no built-in `kind`: the closest name, and all of them."""
    close = suggest_value(Path(name).stem, names)
    hint = f"did you mean '{close}'? " if close else ""
    return UserError(f"{where}{name}: no such {kind} file or built-in {kind} ({hint}built-in: {', '.join(names)})")


def resolve_config(name_or_path: str) -> Path:
    """A path to a YAML file, or a built-in config by name (`adam_mnist`, `configs/adam_mnist.yaml` from anywhere)."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    builtin = builtin_configs().get(path.stem)
    if builtin is None or str(path.parent) not in (".", "configs"):
        if path.stem in builtin_sweeps():
            raise UserError(f"{name_or_path}: a built-in sweep, not a config; run it with `mlptrain sweep "
                            f"{path.stem}`")
        raise unknown_builtin(name_or_path, "config", list(builtin_configs()))
    return builtin


@app.callback()
def list_configs(ctx: typer.Context) -> None:
    """List the built-in configs and sweeps with their descriptions."""
    if ctx.invoked_subcommand is None:
        print_lists()


@app.command("list")
def list_command() -> None:
    """List the built-in configs and sweeps with their descriptions (as bare `mlptrain configs` does)."""
    print_lists()


@app.command()
def copy(name: str = typer.Argument(..., help="a built-in config or sweep name, e.g. adam_mnist"),
         dest: Optional[Path] = typer.Argument(None, help="the file to write, or a folder to write NAME.yaml in "
                                                          "(default: NAME.yaml in this folder)"),
         force: bool = typer.Option(False, "--force", help="replace the file if it exists")) -> None:
    """Write a built-in config or sweep to a file of your own, to edit and then run."""
    stem = Path(name).stem
    sweeps, configs = builtin_sweeps(), builtin_configs()
    source = configs.get(stem) or sweeps.get(stem)
    if source is None:
        raise unknown_builtin(name, "config", [*configs, *sweeps], where="configs copy: ")
    target = dest if dest is not None else Path(f"{stem}.yaml")
    if target.is_dir():
        target = target / f"{stem}.yaml"
    write_new(target, source.read_text(), force)
    command = "sweep" if stem in sweeps else "run"
    console.print(f"wrote {target}: edit it, then `mlptrain {command} {target}`", highlight=False)


def write_new(path: Path, text: str, force: bool) -> None:
    """`text` into `path` whole (old content or new, never half); without `force` an existing file is
    refused, also when another process creates it at the same moment (mlptrain.util.atomic links the new
    file to its name, which fails where one exists)."""
    if not force and (path.exists() or path.is_symlink()):
        raise UserError(f"{path} exists; use --force to replace it")
    write_text(path, text, overwrite=force)


def print_lists() -> None:
    for title, table in (("built-in configs (mlptrain run NAME; mlptrain configs show NAME)", builtin_configs()),
                         ("built-in sweeps (mlptrain sweep NAME; mlptrain configs show NAME)", builtin_sweeps())):
        listing = Table("name", "description", title=title)
        for name, path in table.items():
            raw = read_yaml(path)
            listing.add_row(name, str(raw.get("description", "") if isinstance(raw, dict) else ""))
        console.print(listing)


@app.command()
def show(name: str = typer.Argument(..., help="a built-in config or sweep name, e.g. adam_mnist"),
         overrides: Optional[List[str]] = typer.Argument(None, help="KEY=VALUE overrides: print the config they "
                                                                    "make"),
         resolved: bool = typer.Option(False, "--resolved", help="print the config a run would use, every default "
                                                                 "filled in (implied by overrides)")) -> None:
    """Print a built-in config or sweep (with overrides: the resolved config)."""
    stem = Path(name).stem
    sweeps, configs = builtin_sweeps(), builtin_configs()
    if stem in sweeps:
        if overrides or resolved:
            raise UserError(f"configs show {stem}: a sweep takes its overrides on `mlptrain sweep {stem} KEY=VALUE`")
        print_yaml(sweeps[stem].read_text())
        return
    if stem not in configs:
        raise unknown_builtin(name, "config", [*configs, *sweeps], where="configs show: ")
    if overrides or resolved:
        print_resolved(configs[stem], overrides or [])
    else:
        print_yaml(configs[stem].read_text())


def print_resolved(path: Path, overrides: list[str]) -> None:
    """The config of `path` with `overrides`, every default filled in, as YAML a run reads back."""
    # the command's own modules, imported when it runs: --help and the other commands start without them
    from mlptrain.config.load import load_config
    from mlptrain.config.safe_yaml import dump_yaml
    from mlptrain.training.experiment import run_record

    text = dump_yaml(run_record(load_config(path, overrides)))
    print_yaml(f"# {path.name}{' with ' + ' '.join(overrides) if overrides else ''}, resolved\n{text}")


def print_yaml(text: str) -> None:
    if console.is_terminal:
        from rich.syntax import Syntax  # pygments: only for a terminal

        console.print(Syntax(text, "yaml"))
    else:  # plain text, so `mlptrain configs show x > my.yaml` gives a usable file
        typer.echo(text, nl=False)
