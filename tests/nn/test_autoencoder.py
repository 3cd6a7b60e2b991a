"""The convolutional autoencoder's graph: gradients against central finite differences of a float64
forward written here, the CUDA graph against the NumPy graph, and bitwise determinism on the GPU."""

import numpy as np
import pytest

from mlptrain.backends.cpu import CpuBackend
from mlptrain.config.load import config_from_dict
from mlptrain.data.dataset import ImageDataset
from mlptrain.nn.autoencoder import ConvAutoencoder, autoencoder_convs
from mlptrain.training.loop import train_epoch
from mlptrain.training.session import build_session
from tests.conftest import ON_SIMULATOR
from tests.nn.test_mlp_gradients import central_difference
from tests.training.test_train_backends import (
    assert_one_epoch_is_bitwise_repeatable_on_the_gpu,
    one_epoch_on_both_backends,
)


def conv64(x, w, b):
    """'same' stride-1 convolution, NHWC, float64, by summing the kernel's taps."""
    n, h, wd, _ = x.shape
    k = w.shape[0]
    p = k // 2
    padded = np.pad(x, ((0, 0), (p, p), (p, p), (0, 0)))
    out = np.zeros((n, h, wd, w.shape[3])) + b
    for dh in range(k):
        for dw in range(k):
            out += padded[:, dh:dh + h, dw:dw + wd, :] @ w[dh, dw]
    return out


def pool64(x):
    n, h, w, c = x.shape
    return x.reshape(n, h // 2, 2, w // 2, 2, c).max(axis=(2, 4))


def upsample64(x):
    return x.repeat(2, axis=1).repeat(2, axis=2)


def autoencoder64(x, params, depth, layers):
    a = x
    for i in range(layers):
        z = conv64(a, params[f"conv{i + 1}.weight"], params[f"conv{i + 1}.bias"])
        if i == layers - 1:
            return z
        a = np.maximum(z, 0.0)
        a = pool64(a) if i < depth else upsample64(a)


def test_decoder_mirrors_the_encoder():
    assert autoencoder_convs([256, 128]) == [(3, 256), (256, 128), (128, 128), (128, 256), (256, 3)]
    assert autoencoder_convs([8]) == [(3, 8), (8, 8), (8, 3)]


@pytest.mark.parametrize("kernel_size", [1, 3])
def test_whole_autoencoder_gradient(rng, kernel_size):
    """Every parameter gradient of the mean per-sample MSE: float32 graph vs float64 differences."""
    backend, rows, channels = CpuBackend(), 2, [3, 2]
    model = ConvAutoencoder(backend, (4, 4, 3), channels, kernel_size, max_rows=rows)
    model.init_parameters(rng, "he_uniform", "zeros")
    # small biases so no ReLU sits exactly at its kink
    model.load_parameters({**model.params.to_host_dict(),
                           **{f"conv{i}.bias": rng.uniform(0.05, 0.1, c).astype(np.float32)
                              for i, (_, c) in enumerate(model.convs, start=1)}})
    x = rng.uniform(0, 1, (rows, 4 * 4 * 3)).astype(np.float32)
    batch, _ = model.batch(rows)
    batch[...] = x
    model.forward(rows)
    row_loss, correct = np.empty(rows, np.float32), np.empty(rows, np.int32)
    model.loss(rows, row_loss, correct, 0, 1.0 / rows, np.ones(1))
    model.backward(rows)
    params64 = {k: v.astype(np.float64) for k, v in model.params.to_host_dict().items()}
    images = x.astype(np.float64).reshape(rows, 4, 4, 3)

    def objective():
        y = autoencoder64(images, params64, len(channels), len(model.convs))
        return float(((y - images) ** 2).mean())

    np.testing.assert_allclose(row_loss.mean(), objective(), rtol=1e-5)
    for name, value in params64.items():
        np.testing.assert_allclose(model.grads[name], central_difference(objective, value), rtol=2e-3, atol=2e-6,
                                   err_msg=name)


def tiny_images(rng, side=4, train=24, test=5):
    def images(n):
        return rng.integers(0, 256, (n, 3 * side * side), dtype=np.uint8)

    return ImageDataset(name="tiny", train_images=images(train), train_labels=np.zeros(train, np.uint8),
                        test_images=images(test), test_labels=np.zeros(test, np.uint8),
                        image_shape=(3, side, side), num_classes=10, mean=0.5, std=0.25)


def autoencoder_config(**train):
    return config_from_dict({"seed": 2, "data": {"dataset": "cifar10", "val_size": 4},
                             "model": {"type": "conv_autoencoder", "channels": [4, 3]},
                             "optim": {"name": "adam", "lr": 1e-2},
                             "train": {"batch_size": 8, "eval_batch_size": 8, "log_every": 1, **train}})


@pytest.mark.gpu
@pytest.mark.skipif(ON_SIMULATOR, reason="a dozen convolution launches per step: minutes on the simulator")
def test_cuda_graph_matches_numpy_graph(rng):
    dataset, config = tiny_images(rng, side=8, train=40), autoencoder_config()
    (cpu_params, cpu_reads, cpu_eval), (gpu_params, gpu_reads, gpu_eval) = one_epoch_on_both_backends(config, dataset)
    for name in cpu_params:
        np.testing.assert_allclose(gpu_params[name], cpu_params[name], rtol=1e-4, atol=1e-5, err_msg=name)
    np.testing.assert_allclose([r["loss"] for r in gpu_reads], [r["loss"] for r in cpu_reads], rtol=1e-4)
    np.testing.assert_allclose(gpu_eval[0], cpu_eval[0], rtol=1e-4)


def test_training_lowers_the_reconstruction_error(rng):
    dataset = tiny_images(rng, side=8, train=64)
    session = build_session(autoencoder_config(), CpuBackend(), dataset)
    before = session.evaluator.evaluate(session.val)[0]
    for epoch in range(1, 4):
        train_epoch(session, epoch, lambda window: None)
    assert session.evaluator.evaluate(session.val)[0] < 0.7 * before


@pytest.mark.real_gpu
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_same_seed_gives_bitwise_identical_autoencoders_on_the_gpu(rng, precision):
    dataset = tiny_images(rng, side=32, train=600, test=10)
    config = config_from_dict({"seed": 5, "data": {"dataset": "cifar10", "val_size": 88},
                               "model": {"type": "conv_autoencoder", "channels": [256, 128]},
                               "train": {"batch_size": 64, "precision": precision}})
    assert_one_epoch_is_bitwise_repeatable_on_the_gpu(config, dataset)
