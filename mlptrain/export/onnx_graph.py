"""A trained model as an ONNX graph, built node by node with `onnx.helper` (no torch, no tracing).

The graph takes `pixels`, float32 (N, *image_shape) in the dataset's layout and range (0..255 for images;
(C, H, W) planes, which is ONNX's NCHW), and applies what training applies:

    input    x = pixels * scale + shift                       (mlptrain.nn.input_scale_shift)
    mlp      Flatten, then per layer Gemm(x, W (in, out), b) + Relu / Tanh / Sigmoid (none on the logits);
             outputs `logits` (N, classes) and `probabilities` = Softmax(logits)
    autoenc  per convolution Conv(k x k, stride 1, 'same' zero padding) + Relu (none on the last), then
             MaxPool 2x2 stride 2 (encoder) or Resize x2 nearest (decoder: y[h, w] = x[h // 2, w // 2]);
             outputs `reconstruction` (N, C, H, W) in pixels / 255

mlptrain's convolutions are cross-correlations, as ONNX's are; their kernels (k, k, in, out) become
ONNX's (out, in, k, k). The weights are the float32 master weights, whatever precision trained them.
"""

from __future__ import annotations

import numpy as np

from mlptrain.errors import UserError
from mlptrain.util.interrupts import raise_interruption

OPSET = 17  # Resize with `scales` and Gemm/Softmax as used here; onnxruntime >= 1.13 runs it
IR_VERSION = 8  # the IR of opset 17, so that older runtimes load the file
ACTIVATION_OPS = {"relu": "Relu", "tanh": "Tanh", "sigmoid": "Sigmoid"}


def require_onnx():
    """(onnx, onnxruntime), or a UserError saying how to install them (they are an optional extra)."""
    try:
        # onnx is the optional export extra, and slow to import: only when exporting to ONNX
        import onnx
        import onnxruntime
    except ImportError as err:
        raise_interruption(err)  # Ctrl-C during the (slow) import is an interrupt, not a missing package
        if err.name is None or err.name.split(".")[0] not in ("onnx", "onnxruntime"):
            reason = " ".join(str(err).split())
            raise UserError(f"--format onnx: the onnx and onnxruntime packages are installed but do not import "
                            f"({reason}); reinstall them with: pip install -e \".[export]\"") from None
        raise UserError(f"--format onnx needs the onnx and onnxruntime packages ({err.name} is missing); "
                        'install them with: pip install -e ".[export]"') from None
    return onnx, onnxruntime


class GraphBuilder:
    """Nodes and float32 initializers of one graph, each output named after the node that makes it."""

    def __init__(self, helper, numpy_helper):
        self.helper, self.numpy_helper = helper, numpy_helper
        self.nodes, self.initializers, self.count = [], [], 0

    def constant(self, name: str, value) -> str:
        self.initializers.append(self.numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    def node(self, op: str, inputs: list[str], output: str | None = None, **attributes) -> str:
        self.count += 1
        output = output or f"{op.lower()}_{self.count}"
        self.nodes.append(self.helper.make_node(op, inputs, [output], name=f"{op}_{self.count}", **attributes))
        return output


def onnx_model(trained):
    """The ModelProto of a `mlptrain.inference.model.TrainedModel`."""
    onnx, _ = require_onnx()
    # onnx is the optional export extra, and slow to import: only when exporting to ONNX
    from onnx import TensorProto, helper, numpy_helper

    g = GraphBuilder(helper, numpy_helper)
    params = trained.parameters()
    x = g.node("Mul", ["pixels", g.constant("input_scale", trained.scale)])
    x = g.node("Add", [x, g.constant("input_shift", trained.shift)])
    shape = ["batch", *trained.image_shape]
    if trained.classifies:
        outputs = _mlp(g, x, params, trained.config.model.activation, trained.dataset.num_classes)
    else:
        outputs = [("reconstruction", shape, _autoencoder(g, x, params, trained.config.model))]
    graph = helper.make_graph(
        g.nodes, f"mlptrain_{trained.config.model.type}",
        [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, dims) for name, dims, _ in outputs],
        g.initializers)
    model = helper.make_model(graph, producer_name="mlptrain", opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


def _mlp(g: GraphBuilder, x: str, params: dict, activation: str, classes: int) -> list:
    h = g.node("Flatten", [x], axis=1)
    layers = len([name for name in params if name.endswith(".weight")])
    for i in range(1, layers + 1):
        w = g.constant(f"fc{i}.weight", params[f"fc{i}.weight"])
        b = g.constant(f"fc{i}.bias", params[f"fc{i}.bias"])
        h = g.node("Gemm", [h, w, b], "logits" if i == layers else None)
        if i < layers:
            h = g.node(ACTIVATION_OPS[activation], [h])
    g.node("Softmax", ["logits"], "probabilities", axis=1)
    return [("logits", ["batch", classes], "logits"), ("probabilities", ["batch", classes], "probabilities")]


def _autoencoder(g: GraphBuilder, x: str, params: dict, model_config) -> str:
    depth, k = len(model_config.channels), model_config.kernel_size
    convs = len([name for name in params if name.endswith(".weight")])
    scales = g.constant("upsample_scales", [1.0, 1.0, 2.0, 2.0])
    for i in range(1, convs + 1):
        w = g.constant(f"conv{i}.weight", params[f"conv{i}.weight"].transpose(3, 2, 0, 1))
        b = g.constant(f"conv{i}.bias", params[f"conv{i}.bias"])
        last = i == convs
        x = g.node("Conv", [x, w, b], "reconstruction" if last else None, kernel_shape=[k, k],
                   pads=[k // 2] * 4, strides=[1, 1])
        if last:
            break
        x = g.node("Relu", [x])
        if i <= depth:
            x = g.node("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])
        else:
            x = g.node("Resize", [x, "", scales], mode="nearest", coordinate_transformation_mode="asymmetric",
                       nearest_mode="floor")
    return x


def run_onnx(model, pixels: np.ndarray) -> list[np.ndarray]:
    """The model's outputs (logits and probabilities, or the reconstruction) for float32 `pixels`, by
    onnxruntime on the CPU."""
    _, onnxruntime = require_onnx()
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3  # warnings about unused initializers etc. are not the user's concern
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"pixels": pixels.astype(np.float32)})
