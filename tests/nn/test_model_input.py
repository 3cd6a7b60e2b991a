"""Which datasets each model takes: refused up front with one line, or trained (tiny, on the CPU)."""

import numpy as np
import pytest

from mlptrain.backends.cpu import CpuBackend
from mlptrain.config.load import config_from_dict
from mlptrain.data.dataset import ImageDataset
from mlptrain.errors import UserError
from mlptrain.nn import check_model_input
from mlptrain.training.loop import train_epoch
from mlptrain.training.session import build_session


def dataset(rng, image_shape, dtype=np.uint8, train=24, test=6, classes=3):
    features = int(np.prod(image_shape))

    def samples(n):
        if dtype == np.uint8:
            return rng.integers(0, 256, (n, features), dtype=np.uint8)
        return rng.normal(size=(n, features)).astype(np.float32)

    return ImageDataset("tiny", samples(train), rng.integers(0, classes, train, dtype=np.uint8), samples(test),
                        rng.integers(0, classes, test, dtype=np.uint8), image_shape, classes, 0.5, 0.25,
                        value_scale=255.0 if dtype == np.uint8 else 1.0)


def config(model, **train):
    return config_from_dict({"backend": "cpu", "model": model, "data": {"val_size": 4},
                             "train": {"epochs": 1, "batch_size": 8, "eval_batch_size": 8, **train}})


@pytest.mark.parametrize("image_shape, dtype", [((1, 28, 28), np.uint8), ((3, 5, 7), np.uint8), ((13,), np.float32),
                                                ((300,), np.uint8)])
def test_mlp_takes_any_flat_size(rng, image_shape, dtype):
    data = dataset(rng, image_shape, dtype)
    cfg = config({"type": "mlp", "hidden": [5]})
    check_model_input(cfg.model, data)
    session = build_session(cfg, CpuBackend(), data)
    assert session.model.widths == [int(np.prod(image_shape)), 5, 3]
    train_epoch(session, 1, lambda read: None)
    loss, acc = session.evaluator.evaluate(session.test)
    assert np.isfinite(loss) and 0 <= acc <= 1


@pytest.mark.parametrize("image_shape, channels", [((1, 8, 12), [2, 2]), ((4, 4, 4), [3]), ((2, 16, 8), [2, 2, 2])])
def test_autoencoder_takes_sides_its_pools_divide(rng, image_shape, channels):
    data = dataset(rng, image_shape)
    cfg = config({"type": "conv_autoencoder", "channels": channels})
    check_model_input(cfg.model, data)
    session = build_session(cfg, CpuBackend(), data)
    c, h, w = image_shape
    assert (session.model.height, session.model.width, session.model.image_channels) == (h, w, c)
    train_epoch(session, 1, lambda read: None)
    assert np.isfinite(session.evaluator.evaluate(session.val)[0])


@pytest.mark.parametrize("image_shape, dtype, channels, message", [
    ((12,), np.float32, [2], "model.type conv_autoencoder needs images (uint8 pixels, C x H x W); tiny holds "
                             "float32 samples of shape (12,): use model.type mlp"),
    ((48,), np.uint8, [2], "needs images"),
    ((1, 12, 12), np.uint8, [2, 2, 2], "model.channels: 3 conv + max-pool stages need image sides divisible by 8; "
                                       "tiny images are 12x12: give model.channels at most 2 widths"),
    ((3, 7, 8), np.uint8, [2], "tiny images are 7x8: an odd side cannot be pooled"),
])
def test_autoencoder_refuses_what_it_cannot_take(rng, image_shape, dtype, channels, message):
    data = dataset(rng, image_shape, dtype)
    cfg = config({"type": "conv_autoencoder", "channels": channels})
    with pytest.raises(UserError) as caught:
        check_model_input(cfg.model, data)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(UserError):
        build_session(cfg, CpuBackend(), data)
