"""CUDA GEMM kernels against float64 references, for every block tile.

Shapes are (M, K, N) of the layer: x (M, K), w (K, N), y (M, N). They are tiny
and awkward (1, 7, 33, 65, 130: not multiples of any tile) because on CI the
kernels run under the CUDA simulator; tiny outputs pick the SMALL tile, and
`test_every_tile` forces each tile on a shape whose K spans several K steps.
The cases both backends run live in `tests.kernel_cases`.
"""

import numpy as np
import pytest

from mlptrain.activation import NONE, RELU, SIGMOID, TANH
from mlptrain.backends import lanes
from mlptrain.backends.kernel_cache import kernels as kernel_cache
from mlptrain.backends.numba_kernels import chunks, current, gemm, gemm_engines, gemm_split, tiles, wide
from tests import kernel_cases as cases
from tests.kernel_cases import hidden_output, random

pytestmark = pytest.mark.gpu

BACKEND = cases.numba_backend()
ALL_ACTIVATIONS = [((7, 33, 65), activation) for activation in (NONE, RELU, TANH, SIGMOID)]


def poisoned(shape):
    return BACKEND.poisoned(shape)


@pytest.mark.parametrize("shape, activation", [((1, 1, 1), RELU), *ALL_ACTIVATIONS, ((130, 70, 7), TANH)])
def test_linear_forward(rng, shape, activation):
    cases.linear_forward(BACKEND, rng, shape, activation)


@pytest.mark.parametrize("shape, activation", [((1, 1, 1), RELU), *ALL_ACTIVATIONS, ((5, 9, 140), SIGMOID)])
def test_linear_backward_input(rng, shape, activation):
    cases.linear_backward_input(BACKEND, rng, shape, activation)


@pytest.mark.parametrize("shape", [(1, 1, 1), (7, 33, 65), (130, 9, 7)])
@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_linear_backward_weight(rng, shape, beta):
    cases.linear_backward_weight(BACKEND, rng, shape, beta)


def test_row_slices_of_a_larger_buffer(rng):
    cases.row_slices_of_a_larger_buffer(BACKEND, rng, RELU)


@pytest.mark.parametrize("tile", list(tiles.TILES))
def test_every_tile(rng, monkeypatch, tile):
    """Each tile, forced, on one shape: K = 70 spans several K steps of every
    K-split group, and the outputs span several blocks of SMALL."""
    monkeypatch.setattr(gemm_engines, "pick_tile", lambda rows, columns, trials=1: tile)
    m, k, n = 37, 70, 45
    x, w, b, dy, old = random(rng, m, k), random(rng, k, n), random(rng, n), random(rng, m, n), random(rng, k, n)
    h = hidden_output(rng, (m, k), SIGMOID)
    y, dx, dw = poisoned((m, n)), poisoned((m, k)), current.to_device(old)
    gemm.linear_forward(current.to_device(x), current.to_device(w), current.to_device(b), y, TANH)
    gemm.linear_backward_input(current.to_device(dy), current.to_device(w), current.to_device(h), dx, SIGMOID)
    gemm.linear_backward_weight(current.to_device(x), current.to_device(dy), dw, 1.0)
    outputs = [a.copy_to_host() for a in (y, dx, dw)]
    cases.check_layer((x, w, b, dy, h, old), outputs, TANH, SIGMOID, 1.0)


def layer_twice(x, w, b, dy, h, activation):
    """Host (y, dx, dw) of one layer's three GEMMs (beta 0), from two launches
    on fresh poisoned outputs, with the two runs asserted bitwise equal."""
    (m, k), n = x.shape, w.shape[1]
    d_x, d_w, d_b, d_dy, d_h = (current.to_device(a) for a in (x, w, b, dy, h))
    runs = []
    for _ in range(2):
        y, dx, dw = poisoned((m, n)), poisoned((m, k)), poisoned((k, n))
        gemm.linear_forward(d_x, d_w, d_b, y, activation)
        gemm.linear_backward_input(d_dy, d_w, d_h, dx, activation)
        gemm.linear_backward_weight(d_x, d_dy, dw, 0.0)
        runs.append([a.copy_to_host() for a in (y, dx, dw)])
    for first, second in zip(*runs):
        np.testing.assert_array_equal(first.view(np.uint32), second.view(np.uint32))
    return runs[0]


def test_bitwise_deterministic(rng):
    m, k, n = 33, 17, 7
    x, w, b, dy = random(rng, m, k), random(rng, k, n), random(rng, n), random(rng, m, n)
    layer_twice(x, w, b, dy, hidden_output(rng, (m, k), TANH), TANH)


