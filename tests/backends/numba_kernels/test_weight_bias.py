"""A layer's weight and bias gradients in one launch (`gemm.linear_backward_weight_bias`, CUDA): the bits of
`linear_backward_weight` and `reduce.bias_backward` launched apart, and within float32 of the float64 sums."""

import numpy as np
import pytest

from mlptrain.backends.lanes import lane_view
from mlptrain.backends.numba_kernels import gemm, gemm_weight
from tests import kernel_cases as cases
from tests import reference as ref

pytestmark = pytest.mark.gpu

BACKEND = cases.numba_backend()


def gradients(rng, shape, beta, dtype, engine, workspace, grouped, monkeypatch):
    """(dw, db, the float64 references) from x (rows, inputs) and dy (rows, outputs), one launch or two."""
    rows, inputs, outputs = shape
    monkeypatch.setattr(gemm_weight, "GROUP_BIAS", grouped)
    assert (gemm_weight.weight_bias_plan(engine, rows, inputs, outputs, workspace) is not None) == grouped
    x, xv = cases.stored(cases.random(rng, rows, inputs), dtype)
    dy, dyv = cases.stored(cases.random(rng, rows, outputs), dtype)
    old_w, old_b = cases.random(rng, inputs, outputs), cases.random(rng, outputs)
    # beta 0 must not read dw or db: NaN there would leak into the result
    dw = BACKEND.poisoned((inputs, outputs)) if beta == 0.0 else BACKEND.to_device(old_w)
    db = BACKEND.poisoned(outputs) if beta == 0.0 else BACKEND.to_device(old_b)
    size = max(gemm.linear_backward_weight_workspace(rows, inputs, outputs, engine=engine),
               BACKEND.kernels.reduce.bias_backward_workspace(rows, outputs))
    space = BACKEND.poisoned(max(1, size)) if workspace else None
    gemm.linear_backward_weight_bias(BACKEND.to_device(x), BACKEND.to_device(dy), dw, db, beta, space, engine)
    references = (ref.bias_backward(dyv, old_b, beta), xv.astype(np.float64).T @ dyv + beta * old_w.astype(np.float64))
    return BACKEND.to_host(dw), BACKEND.to_host(db), references


@pytest.mark.parametrize("shape, beta, dtype, engine", [
    ((9, 20, 70), 0.0, np.float32, "fma"),  # bias columns past one row of the weight grid's blocks
    ((5, 7, 10), 1.0, np.float32, "fma"),  # more threads than the bias's row groups
    ((33, 40, 17), 1.0, np.uint16, "fma"),
    ((6, 9, 20), 0.0, np.float32, "tf32x3")])  # fewer threads than groups x columns: two groups a thread
def test_one_launch_gives_the_bits_of_two(rng, monkeypatch, shape, beta, dtype, engine):
    seed = int(rng.integers(1 << 30))
    one = gradients(np.random.default_rng(seed), shape, beta, dtype, engine, True, True, monkeypatch)
    two = gradients(np.random.default_rng(seed), shape, beta, dtype, engine, True, False, monkeypatch)
    for grouped, apart in zip(one[:2], two[:2]):
        np.testing.assert_array_equal(grouped.view(np.uint32), apart.view(np.uint32))
    (db_ref, dw_ref), rows = one[2], shape[0]
    np.testing.assert_allclose(one[1], db_ref, rtol=1e-5, atol=1e-5 * np.sqrt(rows))
    np.testing.assert_allclose(one[0], dw_ref, rtol=1e-4 if engine == "fma" else 1e-3, atol=1e-4 * np.sqrt(rows))


def test_chunked_sums_launch_apart():
    """A batch whose weight or bias gradient is summed in chunks (given a workspace) keeps two launches."""
    assert gemm_weight.weight_bias_plan("fma", 2048, 128, 10) is None
    assert gemm_weight.weight_bias_plan("fma", 2048, 128, 10, workspace=False) is not None
    assert gemm_weight.weight_bias_plan("narrow", 9, 20, 7) is None


@pytest.mark.real_gpu
@pytest.mark.parametrize("shape, engine", [((128, 784, 512), "tf32x3"), ((128, 512, 10), "fma"),
                                           ((130, 300, 257), "fma")])
