"""`mlptrain extract-features`: the saved arrays have the documented names, shapes and dtypes, and equal
the trained model's own layer, computed here directly from the checkpoint (CPU backend, tiny runs on the
real datasets; see `tiny_runs` in conftest)."""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from mlptrain.backends.cpu import CpuBackend
from mlptrain.config.load import load_config
from mlptrain.data import load_dataset
from mlptrain.data.loader import whole_split
from mlptrain.dtypes import float32_from_bf16, from_float32
from mlptrain.nn import make_model, model_dataset
from mlptrain.probe.features import encode_split, extract_features
from mlptrain.training.checkpoint import load_checkpoint
from tests.conftest import DATA_DIR

TRAIN_ROWS = [0, 1, 17, 2500, 59999]  # a few rows, the last one included


def cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "mlptrain", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "MLPTRAIN_DATA_DIR": str(DATA_DIR)})


def model_of(run_dir, checkpoint="best", rows=8):
    """The run's model built here from its config.yaml, with the checkpoint's parameters, and its dataset as
    the model reads it."""
    config = load_config(run_dir / "config.yaml")
    dataset = model_dataset(config, load_dataset(config.data.dataset, DATA_DIR))
    model = make_model(config, CpuBackend(), dataset, rows)
    model.load_parameters(load_checkpoint(run_dir / "checkpoints" / f"{checkpoint}.npz"), prefix="params/")
    return model, dataset


def set_input(model, images, scale, shift):
    """The model's input batch as the run trains on it: pixel * scale + shift in float32, stored in the
    model's format."""
    x, _ = model.batch(len(images))
    x[...] = from_float32(images.astype(np.float32) * np.float32(scale) + np.float32(shift), x.dtype)
    return len(images)


@pytest.fixture(scope="module")
def ae_latent(tiny_runs, tmp_path_factory):
    # a copy: the default output lands in the run directory, which the session's other tests share
    run = tmp_path_factory.mktemp("copy") / "ae"
    shutil.copytree(tiny_runs["ae"], run)
    result = cli("extract-features", run, cwd=tmp_path_factory.mktemp("cwd"))
    assert result.returncode == 0, result.stderr
    assert "images/s" in result.stderr
    with np.load(run / "features.npz", allow_pickle=False) as npz:
        return {key: npz[key] for key in npz.files}


def test_autoencoder_latent_file_has_the_documented_arrays(ae_latent):
    f = ae_latent
    assert f["train_x"].shape == (5085, 8 * 8 * 4) and f["test_x"].shape == (1017, 8 * 8 * 4)
    assert f["train_x"].dtype == f["test_x"].dtype == np.float32
    assert f["train_y"].dtype == f["test_y"].dtype == np.int64
    cifar = load_dataset("cifar10", DATA_DIR)
    np.testing.assert_array_equal(f["train_y"], cifar.train_labels)  # the whole train part, in order
    np.testing.assert_array_equal(f["test_y"], cifar.test_labels)
    assert (str(f["run"]), str(f["layer"]), str(f["checkpoint"]), str(f["dataset"])) == ("ae", "latent", "best",
                                                                                         "cifar10")
    assert (f["train_x"] >= 0).all() and (f["train_x"] > 0).any()  # max-pooled ReLU outputs
    assert f["class_names"].tolist() == list(cifar.class_names) and f["class_names"][0] == "airplane"


def test_autoencoder_latent_equals_the_encoder_run_directly(tiny_runs, ae_latent):
    """The first and the last (ragged) batch of each split, encoded here: bitwise what was saved (the same
    batches, so the same summation order)."""
    batch = 256  # the run's train.eval_batch_size, extraction's default
    model, dataset = model_of(tiny_runs["ae"], rows=batch)
    for split in ("train", "test"):
        images = getattr(dataset, f"{split}_images")
        for start in (0, len(images) - len(images) % batch):
            n = set_input(model, images[start:start + batch], 1.0 / 255.0, 0.0)
            model.encode(n)
            latent = model.latent(n)
            assert latent.shape == (n, 8, 8, 4)
            np.testing.assert_array_equal(ae_latent[f"{split}_x"][start:start + n], latent.reshape(n, -1),
                                          err_msg=f"{split} rows {start}:{start + n}")