def test_launchers_reject_bad_arguments(rng):
    x, w, b, y = (current.to_device(a) for a in (random(rng, 4, 3), random(rng, 3, 2), random(rng, 2), random(rng, 4, 2)))
    with pytest.raises(ValueError, match="w has shape"):
        gemm.linear_forward(x, current.to_device(random(rng, 5, 2)), b, y, RELU)
    with pytest.raises(ValueError, match="float32"):
        gemm.linear_forward(x, w, b, current.to_device(np.zeros((4, 2))), RELU)
    with pytest.raises(ValueError, match="w must be float16"):  # one storage format per product
        gemm.linear_forward(current.to_device(np.zeros((4, 3), np.float16)), w, b, y, RELU)
    # a column slice: refused by the launcher (numba's arrays) or never made (the driver path's take row slices only)
    with pytest.raises((ValueError, TypeError), match="C-contiguous|row slices"):
        gemm.linear_forward(current.to_device(random(rng, 4, 6))[:, :3], w, b, y, RELU)
    with pytest.raises(ValueError, match="device array"):
        gemm.linear_forward(x, random(rng, 3, 2), b, y, RELU)
    with pytest.raises(ValueError, match="activation"):
        gemm.linear_forward(x, w, b, y, 7)
    with pytest.raises(ValueError, match="beta"):
        gemm.linear_backward_weight(x, y, current.to_device(random(rng, 3, 2)), 0.5)


@pytest.mark.real_gpu
@pytest.mark.parametrize("shape", [(128, 784, 512), (128, 512, 10), (1024, 1000, 777), (2048, 300, 4096)])
def test_mlp_sizes_on_the_gpu(rng, shape):
    """Realistic sizes (every tile gets used), each checked and launched twice."""
    m, k, n = shape
    x, w, b, dy = random(rng, m, k), random(rng, k, n), random(rng, n), random(rng, m, n)
    h = hidden_output(rng, (m, k), RELU)
    outputs = layer_twice(x, w, b, dy, h, RELU)
    cases.check_layer((x, w, b, dy, h, np.zeros((k, n))), outputs, RELU, RELU, 0.0)


LOW_PRECISION = pytest.mark.parametrize("dtype", cases.FORMATS[1:], ids=cases.FORMAT_IDS[1:])


@LOW_PRECISION
@pytest.mark.parametrize("shape, activation", [((7, 33, 65), RELU), ((5, 20, 9), TANH), ((3, 9, 4), SIGMOID)])
def test_low_precision_products(rng, dtype, shape, activation):
    """fp16 / bf16 storage, float32 sums: the three products of a layer within the format's rounding."""
    cases.linear_forward(BACKEND, rng, shape, activation, dtype)
    cases.linear_backward_input(BACKEND, rng, shape, activation, dtype)
    cases.linear_backward_weight(BACKEND, rng, shape, 1.0, dtype)


@pytest.mark.real_gpu
@pytest.mark.parametrize("dtype", cases.FORMATS[1:], ids=cases.FORMAT_IDS[1:])
def test_low_precision_mlp_sizes_on_the_gpu(rng, dtype):
    for shape in [(128, 784, 512), (128, 512, 10)]:
        cases.linear_forward(BACKEND, rng, shape, RELU, dtype)
        cases.linear_backward_input(BACKEND, rng, shape, RELU, dtype)
        cases.linear_backward_weight(BACKEND, rng, shape, 0.0, dtype)


@pytest.mark.parametrize("beta", [0.0, 1.0])
@pytest.mark.parametrize("shape", [(200, 7, 5), (131, 33, 9)])
def test_backward_weight_summed_in_chunks(rng, monkeypatch, shape, beta):
    """A long batch over a small output, given its workspace, is summed in chunks (chunks of 64 here,
    the last one short) by separate blocks, then added in order."""
    monkeypatch.setattr(chunks, "MIN_CHUNK", 64)
    m, k, n = shape
    chunk, count, _ = chunks.chunk_plan(m, k, n, tiles.TILES[gemm.pick_tile(k, n)][0])
    assert count > 1 and gemm.linear_backward_weight_workspace(m, k, n) >= count * k * n
    cases.linear_backward_weight(BACKEND, rng, shape, beta, workspace=True)


@pytest.mark.parametrize("trials, shape, activation, beta, dtype", [
    (1, (1, 1, 1), RELU, 0.0, np.float32), (3, (7, 12, 9), TANH, 1.0, np.float32),
    (2, (5, 9, 14), SIGMOID, 0.0, np.uint16), (2, (3, 17, 6), RELU, 1.0, np.float16)])
def test_trial_axis(rng, trials, shape, activation, beta, dtype):
    cases.layer_trials(BACKEND, rng, trials, shape, activation, beta, dtype)


@pytest.mark.parametrize("tile", list(tiles.TILES))
def test_trial_axis_gives_each_trial_its_own_launchs_bits(rng, monkeypatch, tile):
    """With one tile for both, trial t of a trial-axis launch is bitwise what a launch of its own
    operands alone computes: packing trials changes no trial's arithmetic."""
    monkeypatch.setattr(gemm_engines, "pick_tile", lambda rows, columns, trials=1: tile)
    (x, w, b, dy, h, old), packed = cases.layer_trials(BACKEND, rng, 2, (5, 12, 7), RELU, 1.0)
    for t in range(2):
        y, dx, dw = poisoned(packed[0][t].shape), poisoned(packed[1][t].shape), current.to_device(old[t])
        gemm.linear_forward(current.to_device(x[t]), current.to_device(w[t]), current.to_device(b[t]), y, RELU)
        gemm.linear_backward_input(current.to_device(dy[t]), current.to_device(w[t]), current.to_device(h[t]), dx, RELU)
        gemm.linear_backward_weight(current.to_device(x[t]), current.to_device(dy[t]), dw, 1.0)
        for alone, together in zip((y, dx, dw), packed):
            np.testing.assert_array_equal(alone.copy_to_host().view(np.uint32), together[t].view(np.uint32))


