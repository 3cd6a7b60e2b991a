"""`mlptrain export RUN_DIR --format safetensors|onnx [--out FILE]`: a trained run's model for other tools
(see mlptrain.export); an ONNX file is checked against mlptrain's forward pass before it is written."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from mlptrain.cli.options import new_output
from mlptrain.run_dirs.lock import claim_output
from mlptrain.util.console import console


def export(
    run_dir: Path = typer.Argument(..., metavar="RUN_DIR", help="a run directory, e.g. runs/<name>"),
    fmt: str = typer.Option(..., "--format", metavar="safetensors|onnx", help="the file format"),
    out: Optional[Path] = typer.Option(None, "--out", metavar="FILE",
                                       help="default RUN_DIR/model.safetensors or RUN_DIR/model.onnx"),
    force: bool = typer.Option(False, "--force", help="overwrite an existing output file"),
    checkpoint: str = typer.Option("best", "--checkpoint", metavar="best|last", help="which checkpoint to export"),
) -> None:
    """Export a trained model's float32 weights as safetensors, or the model as an ONNX graph."""
    # the command's own modules, imported when it runs: --help and the other commands start without them
    from mlptrain.export import CHECK_IMAGES, FORMATS, check_format, export_bytes
    from mlptrain.inference.loading import load_run
    from mlptrain.inference.model import load_trained
    from mlptrain.util.atomic import atomic_write

    config, _ = load_run(run_dir, checkpoint)  # every refusal before the dataset is read
    fmt = check_format(fmt)
    out = new_output(out if out is not None else run_dir / f"model{FORMATS[fmt]}", force, (config.data.path,))
    claim_output(out, "export")  # a busy run or a read-only folder: one line now, not after the work
    # fp32: the export holds the master weights, and the ONNX check compares float32 with float32
    trained = load_trained(run_dir, checkpoint, "cpu", CHECK_IMAGES, precision="fp32", images=False)
    data, check = export_bytes(trained, fmt)
    if check is not None:
        also = "" if check.probabilities_diff is None else f"; probabilities {check.probabilities_diff:.3g}"
        console.print(f"onnx check: {check.output} of {check.images} {check.source} by onnxruntime against "
                      f"mlptrain's forward (cpu, fp32): max abs difference {check.max_abs_diff:.3g} (values up to "
                      f"{check.max_abs_value:.3g}){also}", highlight=False, soft_wrap=True)
    with atomic_write(out, binary=True, overwrite=force) as file:  # never over a file made meanwhile
        file.write(data)
    console.print(f"{fmt} ({len(data):,} bytes, {trained.config.model.type}, {checkpoint} checkpoint) written to "
                  f"{out}", highlight=False, soft_wrap=True)
