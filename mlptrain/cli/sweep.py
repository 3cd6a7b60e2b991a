"""`mlptrain sweep SWEEP [KEY=VALUE ...]`: run a sweep's trials (or the rest of them), then rank them."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.measure import Measurement

from mlptrain.cli.configs import builtin_configs, builtin_sweeps, unknown_builtin
from mlptrain.cli.signals import interrupt_exit_code, sigterm_as_interrupt
from mlptrain.errors import UserError
from mlptrain.runs.folders import check_run_name
from mlptrain.util.console import console

MAX_WORKERS = 256  # processes on one machine; more machines share a study through --storage


def resolve_sweep(name_or_path: str) -> Path:
    """A sweep file, or a built-in sweep by name (`sweep_lr_mnist`, `configs/sweep_lr_mnist.yaml` from anywhere)."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    builtin = builtin_sweeps().get(path.stem)
    if builtin is None or str(path.parent) not in (".", "configs"):
        raise unknown_builtin(name_or_path, "sweep", list(builtin_sweeps()))
    return builtin


def resolve_base(base: str, sweep_path: Path) -> Path:
    """The sweep's base config: a path relative to the sweep file, or a built-in config name."""
    beside = sweep_path.parent / base
    if beside.is_file():
        return beside
    builtin = builtin_configs().get(Path(base).stem) if Path(base).parent == Path(".") else None
    if builtin is None:
        raise UserError(f"{sweep_path}: base: '{base}' is neither a file relative to the sweep file nor a built-in "
                        f"config (built-in: {', '.join(builtin_configs())})")
    return builtin


def sweep(
    sweep_file: str = typer.Argument(..., metavar="SWEEP", help="a sweep YAML file or a built-in sweep name"),
    overrides: Optional[List[str]] = typer.Argument(None, help="KEY=VALUE overrides for every trial"),
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="folder that holds the sweep's folder"),
    name: Optional[str] = typer.Option(None, "--name", help="sweep name (default: the sweep file's name); "
                                       "re-running a sweep continues it"),
    storage: Optional[str] = typer.Option(None, "--storage", help="Optuna storage URL that workers share "
                                          "(default: an SQLite file in the sweep's folder)"),
    workers: int = typer.Option(1, "--workers", help="trials at once on this machine (one GPU each when there "
                                "are several)"),
) -> None:
    """Run a hyperparameter sweep; writes runs/<name>/ (a run per trial, results.json, results.csv)."""
    # the command's own modules, imported when it runs: --help and the other commands start without them
    from mlptrain.config.load import config_from_dict
    from mlptrain.sweep import engine  # Optuna takes half a second to import: only this command pays
    from mlptrain.sweep.report import results_table, trial_rows, write_results
    from mlptrain.sweep.spec import load_sweep
    from mlptrain.training.experiment import Resources, check_inputs  # numpy and the data loaders: only when used

    path = resolve_sweep(sweep_file)
    spec = load_sweep(path, overrides or [], resolve_base)
    name = check_run_name(name if name is not None else path.stem)
    if not 1 <= workers <= MAX_WORKERS:
        raise UserError(f"--workers {workers}: must be in [1, {MAX_WORKERS}]")
    sweep_dir = runs_dir / name
    url = storage or f"sqlite:///{(sweep_dir / 'study.db').resolve()}"
    engine.check_storage_url(url)
    resources, base_config = Resources(), config_from_dict(spec.raw)
    if workers == 1:
        resources.prepare(base_config)
    else:
        check_inputs(base_config)
    study, study_storage = _open(engine, spec, sweep_dir, name, url)

    def save():
        write_results(sweep_dir, spec, trial_rows(study, spec))

    problems = []
    try:
        with sigterm_as_interrupt():
            problems = _work(engine, study, study_storage, spec, sweep_dir, resources, save, workers, path, overrides,
                             runs_dir, name, url, base_config)
    except KeyboardInterrupt as err:  # Ctrl-C or SIGTERM: every running trial is queued again
        save()
        console.print(f"interrupted: re-run the same command to continue {sweep_dir} (finished trials are kept)")
        raise typer.Exit(interrupt_exit_code(err))
    rows = trial_rows(study, spec)
    write_results(sweep_dir, spec, rows)
    _show(results_table(rows, spec, f"{name}: {len(rows)} trials ranked by {spec.metric} ({spec.direction})"))
    for row in rows:
        if row["error"]:
            console.print(f"trial {row['number']} failed: {row['error']}", highlight=False)
    console.print(f"results in {sweep_dir}/results.json and results.csv (tensorboard --logdir {sweep_dir})")
    if problems:
        raise UserError("; ".join(problems))


def _work(engine, study, study_storage, spec, sweep_dir, resources, save, workers, path, overrides, runs_dir,
          name, url, base_config) -> list[str]:
    """Run trials here (one worker) or in `workers` child processes; returns a line per failed worker."""
    # the command's own modules, imported when it runs: --help and the other commands start without them
    from mlptrain.backends.cuda import cuda_usable
    from mlptrain.cli.warmup import warm_in_child
    from mlptrain.sweep.workers import run_workers

    if workers == 1:
        engine.work(study, study_storage, spec, sweep_dir, resources, on_trial_end=save)
        return []
    command = [sys.executable, "-m", "mlptrain", "sweep", str(path), *(overrides or []), "--runs-dir",
               str(runs_dir), "--name", name, "--storage", url, "--workers", "1"]
    if base_config.backend != "cpu" and cuda_usable():
        warm_in_child(spec.raw, sweep_dir / "warmup.log")
    return run_workers(command, workers, base_config.backend, sweep_dir, study, spec)


def _show(table) -> None:
    """A terminal gets the table at its width; a log or a pipe gets it whole, not squeezed into 80 columns."""
    if console.is_terminal:
        console.print(table)
    else:
        Console(file=console.file, width=Measurement.get(console, console.options.update_width(1000), table).maximum
                ).print(table)


def _open(engine, spec, sweep_dir: Path, name: str, url: str):
    """The study, in a sweep folder created for it if needed (and removed again if it cannot open)."""
    created = not sweep_dir.exists()
    try:
        sweep_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"{sweep_dir}: cannot create the sweep folder ({err.strerror})") from None
    try:
        return engine.open_study(spec, sweep_dir, name, url)
    except UserError:
        if created:
            shutil.rmtree(sweep_dir, ignore_errors=True)
        raise