def test_a_launch_over_the_first_trials_sums_as_the_launch_over_all(rng, monkeypatch):
    """`tiles_for` K: a launch over the first n of K trials takes the tile chosen for K, so each of them gets the
    bits the launch over all K gives it (a lane's sums never depend on how many lanes step beside it)."""
    chosen = []

    def pick(rows, columns, trials=1):
        chosen.append(trials)
        return "small" if trials < 3 else "medium"  # another K split: another order of the sums

    monkeypatch.setattr(gemm_engines, "pick_tile", pick)
    (x, w, b, dy, h, old), packed = cases.layer_trials(BACKEND, rng, 3, (5, 12, 7), RELU, 1.0)
    chosen.clear()
    first = slice(0, 2)
    y, dx, dw = poisoned(packed[0][first].shape), poisoned(packed[1][first].shape), current.to_device(old[first])
    gemm.linear_forward(current.to_device(x[first]), current.to_device(w[first]), current.to_device(b[first]), y,
                        RELU, tiles_for=3)
    gemm.linear_backward_input(current.to_device(dy[first]), current.to_device(w[first]),
                               current.to_device(h[first]), dx, RELU, tiles_for=3)
    gemm.linear_backward_weight(current.to_device(x[first]), current.to_device(dy[first]), dw, 1.0, tiles_for=3)
    assert chosen == [3, 3, 3]
    for got, together in zip((y, dx, dw), packed):
        np.testing.assert_array_equal(got.copy_to_host().view(np.uint32), together[first].view(np.uint32))


def test_trials_left_out_by_the_mask_are_not_touched(rng):
    """`active`: a trial whose entry is 0 is not computed (its outputs keep what they held, as a lane between its
    epochs), the others get the bits of the launch without a mask."""
    (x, w, b, dy, h, old), packed = cases.layer_trials(BACKEND, rng, 3, (5, 12, 7), RELU, 1.0)
    active = current.to_device(np.array([1, 0, 1], np.int32))
    y, dx, dw = poisoned(packed[0].shape), poisoned(packed[1].shape), current.to_device(old)
    before = [a.copy_to_host()[1] for a in (y, dx, dw)]
    gemm.linear_forward(current.to_device(x), current.to_device(w), current.to_device(b), y, RELU, active=active)
    gemm.linear_backward_input(current.to_device(dy), current.to_device(w), current.to_device(h), dx, RELU,
                               active=active)
    gemm.linear_backward_weight(current.to_device(x), current.to_device(dy), dw, 1.0, active=active)
    for got, together, untouched in zip((y, dx, dw), packed, before):
        got = got.copy_to_host()
        np.testing.assert_array_equal(got[1].view(np.uint32), untouched.view(np.uint32))
        np.testing.assert_array_equal(got[[0, 2]].view(np.uint32), together[[0, 2]].view(np.uint32))
    with pytest.raises(ValueError, match="active"):
        gemm.linear_forward(current.to_device(x), current.to_device(w), current.to_device(b), y, RELU,
                            active=current.to_device(np.ones(2, np.int32)))


@pytest.mark.parametrize("dtype", [np.float32, np.uint16])
def test_trial_axis_takes_lane_views_of_wider_buffers(rng, dtype):
    """Weights, biases and weight gradients as lane views (each trial's flat parameters one row of a slab, a
    layer's tensors columns of every row): the bits of the same launch on contiguous operands."""
    from mlptrain.backends.lanes import lane_view

    (x, w, b, dy, h, old), packed = cases.layer_trials(BACKEND, rng, 3, (5, 12, 7), TANH, 1.0, dtype)
    k, n = w.shape[1:]
    params = np.zeros((3, 9 + k * n + n + 4), w.dtype)
    params[:, 9:9 + k * n], params[:, 9 + k * n:9 + k * n + n] = w.reshape(3, -1), b
    grads = np.full((3, 2 + k * n + 5), np.nan, np.float32)
    grads[:, 2:2 + k * n] = old.reshape(3, -1)
    params, grads = current.to_device(params), current.to_device(grads)
    wl, bl, dwl = lane_view(params, 9, (k, n)), lane_view(params, 9 + k * n, (n,)), lane_view(grads, 2, (k, n))
    y, dx = BACKEND.poisoned(packed[0].shape, dtype=dtype), BACKEND.poisoned(packed[1].shape, dtype=dtype)
    gemm.linear_forward(current.to_device(x), wl, bl, y, TANH)
    gemm.linear_backward_input(current.to_device(dy), wl, current.to_device(h), dx, TANH)
    gemm.linear_backward_weight(current.to_device(x), current.to_device(dy), dwl, 1.0)
    got = grads.copy_to_host()
    for mine, theirs in ((y.copy_to_host(), packed[0]), (dx.copy_to_host(), packed[1])):
        np.testing.assert_array_equal(cases.to_float32(mine), theirs)
    np.testing.assert_array_equal(got[:, 2:2 + k * n].reshape(3, k, n), packed[2])
    assert np.isnan(got[:, :2]).all() and np.isnan(got[:, 2 + k * n:]).all()  # nothing outside the views


