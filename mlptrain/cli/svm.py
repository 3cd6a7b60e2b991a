"""`mlptrain svm FEATURES [--C VALUE[,VALUE...]] [--no-standardize] [--max-iter N] [--out FILE]`: a linear
SVM on a features file; prints accuracy, per-class accuracy and the confusion matrix, writes FEATURES' name
with .svm.json (pixels.npz -> pixels.svm.json), so that SVMs of several features files in one folder each
keep their report."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from mlptrain.cli.options import new_output, positive_int
from mlptrain.run_dirs.lock import claim_output
from mlptrain.run_dirs.records import write_json
from mlptrain.util.console import console, warn


def svm(
    features: Path = typer.Argument(..., metavar="FEATURES", help="an .npz from mlptrain extract-features"),
    c: str = typer.Option("0.001", "--C", metavar="VALUE[,VALUE...]",
                          help="the penalty C; several values pick the best on 20% of the training features. "
                               "Standardised features of thousands of dimensions want a small C: liblinear's "
                               "own default, 1.0, takes minutes there and rarely converges"),
    no_standardize: bool = typer.Option(False, "--no-standardize",
                                        help="use the features as they are (default: standardised on train)"),
    max_iter: str = typer.Option("1000", "--max-iter", metavar="N", help="liblinear's iteration limit"),
    out: Optional[Path] = typer.Option(None, "--out", metavar="FILE",
                                       help="default: beside FEATURES, named after it (features.svm.json)"),
    force: bool = typer.Option(False, "--force", help="overwrite an existing output file"),
) -> None:
    """Train a linear SVM on train_x/train_y of a features file and evaluate it on test_x/test_y."""
    # the command's own modules, imported when it runs: --help and the other commands start without them
    from mlptrain.probe.features import load_features
    from mlptrain.probe.svm import parse_c_values, svm_report

    cs = parse_c_values(c)
    iterations = positive_int(max_iter, "--max-iter")
    data = load_features(features)
    out = new_output(out if out is not None else features.with_name(features.stem + ".svm.json"), force, (features,))
    claim_output(out, "svm")
    report = svm_report(data, features, cs, standardize=not no_standardize, max_iter=iterations)
    for note in report["warnings"]:
        warn(note)
    for table in tables(report):
        console.print(table)
    write_json(out, report, overwrite=force)  # never over a file made meanwhile
    console.print(f"written to {out}", highlight=False, soft_wrap=True)


def tables(report: dict) -> list[Table]:
    """Summary, the C selection (when there was one), per-class accuracy, confusion matrix."""
    summary = Table("metric", "value", title=f"linear SVM on {report['layer']} features of {report['run']} "
                    f"({report['feature_dim']:,}-d)")
    summary.add_row("test accuracy", f"{report['test_acc']:.4f}")
    summary.add_row("train accuracy", f"{report['train_acc']:.4f}")
    summary.add_row("C", f"{report['C']:g}")
    summary.add_row("standardised", "yes" if report["standardize"] else "no")
    summary.add_row("train / test images", f"{report['train_size']:,} / {report['test_size']:,}")
    summary.add_row("fit seconds", f"{report['fit_s']:.2f}")
    out = [summary]
    if report["C_selection"]:
        selection = Table("C", "held-out accuracy", title=f"C chosen on {report['held_out_fraction']:.0%} of the "
                          "training features")
        for row in report["C_selection"]:
            mark = "  <- chosen" if row["C"] == report["C"] else ""
            selection.add_row(f"{row['C']:g}", f"{row['val_acc']:.4f}{mark}")
        out.append(selection)
    per_class = Table("class", "test images", "accuracy", title="per-class test accuracy")
    names = report.get("class_names") or [str(k) for k in report["classes"]]
    for k, name, accuracy, row in zip(report["classes"], names, report["per_class_acc"], report["confusion_matrix"]):
        label = str(k) if name == str(k) else f"{k} {escape(name)}"
        per_class.add_row(label, f"{sum(row):,}", "-" if accuracy is None else f"{accuracy:.4f}")
    out.append(per_class)
    matrix = Table("true", *(str(k) for k in report["classes"]), title="confusion matrix (rows: true, columns: "
                   "predicted)", box=box.SIMPLE_HEAD, pad_edge=False)
    for k, row in zip(report["classes"], report["confusion_matrix"]):
        matrix.add_row(str(k), *(str(n) for n in row))
    out.append(matrix)
    return out
