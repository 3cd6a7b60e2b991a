"""`mlptrain extract-features RUN_DIR [--checkpoint best|last] [--layer NAME] [--out FILE] [--batch-size N]`:
a trained run's encoder over its dataset's train and test parts, written to an .npz (see mlptrain.probe.features)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from mlptrain.cli.options import new_output, positive_int
from mlptrain.run_dirs.lock import claim_output
from mlptrain.util.console import console, pass_progress


def extract_features(
    run_dir: Path = typer.Argument(..., metavar="RUN_DIR", help="a run directory, e.g. runs/<name>"),
    checkpoint: str = typer.Option("best", "--checkpoint", metavar="best|last", help="which checkpoint to load"),
    layer: Optional[str] = typer.Option(None, "--layer", metavar="NAME",
                                        help="latent (autoencoder; its default), hidden1..hiddenL (MLP; default "
                                             "the last), input (the normalised pixels)"),
    out: Optional[Path] = typer.Option(None, "--out", metavar="FILE", help="default RUN_DIR/features.npz"),
    force: bool = typer.Option(False, "--force", help="overwrite an existing output file"),
    batch_size: Optional[str] = typer.Option(None, "--batch-size", metavar="N",
                                             help="images per batch (default: the run's train.eval_batch_size)"),
    pool: Optional[str] = typer.Option(None, "--pool", metavar="avg|max",
                                       help="pool the autoencoder's latent over a G x G grid of regions"),
    grid: Optional[str] = typer.Option(None, "--grid", metavar="G", help="the pooling grid (default 2: quadrants)"),
) -> None:
    """Run a trained model's encoder over its dataset; writes train_x, train_y, test_x, test_y to an .npz."""
    # the command's own modules, imported when it runs: --help and the other commands start without them
    from mlptrain.inference.loading import load_run
    from mlptrain.probe.features import extract_features as extract
    from mlptrain.probe.features import resolve_layer, save_features
    from mlptrain.probe.pooling import grid_pool

    config, _ = load_run(run_dir, checkpoint)  # every refusal before the dataset is read
    pooling = grid_pool(pool, positive_int(grid, "--grid") if grid is not None else None,
                        resolve_layer(config, layer))
    out = new_output(out if out is not None else run_dir / "features.npz", force, (config.data.path,))
    claim_output(out, "extract-features")
    batch = positive_int(batch_size, "--batch-size") if batch_size is not None else None
    with pass_progress() as progress:
        extraction = extract(run_dir, checkpoint, layer, batch, progress=progress, pool=pooling)
    save_features(out, extraction, overwrite=force)  # never over a file made meanwhile
    f = extraction.features
    pooled = f" ({f.pool}-pooled)" if f.pool else ""
    console.print(f"{f.layer}{pooled} features of {f.run} ({extraction.checkpoint} checkpoint): "
                  f"train {f.train_x.shape}, test {f.test_x.shape}, float32, in {extraction.seconds:.2f} s on "
                  f"{extraction.device} ({extraction.images_per_s:,.0f} images/s)", highlight=False, soft_wrap=True)
    console.print(f"written to {out}", highlight=False, soft_wrap=True)
