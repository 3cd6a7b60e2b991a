"""Gradient accumulation through the training loop (CPU backend, a small synthetic dataset).

900 training images make windows of 256 samples end with a partial one of 132 (micro-batches of
64, 64 and 4 when batch_size is 64). A window of N micro-batches must give the gradient, the
update and the bookkeeping (one optimizer step, lr and grad-norm record) of one batch N times
larger, the partial window normalised by the samples it holds.
"""

import json
import math

import numpy as np
import pytest

from mlptrain.backends.cpu import CpuBackend
from mlptrain.backends.cuda import CudaBackend
from mlptrain.config.load import config_from_dict
from mlptrain.data import ImageDataset
from mlptrain.data.loader import epoch_order
from mlptrain.training.loop import train, train_epoch
from mlptrain.training.session import build_session, steps_per_epoch

TRAIN, VAL, SIDE, CLASSES = 1000, 100, 8, 4
TRAIN_SIZE = TRAIN - VAL  # 900 = 3 x 256 + 132


def synthetic_dataset(seed=0, train=TRAIN, test=200, side=SIDE, classes=CLASSES):
    """Noisy copies of one random prototype per class: learnable, but not in one step."""
    rng = np.random.default_rng(seed)
    prototypes = rng.uniform(40, 215, (classes, side * side))

    def split(n):
        labels = rng.integers(0, classes, n)
        images = np.clip(prototypes[labels] + rng.normal(0, 70, (n, side * side)), 0, 255)
        return np.ascontiguousarray(images.astype(np.uint8)), labels.astype(np.uint8)

    (train_images, train_labels), (test_images, test_labels) = split(train), split(test)
    return ImageDataset(name="synthetic", train_images=train_images, train_labels=train_labels,
                        test_images=test_images, test_labels=test_labels, image_shape=(1, side, side),
                        num_classes=classes, mean=0.5, std=0.25)


def make_config(batch_size, grad_accum_steps, optim=None, schedule=None, **train_options):
    return config_from_dict({
        "seed": 3, "backend": "cpu", "data": {"val_size": VAL}, "model": {"hidden": [16, 12], "init": {"weights": "he_uniform", "biases": "zeros"}},
        "optim": optim or {"name": "momentum", "lr": 0.05}, "schedule": schedule or {"name": "constant"},
        "train": {"batch_size": batch_size, "grad_accum_steps": grad_accum_steps, "eval_batch_size": 100,
                  "epochs": 2, "log_every": 2, **train_options},
    })


