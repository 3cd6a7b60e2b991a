"""`mlptrain predict RUN_DIR INPUT [--out FILE]`: a trained run's model on a user's images (an .npz, or
PNG / JPEG files); class probabilities and the predicted class, or reconstructions, to an .npz."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer
from rich.table import Table

from mlptrain.cli.options import BACKEND_HELP, backend_name, new_output, positive_int
from mlptrain.errors import UserError
from mlptrain.run_dirs.lock import claim_output
from mlptrain.util.console import console

if TYPE_CHECKING:  # numpy is imported when the command runs, not when the CLI starts
    import numpy as np

SHOWN = 10  # predictions printed; the file holds them all


def predict(
    run_dir: Path = typer.Argument(..., metavar="RUN_DIR", help="a run directory, e.g. runs/<name>"),
    inputs: Path = typer.Argument(..., metavar="INPUT", help="an .npz of images (N, C, H, W), (N, H, W, C) or "
                                                             "(N, D), pixels 0..255; or a PNG/JPEG file or folder"),
    out: Optional[Path] = typer.Option(None, "--out", metavar="FILE", help="default RUN_DIR/predictions.npz"),
    force: bool = typer.Option(False, "--force", help="overwrite an existing output file"),
    checkpoint: str = typer.Option("best", "--checkpoint", metavar="best|last", help="which checkpoint to load"),
    backend: str = typer.Option("cpu", "--backend", metavar="cpu|cuda|auto", help=BACKEND_HELP),
    batch_size: Optional[str] = typer.Option(None, "--batch-size", metavar="N",
                                             help="images per batch (default: the run's train.eval_batch_size)"),
) -> None:
    """Run a trained model on images; writes probabilities and classes (or reconstructions) to an .npz."""
    # the command's own modules, imported when it runs: --help and the other commands start without them
    import numpy as np

    from mlptrain.inference.image_files import read_images
    from mlptrain.inference.loading import load_run, recorded_inputs
    from mlptrain.inference.model import load_trained, softmax
    from mlptrain.util.atomic import atomic_write

    config, _ = load_run(run_dir, checkpoint)  # every refusal before the dataset is read
    rows = positive_int(batch_size, "--batch-size") if batch_size is not None else None
    out = new_output(out if out is not None else run_dir / "predictions.npz", force,
                     (inputs, config.data.path))
    claim_output(out, "predict")  # a busy run or a read-only folder: one line now, not after the work
    if not inputs.exists():
        raise UserError(f"{inputs}: no such file or folder")
    recorded = recorded_inputs(run_dir)  # what images the model reads, from the run alone: no dataset needed
    resize = config.data.image_size is not None  # trained on a folder's images resized: these are too
    if recorded is not None:  # read first, so that the model holds no more rows than there are images
        pixels, names = read_images(inputs, tuple(recorded.image_shape), recorded.train_images.dtype, resize)
        rows = min(rows or config.train.eval_batch_size, max(len(pixels), 1))
    trained = load_trained(run_dir, checkpoint, backend_name(backend), rows, images=False)
    if recorded is None:  # a run from before runs recorded their inputs: its dataset, read, says
        pixels, names = read_images(inputs, trained.image_shape, trained.dataset.train_images.dtype, resize)
    outputs = trained.images(pixels)
    if trained.classifies:
        probabilities = softmax(outputs)
        predicted = np.argmax(outputs, axis=1)
        arrays = {"probabilities": probabilities, "predicted": predicted.astype(np.int64),
                  "predicted_name": np.array([trained.class_names[k] for k in predicted], dtype=str),
                  "class_names": np.array(trained.class_names, dtype=str)}
        console.print(table(names, predicted, probabilities, trained.class_names))
    else:
        arrays = {"reconstructions": outputs}
        mse = np.mean(np.square(outputs.reshape(len(pixels), -1) - pixels.reshape(len(pixels), -1) / 255.0), axis=1)
        arrays["mse"] = mse.astype(np.float32)
        console.print(f"{len(pixels):,} reconstructions, (N, {', '.join(map(str, trained.image_shape))}) in pixels "
                      f"/ 255; their mean MSE {float(mse.mean()):.4g}", highlight=False)
    arrays.update({"inputs": np.array(names, dtype=str), "run": np.array(trained.run_dir.resolve().name),
                   "checkpoint": np.array(checkpoint)})
    with atomic_write(out, binary=True, overwrite=force) as file:  # never over a file made meanwhile
        np.savez(file, **arrays)
    console.print(f"written to {out}", highlight=False, soft_wrap=True)


def table(names: list[str], predicted: np.ndarray, probabilities: np.ndarray, class_names: list[str]) -> Table:
    shown = min(SHOWN, len(names))
    out = Table("input", "predicted", "probability",
                title=f"{len(names):,} predictions" + (f" (the first {shown})" if shown < len(names) else ""))
    for i in range(shown):
        k = int(predicted[i])
        label = str(k) if class_names[k] == str(k) else f"{k} {class_names[k]}"
        out.add_row(names[i], label, f"{probabilities[i, k]:.4f}")
    return out