def test_trial_axis_refuses_mismatched_trials(rng):
    x, w = current.to_device(random(rng, 2, 3, 4)), current.to_device(random(rng, 3, 4, 5))
    with pytest.raises(ValueError, match="w has shape"):
        gemm.linear_forward(x, w, current.to_device(random(rng, 2, 5)), poisoned((2, 3, 5)), RELU)


# --- the tf32x3 engine: float32 products on tensor cores at float32 accuracy --------------------------

MINI_TF32_TILE = (32, 32, 2, 2, 16)  # four warps of one 16 x 16 fragment pair: the simulator trades each mma's
# fragments through shared memory, so the production tile runs in the real_gpu case only


@pytest.fixture
def mini_tf32_tile(monkeypatch):
    monkeypatch.setattr(gemm_engines, "TF32_TILE", MINI_TF32_TILE)  # a trial-axis launch's
    monkeypatch.setattr(gemm_engines, "RUN_TF32_TILE", MINI_TF32_TILE)  # a run's own launch's


def tf32x3_layer(rng, trials, shape, activation, beta, engine="tf32x3"):
    """A layer's three passes on the tf32x3 engine, or `engine` (with or without a trial axis), against float64."""
    m, k, n = shape
    lead = () if trials is None else (trials,)
    x, w, b, dy, old = (random(rng, *lead, *s) for s in ((m, k), (k, n), (n,), (m, n), (k, n)))
    h = hidden_output(rng, (*lead, m, k), activation)
    y, dx = poisoned((*lead, m, n)), poisoned((*lead, m, k))
    dw = poisoned((*lead, k, n)) if beta == 0.0 else current.to_device(old)
    d = {name: current.to_device(a) for name, a in dict(x=x, w=w, b=b, dy=dy, h=h).items()}
    gemm.linear_forward(d["x"], d["w"], d["b"], y, activation, engine=engine)
    gemm.linear_backward_input(d["dy"], d["w"], d["h"], dx, activation, engine=engine)
    gemm.linear_backward_weight(d["x"], d["dy"], dw, beta, engine=engine)
    outputs = [a.copy_to_host() for a in (y, dx, dw)]
    for t in range(1 if trials is None else trials):
        pick = (lambda a: a) if trials is None else (lambda a: a[t])
        cases.check_layer(tuple(pick(a) for a in (x, w, b, dy, h, old)), [pick(o) for o in outputs],
                          activation, activation, beta)


@pytest.mark.parametrize("trials, shape, activation, beta", [
    (None, (33, 20, 9), RELU, 0.0),  # two blocks down the batch; K past one 16-deep slice; ragged edges
    (2, (5, 9, 7), TANH, 1.0),
])
def test_tf32x3_engine(rng, mini_tf32_tile, trials, shape, activation, beta):
    tf32x3_layer(rng, trials, shape, activation, beta)


@pytest.mark.real_gpu
@pytest.mark.parametrize("trials, shape", [(None, (130, 784, 70)), (3, (128, 512, 10)), (2, (257, 33, 129))])
def test_tf32x3_engine_production_tile(rng, trials, shape):
    tf32x3_layer(rng, trials, shape, RELU, 1.0)


def tf32x3_staged_both_ways(rng, monkeypatch, trials, shape):
    """A layer's three passes on the tf32x3 engine with the operands aligned_rows passes staged four elements a
    load, then with every operand staged an element a load: (which operands went wide, both outputs)."""
    m, k, n = shape
    lead = () if trials is None else (trials,)
    x, w, b, dy, old = (random(rng, *lead, *s) for s in ((m, k), (k, n), (n,), (m, n), (k, n)))
    h = hidden_output(rng, (*lead, m, k), RELU)
    d = {name: current.to_device(a) for name, a in dict(x=x, w=w, b=b, dy=dy, h=h).items()}
    chosen, outputs = [], []
    by_operands = gemm_engines.engine_staging
    for staging in (by_operands, lambda engine, a, b: (False, False, 0)):
        monkeypatch.setattr(gemm_engines, "engine_staging",
                            lambda engine, a, b: chosen.append(staging(engine, a, b)) or chosen[-1])
        y, dx, dw = poisoned((*lead, m, n)), poisoned((*lead, m, k)), current.to_device(old)
        gemm.linear_forward(d["x"], d["w"], d["b"], y, RELU, engine="tf32x3")
        gemm.linear_backward_input(d["dy"], d["w"], d["h"], dx, RELU, engine="tf32x3")
        gemm.linear_backward_weight(d["x"], d["dy"], dw, 1.0, engine="tf32x3")
        outputs.append([a.copy_to_host() for a in (y, dx, dw)])
    for t in range(1 if trials is None else trials):
        pick = (lambda a: a) if trials is None else (lambda a: a[t])
        cases.check_layer(tuple(pick(a) for a in (x, w, b, dy, h, old)), [pick(o) for o in outputs[0]], RELU, RELU,
                          1.0)
    return chosen[:3], outputs


