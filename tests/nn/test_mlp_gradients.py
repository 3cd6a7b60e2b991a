"""Backward passes against central finite differences in float64.

Layer ops are checked in float64 through the NumPy kernels (they are
dtype-generic); the whole MLP graph (float32 buffers) is checked against
finite differences of a float64 forward pass written here.
"""

import numpy as np
import pytest

from mlptrain.activation import ACTIVATIONS, NONE
from mlptrain.backends.cpu import CpuBackend
from mlptrain.backends.cuda import CudaBackend
from mlptrain.backends.numba_kernels import gemm_narrow
from mlptrain.backends.numpy_kernels import gemm, loss, reduce
from mlptrain.nn.mlp import MLP
from tests.conftest import ON_SIMULATOR


def act64(z, name):
    return {"relu": np.maximum(z, 0), "tanh": np.tanh(z), "sigmoid": 1 / (1 + np.exp(-z)), "none": z}[name]


def central_difference(f, x, eps=1e-6):
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        old = x[i]
        x[i] = old + eps
        up = f()
        x[i] = old - eps
        down = f()
        x[i] = old
        grad[i] = (up - down) / (2 * eps)
    return grad


@pytest.mark.parametrize("activation", ["none", "relu", "tanh", "sigmoid"])
def test_linear_layer_backward(rng, activation):
    m, k, n = 5, 4, 3
    x = rng.standard_normal((m, k))
    w = rng.standard_normal((k, n))
    b = rng.standard_normal(n)
    r = rng.standard_normal((m, n))  # loss = sum(r * y) so dL/dy = r
    code = ACTIVATIONS[activation]
    y = np.empty((m, n))

    def objective():
        gemm.linear_forward(x, w, b, y, code)
        return float((r * y).sum())

    objective()
    # dL/dz = r * act'(z), expressed through y as the kernels do
    dz = np.empty((m, n))
    gemm.linear_backward_input(r, np.eye(n), y, dz, code) if code != NONE else dz.__setitem__(..., r)
    dw, db, dx = np.empty((k, n)), np.empty(n), np.empty((m, k))
    gemm.linear_backward_weight(x, dz, dw, 0.0)
    reduce.bias_backward(dz, db, 0.0)
    gemm.linear_backward_input(dz, w, x, dx, NONE)
    np.testing.assert_allclose(dw, central_difference(objective, w), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(db, central_difference(objective, b), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(dx, central_difference(objective, x), rtol=1e-6, atol=1e-8)


def test_softmax_cross_entropy_backward(rng):
    rows, classes = 6, 5
    logits = rng.standard_normal((rows, classes)) * 3
    labels = rng.integers(0, classes, rows)
    row_loss, correct, dlogits = np.empty(rows), np.empty(rows, np.int32), np.empty((rows, classes))

    def objective():
        loss.softmax_cross_entropy(logits, labels, dlogits, row_loss, correct, 0, 1.0 / rows, np.ones(1))
        return float(row_loss.mean())

    objective()
    analytic = dlogits.copy()
    np.testing.assert_allclose(analytic, central_difference(objective, logits), rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("backend, hidden", [
    pytest.param(CpuBackend, [6, 5], id="cpu"),
    pytest.param(CudaBackend, [6, 5], id="cuda-narrow", marks=pytest.mark.gpu),
    pytest.param(CudaBackend, [20, 5], id="cuda-tiles-and-narrow", marks=pytest.mark.gpu),
    pytest.param("tf32x3", [20, 5], id="cuda-tf32x3-and-narrow", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("activation", ["relu", "tanh"])
def test_whole_mlp_gradient(rng, monkeypatch, activation, backend, hidden):
    """The graph's wiring: every parameter gradient of the mean loss, float32 graph vs float64 differences. On
    the CUDA kernels (the simulator in CI) a layer of 16 outputs or fewer runs its forward and input gradient on
    the narrow engine (its weight gradient on the CUDA-core tiles), a wider one on the tf32x3 tile."""
    if backend == "tf32x3":  # a run's float32 layers on tensor cores, as on a GPU (a small tile on the simulator)
        from mlptrain.backends.numba_kernels import gemm as cuda_gemm
        from mlptrain.backends.numba_kernels import gemm_engines

        monkeypatch.setattr(cuda_gemm, "RUN_TF32X3", True)
        if ON_SIMULATOR:
            monkeypatch.setattr(gemm_engines, "RUN_TF32_TILE", (32, 32, 2, 2, 16))  # a run's own launches
        backend = CudaBackend
    backend = backend()
    model = MLP(backend, 7, hidden, 4, activation, max_rows=8)
    if backend.name == "cuda":  # float32 layers on tensor cores (gemm.RUN_TF32X3), narrow ones on the narrow engine
        tiles = "tf32x3" if backend.kernels.gemm.RUN_TF32X3 else "fma"
        assert [e["forward"] for e in model.engines] == ["narrow" if w <= 16 else tiles for w in hidden + [4]]
        assert [e["backward_weight"] for e in model.engines] == [tiles if w > 16 else "fma" for w in hidden + [4]]
    model.init_parameters(rng, "he_uniform", "zeros")
    rows = 5
    x = rng.standard_normal((rows, 7)).astype(np.float32)
    y = rng.integers(0, 4, rows).astype(np.int32)
    h, grad, labels = model.views(rows)
    backend.copy_from_host(h[0], x)
    backend.copy_from_host(labels, y)
    row_loss, correct = backend.empty((rows,), np.float32), backend.empty((rows,), np.int32)
    # the output layer's forward and the loss in one launch where it is on the narrow engine, and the record says so
    model.forward_loss(rows, row_loss, correct, 0, 1.0 / rows, backend.to_device(np.ones(1)))
    assert model.fused_loss == (backend.name == "cuda")
    assert model.kernel_plan(rows)[f"fc{len(hidden) + 1}"]["forward"].endswith("+cross_entropy") == model.fused_loss
    model.backward(rows)
    grads = model.grads.to_host_dict()
    # a window's pass: on CUDA the output layer's input gradient in the loss's launch; the same gradients, bit for bit
    monkeypatch.setattr(gemm_narrow, "FUSE_INPUT_GRADIENT", True)
    for buffer in [model.grads.flat, *model.grad[1:]]:  # poisoned: the pass must write each of them again
        backend.copy_from_host(buffer, np.full(buffer.shape, np.nan, buffer.dtype))
    model.train_pass(rows, row_loss, correct, 0, 1.0 / rows, backend.to_device(np.ones(1)), None, 0.0)
    for name, value in model.grads.to_host_dict().items():
        np.testing.assert_array_equal(value.view(np.uint8), grads[name].view(np.uint8), err_msg=name)

    params64 = {k: v.astype(np.float64) for k, v in model.params.to_host_dict().items()}
    widths = [7, *hidden, 4]

    def objective():
        a = x.astype(np.float64)
        for i in range(1, len(widths)):
            z = a @ params64[f"fc{i}.weight"] + params64[f"fc{i}.bias"]
            a = act64(z, activation) if i < len(widths) - 1 else z
        a = a - a.max(axis=1, keepdims=True)
        return float((np.log(np.exp(a).sum(axis=1)) - a[np.arange(rows), y]).mean())

    for name, value in params64.items():
        np.testing.assert_allclose(grads[name], central_difference(objective, value), rtol=1e-3, atol=1e-5,
                                   err_msg=name)


def test_backward_accumulates_with_beta_one(rng):
    backend = CpuBackend()
    model = MLP(backend, 4, [3], 2, "relu", max_rows=4)
    model.init_parameters(rng, "he_uniform", "zeros")
    h, grad, _ = model.views(4)
    h[0][...] = rng.standard_normal((4, 4))
    model.forward(4)
    grad[-1][...] = rng.standard_normal((4, 2))
    model.backward(4, beta=0.0)
    once = model.grads.flat.copy()
    model.backward(4, beta=1.0)
    np.testing.assert_allclose(model.grads.flat, 2 * once, rtol=1e-6)
