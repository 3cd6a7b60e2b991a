"""A packed group's step with its launch switches on against off, on a GPU: the hidden layers' weight and bias
gradients beside the input gradients (CudaBackend.beside, on a second stream) and each layer's bias gradient in
its weight gradient's launch (gemm_weight.GROUP_BIAS) give the bits of every launch apart and in order, in every
lane's parameters, optimizer state, step state, grad-norm record and cursor, over captured and partial windows,
with a lane that clips (its norm summed before the update) beside lanes that do not (theirs summed by it)."""

import dataclasses

import numpy as np
import pytest

from mlptrain.data.loader import epoch_order
from mlptrain.packing.lane_group import slots
from mlptrain.training.experiment import Resources


@pytest.mark.real_gpu
@pytest.mark.parametrize("tf32_lanes", [3, 17])  # three lanes on the tf32x3 engine, or on the CUDA cores'
def test_a_lane_steps_switches_give_the_bits_of_launches_apart_in_order(data_dir, monkeypatch, tf32_lanes):
    from mlptrain.backends import cuda_devices
    from mlptrain.backends.numba_kernels import gemm_weight
    from mlptrain.config.load import load_config
    from mlptrain.packing import lane_step
    from tests.cli.test_cli import REPO

    monkeypatch.setenv("MLPTRAIN_DATA_DIR", str(data_dir))
    monkeypatch.setattr(lane_step, "TF32_LANES", tf32_lanes)
    base = load_config(REPO / "configs" / "adam_mnist.yaml",
                       ["backend=cuda", "model.hidden=[96,40]", "data.val_size=1000", "train.batch_size=64"])
    configs = [base, dataclasses.replace(base, seed=1, train=dataclasses.replace(base.train, clip_grad_norm=0.5)),
               dataclasses.replace(base, seed=2, optim=dataclasses.replace(base.optim, lr=3e-3))]
    windows = [(0, 64), (64, 64), (128, 64), (192, 64), (256, 20)]  # the second replays a graph; the last partial
    runs = []
    for on in (True, False):
        monkeypatch.setattr(cuda_devices, "BESIDE", on)
        monkeypatch.setattr(gemm_weight, "GROUP_BIAS", on)
        group, views = slots(configs[0], Resources(), 3)
        sessions = [view.session(config) for view, config in zip(views, configs)]
        assert group.step.plan and group.step.engine == ("tf32x3" if tf32_lanes == 3 else "fma")
        for s in sessions:
            s.window.start_epoch(epoch_order(s.train, s.config.seed, 1))
        for start, rows in windows:
            for s in sessions:
                s.window.run(start, rows)
            group.flush()
        assert group.graphs and group.backend.launched_beside == on
        arrays = {name: np.asarray(group.backend.to_host(array)) for name, array in group.step.slabs.items()
                  if array is not None}
        for name in ("row_loss", "row_correct"):  # the rows the windows wrote
            arrays[name] = arrays[name][:, :276]
        runs.append(arrays)
    for name in runs[1]:
        np.testing.assert_array_equal(runs[0][name], runs[1][name], err_msg=name)
    assert (runs[0]["cursor"] == 276).all()