@pytest.mark.parametrize("trials, shape, wide", [
    (2, (8, 8, 12), [(True, True), (True, True), (True, True)]),  # every operand's rows in whole quads
    (None, (9, 12, 10), [(True, False), (False, False), (True, False)]),  # N = 10: w and dy element by element
])
def test_tf32x3_wide_staging_gives_the_same_bits(rng, monkeypatch, mini_tf32_tile, trials, shape, wide):
    chosen, (quads, elements) = tf32x3_staged_both_ways(rng, monkeypatch, trials, shape)
    assert [c[:2] for c in chosen] == wide  # forward (x, w), input gradient (dy, w), weight gradient (x, dy)
    for a, b in zip(quads, elements):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.real_gpu
@pytest.mark.parametrize("stages", [0, 2, 3, 4])
def test_tf32x3_wide_staging_gives_the_same_bits_on_the_gpu(rng, monkeypatch, stages):
    monkeypatch.setattr(gemm_engines, "TF32_STAGES", stages)
    chosen, (quads, elements) = tf32x3_staged_both_ways(rng, monkeypatch, 3, (128, 784, 512))
    assert chosen == [(True, True, stages)] * 3
    for a, b in zip(quads, elements):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


def test_tf32x3_slices_copied_ahead_give_the_same_bits(rng, monkeypatch, mini_tf32_tile):
    """Both operands wide and TF32_STAGES on: every slice copied by cp.async two slices ahead into a ring of three
    (gemm_async), K of 40 and a batch of 36 three slices each, the last one ragged."""
    monkeypatch.setattr(gemm_engines, "TF32_STAGES", 3)
    chosen, (copied, elements) = tf32x3_staged_both_ways(rng, monkeypatch, None, (36, 40, 12))
    assert chosen == [(True, True, 3)] * 3
    for a, b in zip(copied, elements):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


def test_wide_rows_only_for_aligned_quads():
    ok = np.zeros((4, 8, 16), np.float32)
    assert wide.aligned_rows(current.to_device(ok))
    slab = current.to_device(np.zeros((4, 132), np.float32))  # lanes 528 bytes apart
    assert wide.aligned_rows(lanes.lane_view(slab, 4, (8, 12)))  # 16 bytes in
    assert not wide.aligned_rows(lanes.lane_view(slab, 1, (8, 12)))  # 4 bytes in
    assert not wide.aligned_rows(current.to_device(np.zeros((8, 10), np.float32)))  # rows of 10: no whole quads
    assert not wide.aligned_rows(current.to_device(np.zeros((3, 8, 16), np.float16)))  # not float32
    odd_lanes = current.to_device(np.zeros((4, 130), np.float32))  # lanes 130 floats apart: every other off
    assert not wide.aligned_rows(lanes.lane_view(odd_lanes, 0, (8, 16)))


@pytest.mark.parametrize("dtype", [np.float16, np.uint16])
def test_tf32x3_engine_sums_16_bit_operands_exactly(rng, mini_tf32_tile, dtype):
    """16-bit values fit a tf32, so the engine sums them by one product a fragment (no split): the float64
    reference's results, and the bits of the same values summed as float32 by the 3xTF32 products (whose small
    parts are then zero), rounded to the storage format once."""
    from mlptrain.dtypes import from_float32, to_float32

    m, k, n = 17, 24, 12  # two blocks of rows on the small tile, K past one 16-deep slice
    x, w, b = (from_float32(random(rng, *s), dtype) for s in ((m, k), (k, n), (n,)))
    dy = from_float32(random(rng, m, n), dtype)
    got, want = {}, {}
    as_float32 = tuple(to_float32(a) for a in (x, w, b, dy))
    for out, arrays, store in ((got, (x, w, b, dy), dtype), (want, as_float32, np.float32)):
        d = [current.to_device(a) for a in arrays]
        y, dx = current.to_device(np.zeros((m, n), store)), current.to_device(np.zeros((m, k), store))
        dw = poisoned((k, n))
        gemm.linear_forward(d[0], d[1], d[2], y, RELU, engine="tf32x3")
        gemm.linear_backward_input(d[3], d[1], dx, dx, NONE, engine="tf32x3")
        gemm.linear_backward_weight(d[0], d[3], dw, 0.0, engine="tf32x3")
        out.update(y=y.copy_to_host(), dx=dx.copy_to_host(), dw=dw.copy_to_host())
    np.testing.assert_array_equal(got["y"], from_float32(want["y"], dtype))
    np.testing.assert_array_equal(got["dx"], from_float32(want["dx"], dtype))
    np.testing.assert_array_equal(got["dw"], want["dw"])
    xv, wv, bv = as_float32[:3]
    magnitude = np.abs(xv.astype(np.float64)) @ np.abs(wv) + np.abs(bv)
    cases.ref.assert_within(to_float32(got["y"]), cases.ref.linear_forward(xv, wv, bv, RELU),
                            cases.ref.product_tolerance(xv, wv, bv)
                            + 2 * cases.ref.rounding_tolerance(dtype, magnitude))


# --- the narrow engine: layers of at most gemm_narrow.NARROW_MOST outputs (a classifier's last) ------------

