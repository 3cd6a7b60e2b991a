"""The mma16 engine: a dense layer's 16-bit passes on tensor cores (m16n8k16, float32 sums), against float64
references, and its two stagings (cp.async slices, registers) against each other bit for bit.

The simulator trades each mma's fragments through shared memory, so its cases run a small tile on tiny awkward
shapes; the production tile runs in the real_gpu cases.
"""

import numpy as np
import pytest

from mlptrain.activation import RELU, SIGMOID, TANH
from mlptrain.backends import lanes
from mlptrain.backends.numba_kernels import current, gemm, gemm_engines, gemm_split, wide
from mlptrain.dtypes import from_float32
from tests import kernel_cases as cases
from tests.kernel_cases import hidden_output, random

pytestmark = pytest.mark.gpu

BACKEND = cases.numba_backend()
SIXTEEN = pytest.mark.parametrize("dtype", cases.FORMATS[1:], ids=cases.FORMAT_IDS[1:])
MINI_TILE = (32, 32, 2, 2)  # four warps of one 16 x 16 fragment pair


@pytest.fixture
def mini_tile(monkeypatch):
    monkeypatch.setattr(gemm_engines, "MMA16_TILE", MINI_TILE)


@pytest.mark.parametrize("dtype, shape, activation, workspace", [
    (np.uint16, (33, 40, 24), RELU, False),  # every row whole 16-byte copies: slices by cp.async; two blocks of rows
    (np.float16, (9, 20, 10), TANH, False),  # rows of 20 and 10: staged through registers
    (np.float16, (5, 136, 16), SIGMOID, True),  # K in chunks of 128 and 8, added by a second launch
])
def test_mma16_engine(rng, mini_tile, dtype, shape, activation, workspace):
    cases.linear_forward(BACKEND, rng, shape, activation, dtype, workspace, engine="mma16")
    cases.linear_backward_input(BACKEND, rng, shape, activation, dtype, workspace, engine="mma16")
    cases.linear_backward_weight(BACKEND, rng, shape, 1.0, dtype, workspace, engine="mma16")


def test_mma16_chunks_where_its_tiles_are_few(mini_tile):
    """The shapes above that ask for a workspace split on this engine (else their case tests one launch)."""
    assert gemm_split.rows_split("mma16", 5, 136, 16)[4] == 2  # chunks of 128 and 8
    assert gemm_split.weight_chunks("mma16", 2048, 128, 128)[4] > 1


@pytest.mark.parametrize("dtype", [np.uint16])
def test_mma16_trial_axis(rng, mini_tile, dtype):
    cases.layer_trials(BACKEND, rng, 2, (17, 24, 16), RELU, 0.0, dtype, engine="mma16")


def staged_both_ways(rng, monkeypatch, shape, dtype, workspace=False):
    """A layer's three passes on mma16 with the staging its operands get, then with both operands staged through
    registers: (the stagings chosen, both outputs)."""
    m, k, n = shape
    x, w, b, dy = (from_float32(random(rng, *s), dtype) for s in ((m, k), (k, n), (n,), (m, n)))
    h = from_float32(hidden_output(rng, (m, k), RELU), dtype)
    d = {name: current.to_device(a) for name, a in dict(x=x, w=w, b=b, dy=dy, h=h).items()}
    space = lambda size: BACKEND.poisoned(max(1, size)) if workspace else None  # noqa: E731
    chosen, outputs = [], []
    by_operands = gemm_engines.engine_staging
    for staging in (by_operands, lambda engine, a, b: (False, False, 0)):
        monkeypatch.setattr(gemm_engines, "engine_staging",
                            lambda engine, a, b: chosen.append(staging(engine, a, b)) or chosen[-1])
        y, dx = BACKEND.poisoned((m, n), dtype=dtype), BACKEND.poisoned((m, k), dtype=dtype)
        dw = BACKEND.poisoned((k, n))
        gemm.linear_forward(d["x"], d["w"], d["b"], y, RELU, "mma16",
                            workspace=space(gemm.linear_rows_workspace(m, k, n, "mma16")))
        gemm.linear_backward_input(d["dy"], d["w"], d["h"], dx, RELU, "mma16",
                                   workspace=space(gemm.linear_rows_workspace(m, n, k, "mma16")))
        gemm.linear_backward_weight(d["x"], d["dy"], dw, 0.0, space(gemm.linear_backward_weight_workspace(
            m, k, n, engine="mma16")), "mma16")
        outputs.append([a.copy_to_host() for a in (y, dx, dw)])
    return chosen, outputs


