"""`mlptrain extract-features`: a trained run's encoder applied to the whole dataset, saved as an .npz.

Layers (`--layer`):

    conv_autoencoder  latent (default): the last encoder max-pool's output, flattened in NHWC order
                      (8 x 8 x 128 = 8,192 values for the default model)
    mlp               hidden1 ... hiddenL (default: the last): a hidden layer after its activation
    both              input: the normalised pixels the model sees (pixels / 255 for the autoencoder, in
                      its NHWC order; (pixels / 255 - mean) / std for the MLP): the raw-pixel baseline

"Train" is the dataset's whole training part (the rows a run held out for validation included), "test"
its test part, both in the dataset's order. Features are float32 whatever the run's precision (fp16 and
bf16 activations are converted exactly on the host); labels are int64.

With `pool` (mlptrain.probe.pooling), the latent of each batch is pooled over a G x G grid of regions
before it is kept: G * G * C values per image.

The file holds `train_x` (N, D) float32, `train_y` (N,) int64, `test_x` (M, D) float32, `test_y` (M,)
int64, and the strings `run`, `layer`, `pool` ("avg 2x2", "max 4x4", or "" unpooled), `checkpoint` (best
or last) and `dataset`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mlptrain.config.schema import Config
from mlptrain.data.loader import ResidentSplit, whole_split
from mlptrain.dtypes import to_float32
from mlptrain.errors import UserError
from mlptrain.inference.loading import check_run_data, load_fitting_model, load_run, warn_fallbacks
from mlptrain.nn import input_scale_shift
from mlptrain.probe.pooling import GridPool, check_grid
from mlptrain.training.checkpoint import save_checkpoint
from mlptrain.training.experiment import Resources
from mlptrain.util.npz_archive import open_npz

ARRAYS = ("train_x", "train_y", "test_x", "test_y")


@dataclass(frozen=True)
class FeatureSet:
    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    run: str
    layer: str
    class_names: tuple[str, ...] = ()  # the dataset's, by label (empty for files written without them)
    pool: str = ""  # "avg 2x2", "max 4x4", ...: how the layer was pooled; "" when it was not


# ---- which layer: checked before the dataset is read


def layer_names(config: Config) -> list[str]:
    if config.model.type == "conv_autoencoder":
        return ["latent", "input"]
    return [f"hidden{i}" for i in range(1, len(config.model.hidden) + 1)] + ["input"]


def resolve_layer(config: Config, layer: str | None) -> str:
    """`layer`, or the model's default one; raises UserError naming the valid layers."""
    names = layer_names(config)
    if layer is None:
        if config.model.type == "mlp" and not config.model.hidden:
            raise UserError("the run's MLP has no hidden layer; give --layer input (the pixels)")
        return names[0] if config.model.type == "conv_autoencoder" else names[-2]
    if layer not in names:
        raise UserError(f"--layer {layer}: the run's {config.model.type} has no such layer; valid: {', '.join(names)}")
    return layer


# ---- running the encoder


def layer_width(model, layer: str) -> int:
    if layer == "input":
        return model.batch(1)[0].shape[1]
    if layer == "latent":
        return math.prod(model.latent_shape)
    return model.widths[int(layer.removeprefix("hidden"))]


def read_layer(model, rows: int, layer: str):
    """Run what `layer` needs on the gathered input batch; its device array (rows, ...)."""
    if layer == "input":
        return model.batch(rows)[0]
    if layer == "latent":
        model.encode(rows)  # the encoder only: the decoder's work would be thrown away
        return model.latent(rows)
    model.forward(rows)
    return model.activations(rows, int(layer.removeprefix("hidden")))


def encode_split(model, backend, split: ResidentSplit, layer: str, batch: int, scale: float, shift: float,
                 on_batch=None, pool: GridPool | None = None) -> np.ndarray:
    """float32 (split.size, width) features of every image of `split`, in its order, `batch` rows at a time
    (the pattern of mlptrain.training.loop.evaluate: gather + normalise on the device, then the layers); with
    `pool`, each batch's latent pooled over its grid."""
    width = layer_width(model, layer) if pool is None else pool.width(model.latent_shape)
    out = np.empty((split.size, width), np.float32)
    gather = backend.kernels.data.gather_batch
    for start in range(0, split.size, batch):
        rows = min(batch, split.size - start)
        x, labels = model.batch(rows)
        gather(split.images, split.labels, split.device_index, start, x, labels, scale, shift)
        host = to_float32(backend.to_host(read_layer(model, rows, layer)))
        out[start:start + rows] = host.reshape(rows, -1) if pool is None else pool(host)
        if on_batch is not None:
            on_batch(rows)
    return out


@dataclass(frozen=True)
class Extraction:
    features: FeatureSet
    checkpoint: str
    dataset: str
    seconds: float  # the train and test passes, after one warm-up batch (kernel compilation)
    images_per_s: float
    device: str