@pytest.mark.parametrize("trials, shape, activation, beta, dtype", [
    (2, (9, 70, 10), RELU, 0.0, np.float32),  # two forward blocks of rows; K past two warps' worth
    (3, (5, 37, 3), TANH, 1.0, np.float32), (2, (4, 33, 16), SIGMOID, 0.0, np.uint16),
    (1, (3, 5, 1), NONE, 1.0, np.float16),
    (2, (3, 300, 10), RELU, 1.0, np.float32)])  # a row's K split over two warps (forward_grid)
def test_narrow_engine(rng, trials, shape, activation, beta, dtype):
    cases.layer_trials(BACKEND, rng, trials, shape, activation, beta, dtype, engine="narrow")


def test_narrow_forward_splits_a_long_k_over_warps():
    from mlptrain.backends.numba_kernels import gemm_narrow

    assert gemm_narrow.forward_grid(128, 512, 1) == ((64, 1), 256, 4)  # adam_mnist's output layer
    assert gemm_narrow.forward_grid(2048, 128, 1) == ((1024, 1), 64, 1)
    assert gemm_narrow.forward_grid(5, 300, 3) == ((3, 3), 128, 2)
    assert gemm_narrow.forward_grid(7, 5000, 2)[2] == gemm_narrow.SPLIT_MOST


def test_narrow_input_gradient_rows_a_block(monkeypatch, rng):
    """INPUT_ROWS rows a block, INPUT_ROWS_FEW where that leaves fewer than FILL_BLOCKS blocks (none on the
    simulator, which only pays for more blocks); forced here, the few rows give the same bits."""
    from mlptrain.backends.numba_kernels import gemm_narrow

    monkeypatch.setattr(gemm_narrow, "FILL_BLOCKS", 128)
    assert gemm_narrow.input_grid(128, 512, 1) == ((2, 64, 1), 256, 2)  # 8 rows: 32 blocks
    assert gemm_narrow.input_grid(2048, 128, 1) == ((1, 256, 1), 256, 8)
    assert gemm_narrow.input_grid(128, 512, 16)[2] == 8  # a lane group's
    shape = (9, 5, 3)  # dy (9, 3), w (5, 3): 2 rows a block gives 5 blocks, 8 gives 2
    got = []
    for fill in (0, 128):
        monkeypatch.setattr(gemm_narrow, "FILL_BLOCKS", fill)
        got.append(cases.linear_backward_input(BACKEND, np.random.default_rng(4), shape, RELU, engine="narrow"))
    np.testing.assert_array_equal(got[0].view(np.uint32), got[1].view(np.uint32))


def test_narrow_engine_without_a_trial_axis(rng):
    tf32x3_layer(rng, None, (11, 40, 7), RELU, 1.0, engine="narrow")


def test_narrow_engine_leaves_masked_trials_and_takes_lane_views(rng):
    """`active` and lane views as the tile engines take them: a masked trial's outputs keep what they held; a
    layer's weights and weight gradient as columns of wider rows give the bits of contiguous operands."""
    from mlptrain.backends.lanes import lane_view

    (x, w, b, dy, h, old), packed = cases.layer_trials(BACKEND, rng, 3, (6, 20, 5), RELU, 1.0, engine="narrow")
    k, n = w.shape[1:]
    params = np.zeros((3, 3 + k * n + n), np.float32)
    params[:, 3:3 + k * n], params[:, 3 + k * n:] = w.reshape(3, -1), b
    grads = np.full((3, 1 + k * n + 2), np.nan, np.float32)
    grads[:, 1:1 + k * n] = old.reshape(3, -1)
    params, grads = current.to_device(params), current.to_device(grads)
    wl, bl, dwl = lane_view(params, 3, (k, n)), lane_view(params, 3 + k * n, (n,)), lane_view(grads, 1, (k, n))
    active = current.to_device(np.array([1, 0, 1], np.int32))
    y, dx = poisoned(packed[0].shape), poisoned(packed[1].shape)
    before = [a.copy_to_host()[1] for a in (y, dx)]
    gemm.linear_forward(current.to_device(x), wl, bl, y, RELU, "narrow", active=active)
    gemm.linear_backward_input(current.to_device(dy), wl, current.to_device(h), dx, RELU, "narrow", active=active)
    gemm.linear_backward_weight(current.to_device(x), current.to_device(dy), dwl, 1.0, engine="narrow",
                                active=active)
    got = grads.copy_to_host()
    for mine, theirs, untouched in ((y.copy_to_host(), packed[0], before[0]), (dx.copy_to_host(), packed[1], before[1])):
        np.testing.assert_array_equal(mine[[0, 2]].view(np.uint32), theirs[[0, 2]].view(np.uint32))
        np.testing.assert_array_equal(mine[1].view(np.uint32), untouched.view(np.uint32))
    np.testing.assert_array_equal(got[[0, 2], 1:1 + k * n].reshape(2, k, n), packed[2][[0, 2]])
    np.testing.assert_array_equal(got[1, 1:1 + k * n].reshape(k, n), old[1])
    assert np.isnan(got[:, :1]).all() and np.isnan(got[:, 1 + k * n:]).all()  # nothing outside the views