def reference_gradient(params, dataset, index, widths):
    """The gradient of the mean softmax cross-entropy over the images `index`, in float64, of the
    ReLU MLP with these parameters."""
    x = (dataset.train_images[index].astype(np.float64) / 255.0 - dataset.mean) / dataset.std
    y = dataset.train_labels[index].astype(np.int64)
    layers = len(widths) - 1
    h = [x]
    for i in range(1, layers + 1):
        z = h[-1] @ params[f"fc{i}.weight"].astype(np.float64) + params[f"fc{i}.bias"]
        h.append(z if i == layers else np.maximum(z, 0.0))
    probs = np.exp(h[-1] - h[-1].max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    probs[np.arange(len(y)), y] -= 1.0
    delta, grads = probs / len(y), {}
    for i in range(layers, 0, -1):
        grads[f"fc{i}.weight"], grads[f"fc{i}.bias"] = h[i - 1].T @ delta, delta.sum(axis=0)
        delta = (delta @ params[f"fc{i}.weight"].astype(np.float64).T) * (h[i - 1] > 0)
    return grads


WINDOWS = [(0, 256), (768, 132)]  # the first (full) window and the partial last one


@pytest.mark.parametrize("start, rows", WINDOWS, ids=["full", "partial"])
def test_window_gradient_is_the_large_batch_gradient(start, rows):
    """The summed gradient of a window's micro-batches is the gradient of the window's mean loss (the
    float64 reference over exactly those samples) and, to fp32 rounding, that of one large batch.
    batch_size 100 splits the windows unevenly: 100 + 100 + 56 and 100 + 32."""
    dataset = synthetic_dataset()
    grads = {}
    for batch_size, accum in ((256, 1), (64, 4), (32, 8), (100, 3)):
        config = make_config(batch_size, accum)
        session = build_session(config, CpuBackend(), dataset)
        order = epoch_order(session.train, config.seed, 1)
        session.window.start_epoch(order)
        params = session.model.params.to_host_dict()
        session.window.run(start, rows)
        grads[batch_size, accum] = session.model.grads.to_host_dict()
    expected = reference_gradient(params, dataset, order[start:start + rows], session.model.widths)
    large = grads[256, 1]
    for name, value in expected.items():
        scale = np.abs(value).max()
        assert scale > 0, name
        np.testing.assert_allclose(large[name], value, rtol=0, atol=1e-5 * scale, err_msg=name)
        for key, accumulated in grads.items():
            np.testing.assert_allclose(accumulated[name], large[name], rtol=0, atol=2e-6 * scale,
                                       err_msg=f"{name} {key}")


def run_epochs(config, backend, dataset, epochs=2):
    session = build_session(config, backend, dataset)
    reads = []
    for epoch in range(1, epochs + 1):
        train_epoch(session, epoch, reads.append)
    return session, reads


OPTIMIZERS = [{"name": "momentum", "lr": 0.05, "nesterov": True},
              {"name": "adamw", "lr": 0.01, "weight_decay": 0.01}]
SCHEDULE = {"name": "warmup_cosine", "warmup_steps": 2, "min_lr": 1e-4}


def check_same_run(large, accumulated):
    (s_large, reads_large), (s_accum, reads_accum) = large, accumulated
    state_large, state_accum = s_large.step.read(), s_accum.step.read()
    assert state_accum["steps"] == state_large["steps"] == 2 * 4
    assert state_accum["windows"] == state_large["windows"] and state_accum["lr"] == state_large["lr"]
    assert [r["samples"] for r in reads_accum] == [r["samples"] for r in reads_large]
    assert [r["step"] for r in reads_accum] == [r["step"] for r in reads_large] == [2, 4, 6, 8]
    np.testing.assert_allclose([r["loss"] for r in reads_accum], [r["loss"] for r in reads_large], rtol=1e-5)
    np.testing.assert_allclose(s_accum.step.grad_norm_history(0, 8), s_large.step.grad_norm_history(0, 8),
                               rtol=1e-4)
    params_large, params_accum = s_large.model.params.to_host_dict(), s_accum.model.params.to_host_dict()
    for name, value in params_large.items():
        np.testing.assert_allclose(params_accum[name], value, rtol=1e-4, atol=1e-4 * np.abs(value).max(),
                                   err_msg=name)


@pytest.mark.parametrize("optim", OPTIMIZERS, ids=lambda o: o["name"])
def test_accumulation_and_a_large_batch_end_with_the_same_parameters(optim):
    """Same seed: the epoch's order does not depend on the batch size, so 64 x 4 and 256 x 1 see the
    same windows, take the same steps (schedule and clipping included) and end in the same place."""
    dataset = synthetic_dataset()
    runs = [run_epochs(make_config(batch_size, accum, optim, SCHEDULE, clip_grad_norm=1.0), CpuBackend(), dataset)
            for batch_size, accum in ((256, 1), (64, 4))]
    assert (runs[0][0].step.grad_norm_history(0, 8) > 1.0).all()  # so clipping acts at every step
    check_same_run(*runs)


@pytest.mark.real_gpu
@pytest.mark.parametrize("optim", OPTIMIZERS, ids=lambda o: o["name"])
def test_accumulation_and_a_large_batch_end_with_the_same_parameters_on_the_gpu(optim):
    dataset = synthetic_dataset()
    runs = [run_epochs(make_config(batch_size, accum, optim, SCHEDULE, clip_grad_norm=1.0), CudaBackend(), dataset)
            for batch_size, accum in ((256, 1), (64, 4))]
    check_same_run(*runs)


@pytest.mark.parametrize("batch_size, accum", [(64, 4), (50, 4), (100, 3), (128, 1), (64, 16), (7, 5), (2000, 2)])
def test_one_optimizer_step_per_window(batch_size, accum):
    """ceil(micro-batches / N) optimizer steps, lr values and grad-norm records per epoch; every
    micro-batch runs once."""
    micro_batches = math.ceil(TRAIN_SIZE / batch_size)
    expected = math.ceil(micro_batches / accum)
    config = make_config(batch_size, accum, log_every=1000)
    assert steps_per_epoch(TRAIN_SIZE, config.train) == expected
    session = build_session(config, CpuBackend(), synthetic_dataset())
    assert session.steps_per_epoch == expected
    forwards = []
    forward = session.model.forward
    session.model.forward = lambda rows: forwards.append(rows) or forward(rows)
    for epoch in (1, 2):
        reads = []
        train_epoch(session, epoch, reads.append)
        state = session.step.read()
        assert state["steps"] == state["windows"] == epoch * expected
        assert [r["step_in_epoch"] for r in reads] == [expected]  # log_every > steps: one read, at the end
        assert reads[0]["samples"] == TRAIN_SIZE
    assert len(forwards) == 2 * micro_batches and sum(forwards) == 2 * TRAIN_SIZE
    assert len(session.step.grad_norm_history(0, state["windows"])) == 2 * expected


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning",
                            "ignore:invalid value encountered:RuntimeWarning")  # the fp16 overflows are the point
@pytest.mark.parametrize("precision, init_scale", [("fp32", None), ("fp16", 2.0**30)])
def test_train_writes_the_step_bookkeeping_to_summary_json(tmp_path, precision, init_scale):
    """fp16 starting from an absurd loss scale overflows and skips windows until the scale fits:
    the skipped ones are counted, and neither stepped nor recorded in the grad-norm history."""
    options = {"precision": precision, "epochs": 3}
    if init_scale:
        options["loss_scale"] = {"init": init_scale}
    config = make_config(64, 4, **options)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    returned = train(build_session(config, CpuBackend(), synthetic_dataset()), run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary == json.loads(json.dumps(returned))
    windows = 3 * 4
    assert summary["batch_size"] == 64 and summary["grad_accum_steps"] == 4
    assert summary["effective_batch_size"] == 256
    assert summary["optimizer_steps"] + summary["skipped_steps"] == windows
    norms = np.load(run_dir / summary["grad_norms"])
    assert norms.dtype == np.float32 and len(norms) == summary["optimizer_steps"]
    assert np.isfinite(norms).all() and (norms > 0).all()
    if init_scale:
        assert 0 < summary["skipped_steps"] < windows
        assert summary["loss_scale"] == init_scale * 0.5 ** summary["skipped_steps"]
    else:
        assert summary["skipped_steps"] == 0 and summary["optimizer_steps"] == windows
        assert summary["loss_scale"] is None
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines][-1] == summary["optimizer_steps"]