def extract_features(run_dir: Path, checkpoint: str = "best", layer: str | None = None,
                     batch_size: int | None = None, progress=None, pool: GridPool | None = None) -> Extraction:
    """The run's `layer` over its dataset's train and test parts, on the run's backend, `batch_size` images
    at a time (default: its train.eval_batch_size), pooled by `pool` when given (the latent only).
    `progress` is a rich Progress to show the passes in, or None. Raises UserError."""
    config, path = load_run(run_dir, checkpoint)
    layer = resolve_layer(config, layer)
    backend, dataset = Resources().prepare(config)
    check_run_data(run_dir, config, dataset)
    model, dataset = load_fitting_model(config, path, backend, dataset, batch_size or config.train.eval_batch_size,
                                        "--batch-size")
    batch = model.max_rows
    if pool is not None:
        check_grid(pool, model.latent_shape)
    warn_fallbacks(backend, dataset)  # after every refusal: an error stays one line
    scale, shift = input_scale_shift(model, dataset)
    splits = {"train": whole_split(backend, dataset.train_images, dataset.train_labels),
              "test": whole_split(backend, dataset.test_images, dataset.test_labels)}
    warm = whole_split(backend, dataset.test_images[:batch], dataset.test_labels[:batch])
    encode_split(model, backend, warm, layer, batch, scale, shift, pool=pool)  # compiles outside the timing
    backend.synchronize()
    t0 = time.perf_counter()
    x = {name: encode_split(model, backend, split, layer, batch, scale, shift, _bar(progress, name, split.size),
                            pool) for name, split in splits.items()}
    backend.synchronize()
    seconds = max(time.perf_counter() - t0, 1e-9)
    features = FeatureSet(x["train"], dataset.train_labels.astype(np.int64), x["test"],
                          dataset.test_labels.astype(np.int64), run_dir.resolve().name, layer, dataset.class_names,
                          pool.describe() if pool is not None else "")
    images = sum(split.size for split in splits.values())
    return Extraction(features, checkpoint, dataset.name, seconds, images / seconds, backend.device_name)


def _bar(progress, name: str, total: int):
    """An on_batch callback that moves a new bar `name` of `progress` (None without a progress)."""
    if progress is None:
        return None
    task = progress.add_task(name, total=total)
    return lambda rows: progress.advance(task, rows)


# ---- the .npz file


def save_features(path: Path, extraction: Extraction, overwrite: bool = True) -> None:
    """Atomically (temporary file, fsync, rename, as a checkpoint is written): never half a file; without
    `overwrite` never over a file of that name (mlptrain.util.atomic)."""
    f = extraction.features
    save_checkpoint(path, {"train_x": f.train_x, "train_y": f.train_y, "test_x": f.test_x, "test_y": f.test_y,
                           "run": np.array(f.run), "layer": np.array(f.layer), "pool": np.array(f.pool),
                           "checkpoint": np.array(extraction.checkpoint), "dataset": np.array(extraction.dataset),
                           "class_names": np.array(f.class_names, dtype=str)}, overwrite)


def load_features(path: Path) -> FeatureSet:
    """A features file, checked: the four arrays present, numeric, finite, of matching lengths and widths.
    Raises UserError naming the file."""
    with open_npz(path, "features file", "mlptrain extract-features writes one") as npz:
        missing = [name for name in ARRAYS if name not in npz.files]
        if missing:
            raise UserError(f"{path}: no {', '.join(missing)} array (a features file holds "
                            f"{', '.join(ARRAYS)}; mlptrain extract-features writes one)")
        arrays = {name: npz[name] for name in ARRAYS}
        names = {key: str(npz[key]) if key in npz.files and npz[key].ndim == 0 else ""
                 for key in ("run", "layer", "pool")}
        class_names = npz["class_names"] if "class_names" in npz.files else np.array([], dtype=str)
    for split in ("train", "test"):
        _check_split(path, split, arrays[f"{split}_x"], arrays[f"{split}_y"])
    if arrays["train_x"].shape[1] != arrays["test_x"].shape[1]:
        raise UserError(f"{path}: train_x has {arrays['train_x'].shape[1]} features per image, test_x "
                        f"{arrays['test_x'].shape[1]}")
    if class_names.ndim != 1 or (class_names.size and class_names.dtype.kind != "U"):
        raise UserError(f"{path}: class_names must be a 1-D array of strings, got {class_names.dtype} "
                        f"{class_names.shape}")
    for split in ("train", "test") if class_names.size else ():  # names go by label: each label needs one
        y = arrays[f"{split}_y"]
        if y.min() < 0 or y.max() >= len(class_names):
            bad = int(y.min()) if y.min() < 0 else int(y.max())
            raise UserError(f"{path}: {split}_y holds label {bad} but class_names names {len(class_names)} classes "
                            f"(labels 0..{len(class_names) - 1})")
    layer = (names["layer"] or "?") + (f" ({names['pool']}-pooled)" if names["pool"] else "")
    return FeatureSet(**arrays, run=names["run"] or path.stem, layer=layer, class_names=tuple(class_names.tolist()),
                      pool=names["pool"])


def _check_split(path: Path, split: str, x: np.ndarray, y: np.ndarray) -> None:
    if x.ndim != 2 or not x.size or not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
        raise UserError(f"{path}: {split}_x must be a non-empty 2-D array of numbers, got {x.dtype} {x.shape}")
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise UserError(f"{path}: {split}_y must be a 1-D array of integer labels, got {y.dtype} {y.shape}")
    if len(x) != len(y):
        raise UserError(f"{path}: {split}_x has {len(x)} rows but {split}_y {len(y)} labels")
    if not np.isfinite(x).all():
        raise UserError(f"{path}: {split}_x holds NaN or infinite values")