def test_narrow_engine_refuses_wide_layers(rng):
    x, w = current.to_device(random(rng, 2, 3, 4)), current.to_device(random(rng, 2, 4, 17))
    with pytest.raises(ValueError, match="at most 16 outputs, got 17"):
        gemm.linear_forward(x, w, current.to_device(random(rng, 2, 17)), poisoned((2, 3, 17)), RELU, "narrow")
    with pytest.raises(ValueError, match="at most 16 outputs, got 17"):
        gemm.linear_backward_weight(x, current.to_device(random(rng, 2, 3, 17)), poisoned((2, 4, 17)), 0.0,
                                    engine="narrow")


@pytest.mark.real_gpu
@pytest.mark.parametrize("trials, shape", [(16, (128, 512, 10)), (3, (257, 1000, 13)), (None, (130, 784, 10))])
def test_narrow_engine_production_sizes(rng, trials, shape):
    tf32x3_layer(rng, trials, shape, RELU, 1.0, engine="narrow")


def test_a_runs_layers_take_the_narrow_engine_and_tensor_cores_and_the_record_says_so(monkeypatch):
    """A run's own launches (nn.MLP): "narrow" for the forward and input gradient of a layer of at most NARROW_MOST
    outputs, the CUDA-core tiles' chunks for its weight gradient; a wider layer's float32 passes on "tf32x3" while
    RUN_TF32X3 is on, 16-bit ones on "mma16" while RUN_MMA16 is (else on tf32x3 while RUN_TF32X3_16 is), else on
    "fma", and on "fma" on a GPU before compute capability 8.0; summary.json's kernel plan
    (linear_variants) says which ran; the NumPy twin names "fma"."""
    from mlptrain.backends.numpy_kernels import gemm as numpy_gemm

    for on, on16, mma16 in ((True, True, False), (True, False, False), (False, True, False), (True, True, True),
                            (False, False, True)):
        monkeypatch.setattr(gemm, "RUN_TF32X3", on)
        monkeypatch.setattr(gemm, "RUN_TF32X3_16", on16)
        monkeypatch.setattr(gemm, "RUN_MMA16", mma16)
        low = "mma16" if mma16 else "tf32x3" if on and on16 else "fma"
        for dtype, wide_engine in ((np.float32, "tf32x3" if on else "fma"), (np.float16, low), (np.uint16, low)):
            for outputs in (1, 10, gemm.NARROW_MOST, gemm.NARROW_MOST + 1, 512):
                narrow = outputs <= gemm.NARROW_MOST
                side = "narrow" if narrow else wide_engine
                assert gemm.layer_engines(outputs, dtype) == {"forward": side, "backward_input": side,
                                                              "backward_weight": "fma" if narrow else wide_engine}
                assert set(numpy_gemm.layer_engines(outputs, dtype).values()) == {"fma"}
    monkeypatch.setattr(gemm, "RUN_TF32X3", True)
    monkeypatch.setattr(gemm, "RUN_TF32X3_16", False)
    monkeypatch.setattr(gemm, "RUN_MMA16", False)
    variants = gemm.linear_variants(128, 512, 10)
    assert variants["forward"] == variants["backward_input"] == "narrow"
    assert variants["backward_weight"] == "tiled/small+bias"  # the bias gradient in the same launch
    monkeypatch.setattr(gemm_split, "RUN_CLUSTERS", False)
    assert gemm.linear_variants(128, 784, 512) == {"forward": "tf32x3+split", "backward_input": "tf32x3+split",
                                                   "backward_weight": "tf32x3+bias"}
    monkeypatch.setattr(gemm_split, "RUN_CLUSTERS", True)  # the default: clustered where the GPU and driver take them
    split = "+cluster" if kernel_cache.cluster_launches() else "+split"
    assert gemm.linear_variants(128, 784, 512) == {"forward": "tf32x3" + split, "backward_input": "tf32x3" + split,
                                                   "backward_weight": "tf32x3+bias"}
    monkeypatch.setattr(gemm_split, "RUN_CLUSTERS", False)
    assert gemm.linear_variants(2048, 784, 128)["backward_weight"] == "tf32x3+chunks"
    assert gemm.linear_variants(128, 784, 512, dtype=np.uint16) == {
        "forward": "tiled/small+split", "backward_input": "tiled/small", "backward_weight": "tiled/medium+bias"}
    assert gemm.linear_variants(128, 784, 512, workspace=False, dtype=np.uint16)["forward"] == "tiled/small"
    assert gemm.linear_variants(128, 512, 10, trials=4)["forward"].endswith("+trials")  # lanes choose their own
    monkeypatch.setattr(gemm, "RUN_MMA16", True)
    assert gemm.linear_variants(128, 784, 512, dtype=np.float16) == {
        "forward": "mma16+split", "backward_input": "mma16+split", "backward_weight": "mma16+bias"}
    assert gemm.linear_variants(128, 784, 512)["forward"] == "tf32x3+split"  # float32 layers keep tf32x3
    monkeypatch.setattr(gemm.current, "kernel_capability", lambda: (7, 5))  # a GPU before tensor cores' mma shapes
    assert set(gemm.layer_engines(512, np.float16).values()) == set(gemm.layer_engines(512, np.float32).values()) \
        == {"fma"}