def test_autoencoder_input_layer_is_the_nhwc_pixels_over_255(tiny_runs):
    out = extract_features(tiny_runs["ae"], "last", "input", batch_size=1000)
    cifar = load_dataset("cifar10", DATA_DIR)
    nhwc = cifar.test_images.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1).reshape(len(cifar.test_images), -1)
    assert out.features.test_x.shape == (1017, 3072) and out.features.layer == "input"
    np.testing.assert_array_equal(out.features.test_x, nhwc.astype(np.float32) * np.float32(1 / 255))
    assert out.seconds > 0 and out.images_per_s == pytest.approx((5085 + 1017) / out.seconds)


def test_mlp_default_layer_is_the_last_hidden_one(tiny_runs, tmp_path):
    run, out = tiny_runs["mlp"], tmp_path / "mlp.npz"
    result = cli("extract-features", run, "--checkpoint", "last", "--out", out, "--batch-size", 7000, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert not (run / "features.npz").exists()
    with np.load(out, allow_pickle=False) as f:
        assert f["train_x"].shape == (60000, 16) and f["test_x"].shape == (10000, 16)
        assert f["train_x"].dtype == np.float32 and f["test_y"].dtype == np.int64
        assert (str(f["layer"]), str(f["checkpoint"])) == ("hidden1", "last")
        train_x, test_x = f["train_x"], f["test_x"]
    model, dataset = model_of(run, "last", rows=7000)
    scale, shift = 1.0 / (255.0 * dataset.std), -dataset.mean / dataset.std
    n = set_input(model, dataset.test_images[7000:], scale, shift)  # the last batch, as extraction ran it
    model.forward(n)
    np.testing.assert_array_equal(test_x[7000:], model.activations(n, 1))
    # and that layer is relu(x W1 + b1), in float64
    params = load_checkpoint(run / "checkpoints" / "last.npz")
    x = (dataset.train_images[TRAIN_ROWS] / 255.0 - dataset.mean) / dataset.std
    reference = np.maximum(x @ params["params/fc1.weight"].astype(np.float64) + params["params/fc1.bias"], 0.0)
    np.testing.assert_allclose(train_x[TRAIN_ROWS], reference, rtol=1e-5, atol=1e-5)


def test_bf16_activations_are_saved_as_their_exact_float32_values(tiny_runs):
    run = tiny_runs["mlp-bf16"]
    out = extract_features(run, "best", None, batch_size=5000)
    assert out.features.layer == "hidden1" and out.features.test_x.dtype == np.float32
    assert not (out.features.test_x.view(np.uint32) & 0xFFFF).any()  # bf16 values, nothing rounded away
    model, dataset = model_of(run, rows=5000)
    assert model.activations(1, 1).dtype == np.uint16  # bf16 storage
    n = set_input(model, dataset.test_images[:5000], 1.0 / (255.0 * dataset.std), -dataset.mean / dataset.std)
    model.forward(n)
    np.testing.assert_array_equal(out.features.test_x[:5000], float32_from_bf16(model.activations(n, 1)))


@pytest.mark.gpu
def test_cuda_extraction_matches_the_cpu_backend(rng):
    """encode_split on the CUDA backend (the simulator in CI) against the NumPy one, same parameters,
    a tiny autoencoder on 8x8 images."""
    from mlptrain.backends.selection import get_backend
    from mlptrain.config.load import config_from_dict
    from tests.nn.test_autoencoder import tiny_images

    config = config_from_dict({"data": {"dataset": "cifar10"}, "model": {"type": "conv_autoencoder",
                                                                         "channels": [3, 2]}})
    dataset = model_dataset(config, tiny_images(rng, side=8, train=5, test=1))
    out = {}
    for name in ("cpu", "cuda"):
        backend = get_backend(name)
        model = make_model(config, backend, dataset, 3)
        model.init_parameters(np.random.default_rng(4), "he_uniform", "zeros")
        split = whole_split(backend, dataset.train_images, dataset.train_labels)
        out[name] = encode_split(model, backend, split, "latent", 3, 1.0 / 255.0, 0.0)
    assert out["cuda"].shape == (5, 2 * 2 * 2) and out["cuda"].dtype == np.float32
    np.testing.assert_allclose(out["cuda"], out["cpu"], rtol=1e-5, atol=1e-6)
