"""Packed lanes' weight and bias gradients with Adam's update in their epilogue (`gemm_update`): the parameters and
moments of the weight-and-bias launch followed by `optim.adam_update_lanes`, bit for bit."""

import numpy as np
import pytest

from mlptrain.backends.lanes import lane_view
from mlptrain.backends.numba_kernels import gemm, gemm_update, optim
from mlptrain.optim.step_state import APPLY, BIAS_CORRECTION1, BIAS_CORRECTION2, GRAD_MULTIPLIER, LR, SIZE
from tests import kernel_cases as cases
from tests import kernel_lane_cases as lane_cases

pytestmark = pytest.mark.gpu

BACKEND = cases.numba_backend()


@pytest.mark.parametrize("shape, engine, at", [((6, 9, 20), "fma", 4), ((5, 7, 13), "fma", 5), ((6, 9, 20), "fma", 5),
                                               pytest.param((6, 9, 20), "tf32x3", 4, marks=pytest.mark.real_gpu),
                                               pytest.param((37, 70, 45), "tf32x3", 5, marks=pytest.mark.real_gpu),
                                               pytest.param((128, 784, 512), "tf32x3", 4, marks=pytest.mark.real_gpu)])
def test_the_update_in_the_epilogue_is_the_launches_apart(rng, shape, engine, at):
    """Three lanes, lane 1 inactive, one with its update not applied (its window skipped): every active lane's
    parameters and moments get the bits of the gradients written and then updated; the inactive lane's are untouched;
    the squares' columns add up to the gradient's squared norm within float32 rounding. The layer's parameters at
    column `at` of their slab: 16-byte aligned rows (4, with outputs a multiple of 4) updated a quad at a load, or
    not (an element at a time)."""
    rows, inputs, outputs = shape
    size, lanes, be = inputs * outputs + outputs, 3, BACKEND
    x, dy = (cases.random(rng, lanes, rows, n) for n in (inputs, outputs))
    flat = [rng.standard_normal((lanes, size + 8)).astype(np.float32) for _ in range(3)]
    flat[2] = np.abs(flat[2])  # v
    state = np.zeros((lanes, SIZE))
    state[:, APPLY], state[:, LR], state[:, GRAD_MULTIPLIER] = [1.0, 1.0, 0.0], [0.05, 0.01, 0.02], 0.5
    state[:, BIAS_CORRECTION1], state[:, BIAS_CORRECTION2] = [0.1, 0.5, 0.271], [0.0316, 0.5, 0.17]
    hypers = be.to_device(np.float32([lane_cases.adam_row(*rules) for rules in lane_cases.ADAM]))
    active = be.to_device(np.array([1, 0, 1], np.int32))
    d_x, d_dy, d_state = be.to_device(x), be.to_device(dy), be.to_device(state)
    results = []
    for fused in (True, False):
        slabs = [be.to_device(a.copy()) for a in flat]  # param, m, v
        weight = [lane_view(a, at, (inputs * outputs,)) for a in slabs]
        bias = [lane_view(a, at + inputs * outputs, (outputs,)) for a in slabs]
        if fused:
            blocks = gemm_update.update_blocks(engine, rows, inputs, outputs, lanes)
            squares = be.to_device(np.full((lanes, blocks + 3), np.nan, np.float32))
            gemm_update.linear_backward_weight_bias_update(d_x, d_dy, weight, bias, d_state, hypers, squares, active,
                                                           engine)
        else:
            grads = be.to_device(np.full((lanes, size + 8), np.nan, np.float32))
            gemm.linear_backward_weight_bias(d_x, d_dy, lane_view(grads, at, (inputs, outputs)),
                                             lane_view(grads, at + inputs * outputs, (outputs,)), 0.0, engine=engine,
                                             active=active)
            share = [lane_view(a, at, (size,)) for a in slabs]
            optim.adam_update_lanes(share[0], lane_view(grads, at, (size,)), share[1], share[2], share[0], d_state,
                                    hypers, active)
            g = be.to_host(grads)[:, at:at + size].astype(np.float64)
        results.append([be.to_host(a) for a in slabs] + [be.to_host(squares) if fused else g])
    for got, want in zip(results[0][:3], results[1][:3]):
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    for got, original in zip(results[0][:3], flat):
        np.testing.assert_array_equal(got[1].view(np.uint32), original[1].view(np.uint32))  # inactive
        np.testing.assert_array_equal(got[2].view(np.uint32), original[2].view(np.uint32))  # not applied
    squares, g = results[0][3], results[1][3]
    for z in (0, 2):
        np.testing.assert_allclose(squares[z, :blocks].astype(np.float64).sum(), (g[z] ** 2).sum(), rtol=1e-5)
        assert np.isnan(squares[z, blocks:]).all()
    assert np.isnan(squares[1]).all()


def test_the_first_layers_squares_are_added_to_each_active_lanes_first_partial(rng):
    """add_squares: partials[z, 0] += squares[z, :count] summed in add_squares' fixed order, for the active lanes;
    nothing else moves."""
    be, count = BACKEND, 75
    squares = rng.random((3, 77)).astype(np.float32)
    partials = rng.random((3, gemm_update.PARTIALS)).astype(np.float32)
    d_partials = be.to_device(partials)
    gemm_update.add_squares(be.to_device(squares), count, d_partials, be.to_device(np.array([1, 0, 1], np.int32)))
    got, want = be.to_host(d_partials), partials.copy()
    for z in (0, 2):
        sums = np.zeros(gemm_update.SQUARES_WARP, np.float32)  # thread t: columns t, t + 32, ... in order
        for b in range(count):
            sums[b % gemm_update.SQUARES_WARP] += squares[z, b]
        width = gemm_update.SQUARES_WARP // 2
        while width:  # the block's tree: partial t + width into partial t
            sums[:width] += sums[width:2 * width]
            width //= 2
        want[z, 0] = np.float32(want[z, 0] + sums[0])
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    with pytest.raises(ValueError, match="78 columns asked of 77"):
        gemm_update.add_squares(be.to_device(squares), 78, d_partials, be.to_device(np.ones(3, np.int32)))