# --- a forward or input gradient of few tiles, its K summed in chunks (gemm_split) -----------------------------

def count_splits(monkeypatch):
    """A list that gets the chunks of each pass gemm_split runs."""
    calls, split = [], gemm_split.split_rows_pass
    monkeypatch.setattr(gemm_split, "split_rows_pass", lambda *args: calls.append(args[-1][4]) or split(*args))
    return calls


@pytest.mark.parametrize("engine, activation, dtype, k", [
    ("fma", NONE, np.float32, 130), ("fma", TANH, np.uint16, 130),
    ("tf32x3", SIGMOID, np.float32, 130),  # staged through registers (K not whole quads)
    ("tf32x3", RELU, np.float32, 132),  # copied by cp.async (every row whole quads)
])
def test_a_pass_of_few_tiles_sums_its_k_in_chunks(rng, monkeypatch, mini_tf32_tile, engine, activation, dtype, k):
    """Given a workspace, a forward or input gradient of fewer than SPLIT_BELOW tiles sums its K in chunks
    (MIN_CHUNK lowered so that a simulator-sized K of 130 splits in two, 128 + 2: a short last chunk), then
    adds them with its epilogue: the float64 reference's results (the same bits run to run: the real_gpu case)."""
    monkeypatch.setattr(chunks, "MIN_CHUNK", 64)
    calls = count_splits(monkeypatch)
    cases.linear_forward(BACKEND, rng, (7, k, 20), activation, dtype, True, engine)
    cases.linear_backward_input(BACKEND, rng, (7, 20, k), activation, dtype, True, engine)
    assert calls == [2, 2]


def test_a_tf32x3_weight_gradient_sums_a_long_batch_in_chunks(rng, monkeypatch, mini_tf32_tile):
    monkeypatch.setattr(chunks, "MIN_CHUNK", 64)
    assert gemm.linear_backward_weight_workspace(130, 20, 12, engine="tf32x3") == 2 * 20 * 12
    added = []
    monkeypatch.setattr(gemm, "add_chunks", lambda partials, dw, beta: added.append(partials.shape) or
                        chunks.add_chunks(partials, dw, beta))
    cases.linear_backward_weight(BACKEND, rng, (130, 20, 12), 1.0, workspace=True, engine="tf32x3")
    assert added == [(2, 20 * 12)]


def test_a_pass_splits_only_where_its_tiles_are_few_and_its_k_long(monkeypatch):
    """The plans: 128 x 512 outputs (64 SMALL tiles) over K = 784 in three chunks on the CUDA cores, in seven on
    tf32x3 (16 tiles, chunks of at least 64); a K under two shortest chunks, or an output of SPLIT_BELOW tiles or
    more, in one launch; the workspace is sized for the largest split batch at or below the run's; a workspace
    too small is refused."""
    assert gemm.linear_rows_workspace(128, 784, 512) == 3 * 128 * 512
    assert gemm.linear_rows_workspace(128, 512, 512) == 2 * 128 * 512
    assert gemm.linear_rows_workspace(128, 784, 512, "tf32x3") == 7 * 128 * 512
    assert gemm.linear_rows_workspace(128, 500, 512) == 0  # too short to cut on the CUDA cores
    assert gemm.linear_rows_workspace(4096, 784, 512) == 3 * 128 * 512  # past 128 rows no batch splits
    assert gemm.linear_rows_workspace(128, 784, 10, "narrow") == 0
    calls = count_splits(monkeypatch)
    x = current.to_device(random(np.random.default_rng(0), 3, 600))
    w = current.to_device(np.zeros((600, 5), np.float32))
    with pytest.raises(ValueError, match="workspace has 1 elements, needs 30"):
        gemm.linear_forward(x, w, current.to_device(np.zeros(5, np.float32)), poisoned((3, 5)), RELU,
                            workspace=poisoned(1))
    assert calls == [2]


@pytest.mark.real_gpu
@pytest.mark.parametrize("shape", [(128, 784, 512), (100, 512, 512), (33, 1000, 300), (2048, 784, 128)])
def test_split_passes_production_sizes(monkeypatch, shape):
    """Split passes and chunked weight gradients at an MLP's sizes: the reference's results, the same bits on a
    second run."""
    calls = count_splits(monkeypatch)
    for engine, dtype in (("tf32x3", np.float32), ("tf32x3", np.uint16), ("tf32x3", np.float16), ("fma", np.float32),
                          ("fma", np.uint16), ("fma", np.float16)):
        forward = [cases.linear_forward(BACKEND, np.random.default_rng(1), shape, SIGMOID, dtype, True, engine)
                   for _ in range(2)]
        backward = [cases.linear_backward_input(BACKEND, np.random.default_rng(2), (shape[0], shape[2], shape[1]),
                                                RELU, dtype, True, engine) for _ in range(2)]
        np.testing.assert_array_equal(forward[0], forward[1])
        np.testing.assert_array_equal(backward[0], backward[1])
        cases.linear_backward_weight(BACKEND, np.random.default_rng(3), shape, 1.0, dtype, True, engine)
    assert bool(calls) == (shape[0] <= 128)  # a batch of 128 rows or fewer splits its passes; 2048 fill the GPU
