"""The ONNX graph of each model shape against mlptrain's own forward pass (CPU backend, fp32), and the
safetensors file's contents: on small random models, no real data needed."""

from pathlib import Path

import numpy as np
import pytest

from mlptrain.backends.cpu import CpuBackend
from mlptrain.config.load import config_from_dict
from mlptrain.data import ImageDataset
from mlptrain.export import check_onnx, export_bytes
from mlptrain.inference.model import TrainedModel
from mlptrain.nn import input_scale_shift, make_model, model_dataset

# onnx and onnxruntime come with the dev extra (it includes [export]): a missing one fails here, never skips


def trained_model(rng, model: dict, shape=(3, 16, 16), classes=4) -> TrainedModel:
    def images(n):
        return rng.integers(0, 256, (n, int(np.prod(shape))), dtype=np.uint8)

    dataset = ImageDataset("mnist", images(20), rng.integers(0, classes, 20).astype(np.uint8), images(40),
                           rng.integers(0, classes, 40).astype(np.uint8), shape, classes, 0.4, 0.3)
    config = config_from_dict({"backend": "cpu", "model": model, "data": {"val_size": 5}})
    backend = CpuBackend()
    net = make_model(config, backend, model_dataset(config, dataset), 16)
    net.init_parameters(rng, "pytorch", "pytorch")
    if net.task == "classification":  # nonzero biases, so a dropped bias term would show
        params = net.params.to_host_dict()
        net.load_parameters({k: v + rng.normal(0, 0.1, v.shape).astype(np.float32) for k, v in params.items()})
    scale, shift = input_scale_shift(net, dataset)
    return TrainedModel(Path("runs/x"), config, "best", backend, dataset, net, scale, shift)


@pytest.mark.parametrize("model, shape", [
    ({"type": "mlp", "hidden": []}, (1, 8, 8)),
    ({"type": "mlp", "hidden": [7, 5], "activation": "tanh"}, (1, 8, 8)),
    ({"type": "mlp", "hidden": [9], "activation": "sigmoid"}, (3, 4, 4)),
    ({"type": "conv_autoencoder", "channels": [3], "kernel_size": 1}, (3, 8, 8)),
    ({"type": "conv_autoencoder", "channels": [4, 6], "kernel_size": 5}, (3, 16, 16)),
    ({"type": "conv_autoencoder", "channels": [2, 3, 2], "kernel_size": 3}, (1, 16, 8)),
])
def test_the_onnx_graph_computes_mlptrains_forward(rng, model, shape):
    import onnx

    trained = trained_model(rng, model, shape)
    data, check = export_bytes(trained, "onnx")
    assert check.images == 40 and check.max_abs_diff <= 1e-5, check
    graph = onnx.load_from_string(data)
    ops = {node.op_type for node in graph.graph.node}
    assert ops >= ({"Gemm", "Softmax"} if model["type"] == "mlp" else {"Conv", "Relu"})
    if model.get("channels", [0])[1:]:
        assert {"MaxPool", "Resize"} <= ops


def test_a_wrong_graph_is_caught_by_the_check(rng):
    trained = trained_model(rng, {"type": "mlp", "hidden": [6]}, (1, 8, 8))
    from mlptrain.export.onnx_graph import onnx_model

    model = onnx_model(trained)
    trained.model.load_parameters({k: v * 1.01 for k, v in trained.parameters().items()})  # not what was exported
    assert not check_onnx(trained, model).passed


def test_safetensors_holds_the_weights_by_name_with_the_config(rng):
    import json

    from safetensors.numpy import load

    trained = trained_model(rng, {"type": "conv_autoencoder", "channels": [2]}, (3, 8, 8))
    data, check = export_bytes(trained, "safetensors")
    tensors = load(data)
    assert check is None and sorted(tensors) == sorted(trained.parameters())
    for name, value in trained.parameters().items():  # PyTorch's layout: a conv weight (out, in, k, k)
        np.testing.assert_array_equal(tensors[name], value.transpose(3, 2, 0, 1) if value.ndim == 4 else value)
    header = json.loads(data[8:8 + int.from_bytes(data[:8], "little")])["__metadata__"]
    assert header["layout"] == "pytorch"
    assert json.loads(header["config"])["model"]["channels"] == [2] and header["image_shape"] == "[3, 8, 8]"
