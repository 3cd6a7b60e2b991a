"""`mlptrain evaluate RUN_DIR [--checkpoint best|last] [--split test|val|train] [--data DATA] [--out FILE]`:
a trained run on one split: loss and accuracy (or MSE), per class, the confusion matrix; eval-<split>.json."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich import box
from rich.table import Table

from mlptrain.cli.options import BACKEND_HELP, backend_name, new_output, positive_int
from mlptrain.run_dirs.lock import claim_output
from mlptrain.run_dirs.records import write_json
from mlptrain.util.console import console, pass_progress


def evaluate(
    run_dir: Path = typer.Argument(..., metavar="RUN_DIR", help="a run directory, e.g. runs/<name>"),
    checkpoint: str = typer.Option("best", "--checkpoint", metavar="best|last", help="which checkpoint to load"),
    split: str = typer.Option("test", "--split", metavar="test|val|train",
                              help="the dataset's test part, or the run's validation or training rows"),
    data: Optional[str] = typer.Option(None, "--data", metavar="DATA",
                                       help="another dataset of the same image shape: a name (fashion_mnist) or "
                                            "data KEY=VALUE pairs (dataset=npz,path=my.npz)"),
    out: Optional[Path] = typer.Option(None, "--out", metavar="FILE", help="default RUN_DIR/eval-<split>.json"),
    force: bool = typer.Option(False, "--force", help="overwrite an existing output file"),
    backend: str = typer.Option("cpu", "--backend", metavar="cpu|cuda|auto", help=BACKEND_HELP),
    batch_size: Optional[str] = typer.Option(None, "--batch-size", metavar="N",
                                             help="images per batch (default: the run's train.eval_batch_size)"),
) -> None:
    """Evaluate a trained run's checkpoint on a split; prints tables, writes eval-<split>.json."""
    # the command's own modules, imported when it runs: --help and the other commands start without them
    from mlptrain.errors import UserError
    from mlptrain.inference.loading import checkpoint_origin, describe_origin, load_run
    from mlptrain.inference.model import SPLITS, load_trained
    from mlptrain.inference.report import evaluation_report

    config, _ = load_run(run_dir, checkpoint)  # every refusal before the dataset is read
    if split not in SPLITS:
        raise UserError(f"--split {split}: use {', '.join(SPLITS)}")
    rows = positive_int(batch_size, "--batch-size") if batch_size is not None else None
    default = f"eval-{split}.json" if data is None else f"eval-{split}-{_slug(data)}.json"
    out = new_output(out if out is not None else run_dir / default, force, (config.data.path,))
    claim_output(out, "evaluate")  # a busy run or a read-only folder: one line now, not after the work
    trained = load_trained(run_dir, checkpoint, backend_name(backend), rows, data)
    with pass_progress() as progress:
        report = evaluation_report(trained, split, progress)
    origin = checkpoint_origin(run_dir, checkpoint)  # which epoch, and why: the summary reports the last one
    report.update({f"checkpoint_{k}": v for k, v in origin.items()})
    console.print(f"[bold]{report['run']}[/] ({describe_origin(checkpoint, origin)}) on {report['dataset']} "
                  f"{report['split']}: {report['images']:,} images", highlight=False, soft_wrap=True)
    for table in tables(report):
        console.print(table)
    write_json(out, report, overwrite=force)  # never over a file made meanwhile
    console.print(f"written to {out}", highlight=False, soft_wrap=True)


def _slug(data: str) -> str:
    """A file-name part for --data: its dataset name, or its pairs with unsafe characters replaced."""
    return "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in data.split(",")[0].split("=")[-1])[:40]


def tables(report: dict) -> list[Table]:
    """The summary, per-class results, and (classifiers) the confusion matrix."""
    summary = Table("metric", "value")
    keys = ("loss", "acc") if "acc" in report else ("mse", "mean_image_mse")
    for key in keys:
        summary.add_row(key, "-" if report[key] is None else f"{report[key]:.4g}")
    metric = "acc" if "acc" in report else "mse"
    per_class = Table("class", "name", "images", metric, title=f"per-class {metric}")
    for row in report["per_class"]:
        per_class.add_row(str(row["class"]), row["name"], f"{row['images']:,}",
                          "-" if row[metric] is None else f"{row[metric]:.4g}")
    out = [summary, per_class]
    if "confusion_matrix" in report:
        names = report["class_names"]
        matrix = Table("true \\ predicted", *(str(k) for k in range(len(names))), box=box.SIMPLE_HEAD, pad_edge=False,
                       title="confusion matrix (rows: true class, columns: predicted class)")
        for k, row in enumerate(report["confusion_matrix"]):
            matrix.add_row(str(k) if names[k] == str(k) else f"{k} {names[k]}", *(str(n) for n in row))
        out.append(matrix)
    return out
