"""The safetensors export loads straight into the equivalent PyTorch modules (the code of docs/inference.md,
repeated here) and they give mlptrain's own outputs. PyTorch is no dependency of mlptrain: where it is not
installed this test is skipped, saying so."""

import json
import math
from collections import OrderedDict

import numpy as np
import pytest

from mlptrain.inference.model import load_trained
from tests.cli.test_inference_cli import invoke

torch = pytest.importorskip("torch", reason="PyTorch is not installed; the export's load into torch modules is "
                                            "checked where it is (pip install torch)")


def torch_module(meta: dict):
    """The model a safetensors export's metadata describes, as the torch.nn.Sequential its tensors load into."""
    from torch import nn

    model, classes = json.loads(meta["config"])["model"], len(json.loads(meta["class_names"]))
    shape = json.loads(meta["image_shape"])
    layers = []
    if model["type"] == "mlp":
        activation = {"relu": nn.ReLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid}[model["activation"]]
        widths = [math.prod(shape), *model["hidden"], classes]
        layers.append(("flatten", nn.Flatten()))
        for i, (a, b) in enumerate(zip(widths[:-1], widths[1:]), start=1):
            layers.append((f"fc{i}", nn.Linear(a, b)))
            if i < len(widths) - 1:
                layers.append((f"act{i}", activation()))
    else:
        channels, k = model["channels"], model["kernel_size"]
        widths = [shape[0], *channels]
        reverse = channels[::-1]
        convs = [*zip(widths[:-1], widths[1:]), *zip([reverse[0], *reverse[:-1]], reverse), (channels[0], shape[0])]
        for i, (cin, cout) in enumerate(convs, start=1):
            layers.append((f"conv{i}", nn.Conv2d(cin, cout, k, padding=k // 2)))
            if i == len(convs):
                break
            layers.append((f"relu{i}", nn.ReLU()))
            layers.append((f"pool{i}", nn.MaxPool2d(2)) if i <= len(channels) else
                          (f"up{i}", nn.Upsample(scale_factor=2, mode="nearest")))
    return nn.Sequential(OrderedDict(layers))


@pytest.mark.parametrize("name", ["mlp", "ae"])
def test_the_export_loads_into_torch_and_gives_mlptrains_outputs(tiny_runs, tmp_path, name):
    from safetensors import safe_open
    from safetensors.torch import load_file

    invoke("export", tiny_runs[name], "--format", "safetensors", "--out", tmp_path / "m.safetensors")
    with safe_open(tmp_path / "m.safetensors", "pt") as f:
        meta = f.metadata()
    module = torch_module(meta)
    module.load_state_dict(load_file(tmp_path / "m.safetensors"), strict=True)  # every name and shape as exported
    trained = load_trained(tiny_runs[name], precision="fp32")
    pixels = trained.dataset.test_images[:32]
    x = torch.from_numpy(pixels.reshape(-1, *trained.image_shape).astype(np.float32))
    with torch.no_grad():
        got = module(x * float(meta["input_scale"]) + float(meta["input_shift"])).numpy()
    np.testing.assert_allclose(got.reshape(32, -1), trained.images(pixels).reshape(32, -1), rtol=0, atol=1e-5)
