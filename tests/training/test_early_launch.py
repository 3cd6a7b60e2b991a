"""Kernels launched early (programmatic dependent launch, numba_kernels.grid_order) against kernels launched each
after the last has ended, and a hidden layer's weight gradient beside the input gradients (CudaBackend.beside, on a
second stream) against every launch on one stream: the same bits in every parameter, optimizer and step-state
array, metric read and validation row, in captured graphs and in the windows launched one by one."""

import numpy as np
import pytest

from mlptrain.backends.cuda import CudaBackend
from mlptrain.config.load import config_from_dict
from mlptrain.data.dataset import ImageDataset
from mlptrain.training.loop import train_epoch
from mlptrain.training.session import build_session
from tests.training.test_train_backends import tiny_dataset

CASES = {
    # the benchmark's layers: split chunks, the narrow output layer with its loss, a partial last window
    "mlp-fp32": ({"model": {"hidden": [512, 512]}, "train": {"batch_size": 128}}, 784, 1000),
    # loss scaling, accumulation and clipping: the step's rules read what the backward pass wrote
    "mlp-fp16-accum": ({"model": {"hidden": [64, 32]}, "optim": {"name": "adamw", "lr": 1e-3, "weight_decay": 0.1},
                        "train": {"batch_size": 16, "grad_accum_steps": 3, "clip_grad_norm": 0.5, "precision": "fp16"}},
                       64, 700),
    # three weight gradients beside: the second stream runs two in a row, each after its own fork
    "mlp-deep-fp32": ({"model": {"hidden": [48, 40, 24]}, "train": {"batch_size": 24}}, 30, 300),
    "autoencoder-bf16": ({"data": {"dataset": "cifar10"}, "model": {"type": "conv_autoencoder", "channels": [8, 4]},
                          "train": {"batch_size": 8, "precision": "bf16"}}, None, 90),
}


def dataset_for(rng, features, train):
    if features is not None:
        return tiny_dataset(rng, features=features, classes=10, train=train, test=50)
    return ImageDataset(name="tiny-rgb", train_images=rng.integers(0, 256, (train, 8 * 8 * 3), dtype=np.uint8),
                        train_labels=rng.integers(0, 10, train, dtype=np.uint8),
                        test_images=rng.integers(0, 256, (10, 8 * 8 * 3), dtype=np.uint8),
                        test_labels=rng.integers(0, 10, 10, dtype=np.uint8),
                        image_shape=(3, 8, 8), num_classes=10, mean=0.5, std=0.25)


@pytest.mark.real_gpu
@pytest.mark.parametrize("switch", ["early", "beside"])
@pytest.mark.parametrize("case", CASES)
def test_early_and_beside_launches_give_the_bits_of_launches_in_order(rng, case, switch, monkeypatch):
    from mlptrain.backends import cuda_devices
    from mlptrain.backends.driver import api, launch  # the driver path's (a real GPU's)
    from mlptrain.backends.kernel_cache import kernels

    options, features, train = CASES[case]
    dataset = dataset_for(rng, features, train)
    runs = []
    for on in (True, False):
        early = on or switch != "early"
        monkeypatch.setattr(launch, "EARLY", early)
        monkeypatch.setattr(cuda_devices, "BESIDE", on or switch != "beside")
        config = config_from_dict({"seed": 11, **options, "data": {**options.get("data", {}), "val_size": 8},
                                   "train": {**options["train"], "log_every": 3}})
        backend = CudaBackend()
        session = build_session(config, backend, dataset)
        reads, passes = [], []
        for epoch in (1, 2, 3):
            train_epoch(session, epoch, reads.append)
            passes.append(session.evaluator.evaluate_rows(session.val))
        assert session.window.graph is not None
        runs.append(({**session.model.params.to_host_dict(), **session.step.state_dict()},
                     [(r["step"], r["loss"], r["grad_norm"]) for r in reads], passes))
        # so the first run did launch early, and summary.json says which
        assert kernels.early_launches() == (early and api.capability(api.current_device()) >= (9, 0))
        # and the weight gradients did go to the second stream (an MLP's only)
        assert backend.launched_beside == ("mlp" in case and (on or switch != "beside"))
    (arrays, reads, passes), (in_order_arrays, in_order_reads, in_order_passes) = runs
    for name in in_order_arrays:
        np.testing.assert_array_equal(arrays[name], in_order_arrays[name], err_msg=name)
    assert reads == in_order_reads and len(reads) > 3
    for (loss, acc, rows), (in_order_loss, in_order_acc, in_order_rows) in zip(passes, in_order_passes):
        assert loss == in_order_loss and (acc == in_order_acc or np.isnan(acc) and np.isnan(in_order_acc))
        if rows is not None:
            np.testing.assert_array_equal(rows, in_order_rows)