def test_mma16_slices_copied_ahead_give_the_registers_bits(rng, monkeypatch, mini_tile):
    """K of 40 and a batch of 36: two slices each, the last one ragged; every operand's rows whole copies. fp16,
    whose register staging reinterprets each value's bits (bf16's are stored as they are)."""
    chosen, (copied, registers) = staged_both_ways(rng, monkeypatch, (36, 40, 16), np.float16)
    assert [c[2] for c in chosen[:3]] == [gemm_engines.MMA16_STAGES] * 3
    for a, b in zip(copied, registers):
        np.testing.assert_array_equal(a.view(np.uint16 if a.itemsize == 2 else np.uint32),
                                      b.view(np.uint16 if b.itemsize == 2 else np.uint32))


def test_mma16_takes_16_bit_operands_only(rng):
    x = current.to_device(random(rng, 4, 8))
    w, b, y = (current.to_device(random(rng, *s)) for s in ((8, 24), (24,), (4, 24)))
    with pytest.raises(ValueError, match="mma16 engine takes 16-bit"):
        gemm.linear_forward(x, w, b, y, RELU, engine="mma16")


def test_copyable_rows_only_for_whole_aligned_pieces():
    assert wide.copyable_rows(current.to_device(np.zeros((3, 8), np.uint16)))  # one 16-byte piece a row
    assert wide.copyable_rows(current.to_device(np.zeros((2, 3, 4), np.float32)))
    assert not wide.copyable_rows(current.to_device(np.zeros((3, 12), np.float16)))  # 24 bytes a row
    slab = current.to_device(np.zeros((4, 104), np.uint16))  # lanes 208 bytes apart
    assert wide.copyable_rows(lanes.lane_view(slab, 8, (8, 8)))  # 16 bytes in
    assert not wide.copyable_rows(lanes.lane_view(slab, 4, (8, 8)))  # 8 bytes in
    assert not wide.copyable_rows(current.to_device(np.zeros(16, np.uint16)))  # not a matrix


@pytest.mark.real_gpu
@SIXTEEN
@pytest.mark.parametrize("shape", [(128, 784, 512), (128, 512, 512), (2048, 784, 128), (130, 100, 70)])
def test_mma16_engine_production_tile(rng, dtype, shape):
    cases.linear_forward(BACKEND, rng, shape, RELU, dtype, True, engine="mma16")
    cases.linear_backward_input(BACKEND, rng, shape, RELU, dtype, True, engine="mma16")
    cases.linear_backward_weight(BACKEND, rng, shape, 0.0, dtype, True, engine="mma16")


@pytest.mark.real_gpu
@pytest.mark.parametrize("stages", [2, 3, 4])
def test_mma16_staging_gives_the_same_bits_on_the_gpu(rng, monkeypatch, stages):
    monkeypatch.setattr(gemm_engines, "MMA16_STAGES", stages)
    chosen, (copied, registers) = staged_both_ways(rng, monkeypatch, (128, 784, 512), np.uint16, workspace=True)
    assert all(c == (True, True, stages) for c in chosen[:len(chosen) // 2])
    for a, b in zip(copied, registers):
        np.testing.assert_array_equal(a.view(np.uint16 if a.itemsize == 2 else np.uint32),
                                      b.view(np.uint16 if b.itemsize == 2 else np.uint32))
