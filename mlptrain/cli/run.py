"""`mlptrain run CONFIG [KEY=VALUE ...]` or `mlptrain run --resume RUN_DIR [train.epochs=N]`: build the
config, the data and the model (every refusal happens there), then create (or reopen) the run directory
and train. Ctrl-C or SIGTERM stops after the current optimizer step with a checkpoint to resume from."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from mlptrain.cli.configs import print_resolved, resolve_config
from mlptrain.errors import UserError


def run(
    config: Optional[str] = typer.Argument(None, help="a YAML config file or a built-in config name "
                                                      "(none with --resume)"),
    overrides: Optional[List[str]] = typer.Argument(None, help="KEY=VALUE overrides, e.g. optim.lr=3e-4"),
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="folder that holds the run directories"),
    name: Optional[str] = typer.Option(None, "--name", help="run name (default: <config>-<timestamp>)"),
    resume: Optional[Path] = typer.Option(None, "--resume", help="continue this run directory from its last "
                                                                 "checkpoint; overrides may only extend "
                                                                 "train.epochs"),
    print_config: bool = typer.Option(False, "--print-config", help="print the resolved config (overrides "
                                                                    "applied, every default filled in) and exit "
                                                                    "without training or writing anything"),
    seeds: Optional[str] = typer.Option(None, "--seeds", metavar="N|S,S,...",
                                        help="one run per seed (N: seeds 0 to N-1), in NAME/seed-S/, then "
                                             "NAME/seeds.json and each metric's mean and 95% CI"),
    pack: str = typer.Option("1", "--pack", metavar="K|auto",
                             help="with --seeds: train this many seeds at once from one thread (an MLP's in lanes, "
                             "one launch for each kernel of all their steps; other models side by side, their "
                             "kernels overlapping on the GPU); auto: as many as add throughput, measured on this "
                             "GPU once"),
) -> None:
    """Train a model from a config; writes runs/<name>/."""
    # first, so that the CUDA driver starts (0.2 s, in a thread) while the command's modules below are imported
    from mlptrain.backends.driver.early import start_driver

    start_driver()
    # here, not at the top: `mlptrain --help` and the other commands need none of this (numpy, the data loaders)
    from rich.table import Table

    from mlptrain.cli.seeds import finish_seeds, run_seeds
    from mlptrain.cli.signals import StopOnSignal
    from mlptrain.config.load import load_config
    from mlptrain.run_dirs.folders import check_run_name
    from mlptrain.seeds.finish import is_group
    from mlptrain.training.experiment import Resources, check_same_dataset, create_run, whole_or_removed
    from mlptrain.training.loop import train
    from mlptrain.packing.side_by_side import check_pack
    from mlptrain.training.resume import prepare_resume
    from mlptrain.training.session import build_session
    from mlptrain.util.console import console

    overrides = overrides or []
    start = None
    pack = check_pack(pack)
    if pack != 1 and (seeds is None or resume is not None):
        raise UserError("--pack trains several seeds side by side: give it with --seeds (a sweep takes "
                        "`mlptrain sweep --pack`)")
    if resume is not None:
        if print_config:
            raise UserError("--print-config shows a config before a run; a run's own is RUN_DIR/config.yaml")
        if name is not None or seeds is not None:
            flag = "--name" if name is not None else "--seeds"
            raise UserError(f"--resume continues one run in its own directory; drop {flag}")
        if config is not None and "=" not in config:  # a CONFIG beside --resume: the run has its own
            raise UserError(f"--resume {resume} continues the run with its own config.yaml: drop '{config}' (only "
                            "train.epochs=N may be given, to train for longer)")
        # with no CONFIG, the first KEY=VALUE lands in the CONFIG argument
        if is_group(resume):  # a --seeds group: its unfinished seeds, then seeds.json
            return finish_seeds(resume, ([config] if config is not None else []) + overrides)
        cfg, start = prepare_resume(resume, ([config] if config is not None else []) + overrides)
        session = build_session(cfg, *Resources().prepare(cfg, start_compilers=True))
        check_same_dataset(resume, cfg, session.dataset)
        run_dir = resume
    else:
        if config is None:
            raise UserError("give a CONFIG (a YAML file or one of `mlptrain configs`) or --resume RUN_DIR")
        path = resolve_config(config)
        if print_config:
            print_resolved(path, overrides)
            return
        if seeds is not None:
            return run_seeds(path, overrides, seeds, runs_dir, name, pack)
        cfg = load_config(path, overrides)
        if name is not None:
            check_run_name(name)
        session = build_session(cfg, *Resources().prepare(cfg, start_compilers=True))  # before anything is written
        run_dir = create_run(cfg, runs_dir, name, path.stem, dataset=session.dataset, backend=session.backend.name)
    with StopOnSignal() as stop, whole_or_removed(run_dir, new=start is None):
        summary = train(session, run_dir, resume=start, stop=stop)
    table = Table("metric", "value")
    for key in ("test_acc", "test_loss", "val_acc", "test_mse", "val_mse", "mean_image_mse", "epochs",
                "best_epoch", "optimizer_steps", "samples_per_s", "wall_s", "wall_s_total"):
        if key not in summary or (key == "wall_s_total" and not summary.get("resumed")):
            continue
        value = summary[key]
        table.add_row(key, f"{value:.6g}" if isinstance(value, float) else str(value))
    console.print(table)
    line = checkpoint_line(summary)
    if line:
        console.print(line, highlight=False)
    console.print(f"run written to {run_dir} (tensorboard --logdir {run_dir.parent})")


def checkpoint_line(summary: dict) -> str | None:
    """Which epoch the metrics above are, and which the `best` checkpoint holds (and by what rule): evaluate
    loads `best` by default, so its numbers differ from the summary's when the last epoch was not the best."""
    metric, epoch, best_epoch = summary.get("selected_by"), summary.get("epoch"), summary.get("best_epoch")
    value = summary.get(f"best_{metric}")
    if metric is None or value is None or epoch is None or not best_epoch:
        return None
    best = f"the best {metric} ({value:.4g})"
    if summary.get("restored_best"):
        return (f"the metrics are epoch {epoch}'s, {best}, restored by early stopping (checkpoints/best.npz); "
                "mlptrain evaluate loads it by default")
    if best_epoch == epoch:
        return f"the metrics are the last epoch's ({epoch}), also {best}: checkpoints/last.npz and best.npz hold it"
    return (f"the metrics are the last epoch's ({epoch}, checkpoints/last.npz); checkpoints/best.npz holds epoch "
            f"{best_epoch}, {best}, which mlptrain evaluate loads unless --checkpoint last")