def test_one_launch_gives_the_bits_of_two_production_sizes(rng, monkeypatch, shape, engine):
    seed = int(rng.integers(1 << 30))
    one = gradients(np.random.default_rng(seed), shape, 1.0, np.float32, engine, True, True, monkeypatch)
    two = gradients(np.random.default_rng(seed), shape, 1.0, np.float32, engine, True, False, monkeypatch)
    for grouped, apart in zip(one[:2], two[:2]):
        np.testing.assert_array_equal(grouped.view(np.uint32), apart.view(np.uint32))


def lane_gradients(rng, shape, beta, engine, grouped, monkeypatch):
    """(dw slab, db slab) after one trial-axis launch (or two) of three lanes, the middle one inactive: dw and db
    lane views of one gradient slab, as a packed group's flat gradients give them."""
    lanes, (rows, inputs, outputs) = 3, shape
    monkeypatch.setattr(gemm_weight, "GROUP_BIAS", grouped)
    assert (gemm_weight.lanes_weight_bias_plan(engine, rows, inputs, outputs, lanes) is not None) == grouped
    x = rng.standard_normal((lanes, rows, inputs)).astype(np.float32)
    dy = rng.standard_normal((lanes, rows, outputs)).astype(np.float32)
    size = inputs * outputs + outputs
    slab = rng.standard_normal((lanes, size + 7)).astype(np.float32)
    if beta == 0.0:  # beta 0 must not read dw or db
        slab[:, 3:3 + size] = np.nan
    grads = BACKEND.to_device(slab)
    dw, db = lane_view(grads, 3, (inputs, outputs)), lane_view(grads, 3 + inputs * outputs, (outputs,))
    gemm.linear_backward_weight_bias(BACKEND.to_device(x), BACKEND.to_device(dy), dw, db, beta, engine=engine,
                                     active=BACKEND.to_device(np.array([1, 0, 1], np.int32)))
    return slab, BACKEND.to_host(grads), (x, dy)


# the simulator takes ~40 s for one tf32x3 case of three lanes: the larger cases on a GPU only
@pytest.mark.parametrize("shape, beta, engine", [
    ((5, 7, 10), 1.0, "fma"), ((6, 9, 20), 0.0, "tf32x3"),
    pytest.param((9, 20, 70), 0.0, "fma", marks=pytest.mark.real_gpu),  # bias columns past a row of weight blocks
    pytest.param((7, 12, 40), 1.0, "tf32x3", marks=pytest.mark.real_gpu),
    pytest.param((128, 784, 512), 1.0, "tf32x3", marks=pytest.mark.real_gpu),
    pytest.param((128, 512, 512), 0.0, "fma", marks=pytest.mark.real_gpu)])
def test_one_lane_launch_gives_the_bits_of_two(rng, monkeypatch, shape, beta, engine):
    """Packed lanes' weight and bias gradients in one trial-axis launch: an active lane's bits are those of the
    trial-axis weight gradient and bias_backward_lanes launched apart, within float32 of the float64 sums; the
    inactive lane's gradients and the slab's other columns are not touched."""
    seed = int(rng.integers(1 << 30))
    before, one, (x, dy) = lane_gradients(np.random.default_rng(seed), shape, beta, engine, True, monkeypatch)
    _, two, _ = lane_gradients(np.random.default_rng(seed), shape, beta, engine, False, monkeypatch)
    rows, inputs, outputs = shape
    size = inputs * outputs + outputs
    for z in (0, 2):
        np.testing.assert_array_equal(one[z].view(np.uint32), two[z].view(np.uint32))
        old = np.nan_to_num(before[z, 3:3 + size].astype(np.float64))
        want = np.concatenate([(x[z].astype(np.float64).T @ dy[z]).ravel(), dy[z].astype(np.float64).sum(0)])
        np.testing.assert_allclose(one[z, 3:3 + size], want + beta * old, rtol=1e-3, atol=1e-4 * np.sqrt(rows))
    np.testing.assert_array_equal(one[1].view(np.uint32), before[1].view(np.uint32))
    for z in (0, 2):  # the columns around the lane's gradients
        np.testing.assert_array_equal(one[z, :3].view(np.uint32), before[z, :3].view(np.uint32))
        np.testing.assert_array_equal(one[z, 3 + size:].view(np.uint32), before[z, 3 + size:].view(np.uint32))


def test_a_lane_launch_on_the_narrow_engine_launches_apart():
    assert gemm_weight.lanes_weight_bias_plan("narrow", 128, 512, 10, 16) is None
    assert gemm_weight.lanes_weight_bias_plan("tf32x3", 128, 512, 512, 16) is not None
