"""Kernel test cases of the lane-axis launchers (packed trials), shared by both backends.

The companion of `tests.kernel_cases` (its `Backend` and storage formats), kept apart to keep each file
short. Every case runs a `*_lanes` launcher over K = 3 lanes and then the solo launcher lane by lane on
fresh copies of the same inputs, and asks for the same bits. One lane is inactive wherever a mask applies:
its outputs start poisoned and must stay so, and its cursor points far past its indices, so that a read
of either would fail. At least one operand of each case is a lane view of a wider slab (as the packed
trials' flat buffers give them), and the slab's other columns must keep their bits.
"""

import numpy as np

from mlptrain.backends.lanes import lane_view
from mlptrain.optim import step_state
from tests.kernel_cases import stored

LANES = 3
ACTIVE = np.array([1, 0, 1], np.int32)  # lane 1 sits out
FAR = 10**9  # the inactive lane's cursor: far past any indices


def same_bits(got, want):
    got, want = np.ascontiguousarray(got), np.ascontiguousarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


def poison(shape, dtype=np.float32):
    """NaN (bf16's quiet NaN in uint16), or -7 for integers: a value no kernel writes."""
    if np.dtype(dtype) == np.uint16:
        return np.full(shape, 0x7FC0, np.uint16)
    return np.full(shape, np.nan if np.dtype(dtype).kind == "f" else -7, dtype)


class Slab:
    """A (lanes, width) host array on the device, with the lane view of its columns offset:+prod(shape)."""

    def __init__(self, be, host, offset, shape):
        self.be, self.host, self.offset, self.shape = be, host.copy(), offset, tuple(shape)
        self.device = be.to_device(host)
        self.view = lane_view(self.device, offset, shape)

    def lane(self, z):
        """Lane z's block as it was before the launch."""
        return lane_view(self.host, self.offset, self.shape)[z]

    def after(self):
        """(the lane view's blocks, read back) after checking that the slab's other columns kept their bits."""
        now = np.asarray(self.be.to_host(self.device))
        columns = np.ones(self.host.shape[1], bool)
        columns[self.offset:self.offset + int(np.prod(self.shape))] = False
        same_bits(now[:, columns], self.host[:, columns])
        return lane_view(now, self.offset, self.shape)


def check_lanes(got, lane_results, before):
    """Active lane z got lane_results[z]'s bits; an inactive lane kept `before`'s."""
    for z in range(LANES):
        same_bits(got[z], lane_results[z] if ACTIVE[z] else before[z])


# data


def gather_lanes(be, rng, dtype=np.float32, rows=5, width=13, start=2):
    images = rng.integers(0, 256, (11, width), dtype=np.uint8)
    labels = rng.integers(0, 10, 11, dtype=np.uint8)
    indices = np.stack([rng.permutation(11)[:9] for _ in range(LANES)]).astype(np.int32)
    cursors = np.array([[1], [FAR], [2]], np.int64)
    x = poison((LANES, rows, width), dtype)
    y = Slab(be, poison((LANES, rows + 4), np.int32), 3, (rows,))
    cursor_slab = np.arange(LANES * 4, dtype=np.int64).reshape(LANES, 4)
    cursor_slab[:, 2:3] = cursors
    cursor = Slab(be, cursor_slab, 2, (1,))
    d_images, d_labels, d_x = be.to_device(images), be.to_device(labels), be.to_device(x)
    data = be.kernels.data
    data.gather_lanes(d_images, d_labels, be.to_device(indices), start, d_x, y.view, 1 / 255, -0.5, cursor.view,
                      be.to_device(ACTIVE))
    solo = []
    for z in range(LANES):
        solo_x, solo_y = be.to_device(poison((rows, width), dtype)), be.to_device(poison(rows, np.int32))
        if ACTIVE[z]:
            data.gather_batch(d_images, d_labels, be.to_device(indices[z]), start, solo_x, solo_y, 1 / 255, -0.5,
                              be.to_device(cursors[z]))
        solo.append((be.to_host(solo_x), be.to_host(solo_y)))
    check_lanes(be.to_host(d_x), [s[0] for s in solo], x)
    check_lanes(y.after(), [s[1] for s in solo], poison((LANES, rows), np.int32))
    same_bits(cursor.after(), cursors)  # read, not moved: the step's last rules launch moves it


# loss


def softmax_cross_entropy_lanes(be, rng, dtype=np.float32, rows=5, classes=7, offset=2):
    logits, _ = stored((3 * rng.standard_normal((LANES, rows, classes))).astype(np.float32), dtype)
    labels = rng.integers(0, classes, (LANES, rows)).astype(np.int32)
    span = offset + rows + 3
    cursors = np.array([[1], [FAR], [0]], np.int64)
    state = np.zeros((LANES, step_state.SIZE))
    state[:, step_state.LOSS_SCALE] = [1.0, 8.0, 2.0**16]
    loss_scale = Slab(be, state, step_state.LOSS_SCALE, (1,))  # a column of the lanes' step states
    row_correct = Slab(be, poison((LANES, span + 5), np.int32), 4, (span,))
    dlogits, row_loss = be.to_device(poison(logits.shape, dtype)), be.to_device(poison((LANES, span)))
    be.kernels.loss.softmax_cross_entropy_lanes(be.to_device(logits), be.to_device(labels), dlogits, row_loss,
                                                row_correct.view, offset, 0.1, loss_scale.view,
                                                be.to_device(cursors), be.to_device(ACTIVE))
    solo = []
    for z in range(LANES):
        outputs = [be.to_device(poison((rows, classes), dtype)), be.to_device(poison(span)),
                   be.to_device(poison(span, np.int32))]
        if ACTIVE[z]:
            lane_scale = be.to_device(state[z, step_state.LOSS_SCALE:][:1])
            be.kernels.loss.softmax_cross_entropy(be.to_device(logits[z]), be.to_device(labels[z]), *outputs,
                                                  offset, 0.1, lane_scale, be.to_device(cursors[z]))
        solo.append([be.to_host(a) for a in outputs])
    check_lanes(be.to_host(dlogits), [s[0] for s in solo], poison(logits.shape, dtype))
    check_lanes(be.to_host(row_loss), [s[1] for s in solo], poison((LANES, span)))
    check_lanes(row_correct.after(), [s[2] for s in solo], poison((LANES, span), np.int32))
    loss_scale.after()


# reduce


def bias_backward_lanes(be, rng, rows, columns, beta, dtype=np.float32):
    """db a lane view of the lanes' gradient slab (K, columns + 20); beta 0 must not read it (NaN there would
    leak)."""
    dy, _ = stored(rng.standard_normal((LANES, rows, columns)).astype(np.float32), dtype)
    width = columns + 20
    slab = poison((LANES, width)) if beta == 0.0 else rng.standard_normal((LANES, width)).astype(np.float32)
    db = Slab(be, slab, 13, (columns,))
    be.kernels.reduce.bias_backward_lanes(be.to_device(dy), db.view, beta)
    solo = []
    for z in range(LANES):
        solo_db = be.to_device(db.lane(z).copy())
        be.kernels.reduce.bias_backward(be.to_device(dy[z]), solo_db, beta)
        solo.append(be.to_host(solo_db))
    same_bits(db.after(), np.stack(solo))


def sum_of_squares_lanes(be, rng, size):
    """x a lane view of the lanes' flat slab; every lane's partials as sum_of_squares writes them."""
    count = be.kernels.reduce.PARTIALS
    x = Slab(be, rng.standard_normal((LANES, size + 13)).astype(np.float32), 5, (size,))
    partials = be.to_device(poison((LANES, count)))
    be.kernels.reduce.sum_of_squares_lanes(x.view, partials)
    solo = []
    for z in range(LANES):
        solo_partials = be.to_device(poison(count))
        be.kernels.reduce.sum_of_squares(be.to_device(x.lane(z).copy()), solo_partials)
        solo.append(be.to_host(solo_partials))
    same_bits(be.to_host(partials), np.stack(solo))
    x.after()


# optim


# per lane: [max_norm, beta1, beta2, dynamic_scaling, growth_factor, backoff_factor, growth_interval]
FINISH_RULES = np.array([[2.0, 0.9, 0.999, 1.0, 2.0, 0.5, 2.0],
                         [0.0, 0.8, 0.99, 0.0, 2.0, 0.5, 1.0],
                         [0.5, 0.8, 0.99, 0.0, 2.0, 0.5, 1.0]])


def finish_step_lanes(be, rng):
    """Three windows (finite, clipped, inf) of finish_step_lanes against finish_step lane by lane, the
    inactive lane's state and grad norms poisoned; grad_norms a lane view of a wider slab."""
    assert len(step_state.LANE_HYPERS) == FINISH_RULES.shape[1]
    count = be.kernels.reduce.PARTIALS
    table = np.stack([np.linspace(1e-3, 1e-4, 5) * (z + 1) for z in range(LANES)])
    state = np.zeros((LANES, step_state.SIZE))
    state[:, step_state.LOSS_SCALE], state[:, step_state.LR_FACTOR] = [1024.0, 1.0, 4.0], 1.0
    state[1] = np.nan
    norms_slab = poison((LANES, 9), np.float64)
    norms_slab[np.flatnonzero(ACTIVE), 3:7] = 0.0
    norms = Slab(be, norms_slab, 3, (4,))
    d_state, d_table, d_active = be.to_device(state), be.to_device(table), be.to_device(ACTIVE)
    solo = [(be.to_device(state[z]), be.to_device(norms.lane(z).copy())) for z in range(LANES)]
    for partial_sum in (4.0 * 1024**2, 900.0 * 1024**2, np.inf):
        partials = rng.uniform(0.0, 1.0, (LANES, count)).astype(np.float32)
        partials[:, 0] = partial_sum
        be.kernels.step_rules.finish_step_lanes(be.to_device(partials), d_state, d_table, norms.view,
                                           be.to_device(FINISH_RULES), d_active)
        for z in np.flatnonzero(ACTIVE):
            max_norm, beta1, beta2, scaling, growth, backoff, interval = FINISH_RULES[z]
            solo_state, solo_norms = solo[z]
            be.kernels.step_rules.finish_step(be.to_device(partials[z]), solo_state, be.to_device(table[z]), solo_norms,
                                         max_norm, beta1, beta2, bool(scaling), growth, backoff, interval)
    check_lanes(be.to_host(d_state), [be.to_host(s[0]) for s in solo], state)
    check_lanes(norms.after(), [be.to_host(s[1]) for s in solo], norms.host[:, 3:7])


# lane 0 clips (its norm read first), lane 1 sits out, lane 2 neither clips nor scales: its norm comes later
LATER_RULES = np.array([[0.5, 0.9, 0.999, 0.0, 2.0, 0.5, 1.0],
                        [0.0, 0.8, 0.99, 0.0, 2.0, 0.5, 1.0],
                        [0.0, 0.8, 0.99, 0.0, 2.0, 0.5, 1.0]])


def later_rules_inputs(be):
    """(the partials' count, the lanes' lr tables, step states and grad-norm records) of the LATER_RULES cases: the
    inactive lane's state NaN and its record poisoned."""
    table = np.stack([np.linspace(1e-3, 1e-4, 5) * (z + 1) for z in range(LANES)])
    state = np.zeros((LANES, step_state.SIZE))
    state[:, step_state.LOSS_SCALE], state[:, step_state.LR_FACTOR] = 1.0, 1.0
    state[1] = np.nan
    norms = poison((LANES, 4), np.float64)
    norms[np.flatnonzero(ACTIVE)] = 0.0
    return be.kernels.reduce.PARTIALS, table, state, norms


def norm_later_lanes(be, rng):
    """finish_step_lanes(norm_later=True) then record_norm_lanes against each lane's own path: finish_step for
    the lane whose norm is read first, prepare_step then record_norm for the lane under step_state.norm_later;
    the inactive lane untouched."""
    count, table, state, norms = later_rules_inputs(be)
    d_state, d_table, d_norms, d_active = (be.to_device(a) for a in (state, table, norms, ACTIVE))
    d_rules = be.to_device(LATER_RULES)
    solo = [(be.to_device(state[z]), be.to_device(norms[z])) for z in range(LANES)]
    rules = be.kernels.step_rules
    for _ in range(3):
        partials = be.to_device(rng.uniform(0.0, 1.0, (LANES, count)).astype(np.float32))
        rules.finish_step_lanes(partials, d_state, d_table, d_norms, d_rules, d_active, norm_later=True)
        rules.record_norm_lanes(partials, d_state, d_norms, d_rules, d_active)
        lane = be.to_host(partials)
        solo_state, solo_norms = solo[0]
        rules.finish_step(be.to_device(lane[0]), solo_state, be.to_device(table[0]), solo_norms, *LATER_RULES[0])
        solo_state, solo_norms = solo[2]
        rules.prepare_step(solo_state, be.to_device(table[2]), *LATER_RULES[2, 1:3])
        rules.record_norm(be.to_device(lane[2]), solo_state, solo_norms)
    check_lanes(be.to_host(d_state), [be.to_host(s[0]) for s in solo], state)
    check_lanes(be.to_host(d_norms), [be.to_host(s[1]) for s in solo], norms)


def adam_step_lanes(be, rng, size=37):
    """A packed Adam step's tail as lane_step launches it, three windows: the squares summed, finish_step_lanes
    (norm_later: the lane whose norm nothing reads first only prepares), adam_update_lanes given partials,
    record_norm_lanes moving the cursors on. Against each lane's own step: finish_step then adam_update for lane 0
    (it clips), prepare_step, adam_update given partials and record_norm for lane 2; the inactive lane untouched,
    the cursors moved for the active lanes only."""
    count, table, state, norms = later_rules_inputs(be)
    param = rng.standard_normal((LANES, size)).astype(np.float32)
    m, v = rng.standard_normal((LANES, size)).astype(np.float32), np.abs(rng.standard_normal((LANES, size)))
    v = v.astype(np.float32)
    cursor = Slab(be, np.arange(LANES * 3, dtype=np.int64).reshape(LANES, 3), 1, (1,))
    lanes = [be.to_device(a) for a in (param, m, v, state, table, norms, LATER_RULES, ACTIVE)]
    d_param, d_m, d_v, d_state, d_table, d_norms, d_rules, d_active = lanes
    d_partials, d_hypers = be.to_device(poison((LANES, count))), be.to_device(np.float32([adam_row(*r) for r in ADAM]))
    solo = [[be.to_device(a[z]) for a in (param, m, v, state, norms)] + [be.to_device(poison(count))]
            for z in range(LANES)]
    k = be.kernels
    for _ in range(3):
        grad = rng.standard_normal((LANES, size)).astype(np.float32)
        d_grad = be.to_device(grad)
        k.reduce.sum_of_squares_lanes(d_grad, d_partials)
        k.step_rules.finish_step_lanes(d_partials, d_state, d_table, d_norms, d_rules, d_active, norm_later=True)
        k.optim.adam_update_lanes(d_param, d_grad, d_m, d_v, d_param, d_state, d_hypers, d_active,
                                  partials=d_partials)
        k.step_rules.record_norm_lanes(d_partials, d_state, d_norms, d_rules, d_active, cursor=cursor.view,
                                       advance=3)
        for z in np.flatnonzero(ACTIVE):
            p, mz, vz, st, nz, partials = solo[z]
            g, solo_table = be.to_device(grad[z]), be.to_device(table[z])
            if z == 0:
                k.reduce.sum_of_squares(g, partials)
                k.step_rules.finish_step(partials, st, solo_table, nz, *LATER_RULES[z])
                k.optim.adam_update(p, g, mz, vz, p, st, *ADAM[z], partials=partials)
            else:
                k.step_rules.prepare_step(st, solo_table, *LATER_RULES[z, 1:3])
                k.optim.adam_update(p, g, mz, vz, p, st, *ADAM[z], partials=partials)
                k.step_rules.record_norm(partials, st, nz)
    for index, (device, before) in enumerate(zip((d_param, d_m, d_v, d_state, d_norms), (param, m, v, state, norms))):
        check_lanes(be.to_host(device), [be.to_host(solo[z][index]) for z in range(LANES)], before)
    partials = be.to_host(d_partials)  # (the squares' launch sums every lane's, the inactive one's too)
    for z in np.flatnonzero(ACTIVE):
        same_bits(partials[z], be.to_host(solo[z][5]))
    same_bits(cursor.after(), np.array([[1 + 9], [4], [7 + 9]], np.int64))


# each lane's solo hyperparameters, and the float32 row its lane update reads (as optimizers.py builds it)
SGD = [(0.0,), (0.5,), (0.01,)]
MOMENTUM = [(0.9, 1e-3, True), (0.5, 0.5, True), (0.8, 0.0, False)]
ADAM = [(0.9, 0.999, 1e-8, 0.01, True), (0.5, 0.5, 0.5, 0.5, False), (0.8, 0.99, 1e-6, 0.1, False)]
STATE_BUFFERS = {"sgd": 0, "momentum": 1, "adam": 2}  # velocity; m and v


def adam_row(beta1, beta2, eps, weight_decay, decoupled):
    return [beta1, beta2, 1.0 - beta1, 1.0 - beta2, eps, weight_decay, float(bool(decoupled) and bool(weight_decay))]


def update_lanes(be, rng, rule, dtype=np.float32, size=37, sums=False):
    """One `<rule>_update_lanes` against `<rule>_update` lane by lane: param a lane view of the lanes' flat
    slab (K, size + 20), the compute copy param itself in fp32, a (K, size) array in fp16 / bf16; the
    inactive lane's state is NaN and every buffer of it must keep its bits. With `sums` (Adam), both given
    `partials`: every active lane's sum of squares the solo update's bits, the inactive lane's row untouched."""
    param = Slab(be, rng.standard_normal((LANES, size + 20)).astype(np.float32), 13, (size,))
    grad = rng.standard_normal((LANES, size)).astype(np.float32)
    extra = [rng.standard_normal((LANES, size)).astype(np.float32) for _ in range(STATE_BUFFERS[rule])]
    if rule == "adam":
        extra[1] = np.abs(extra[1])  # v: a running mean of squares
    rules = {"sgd": SGD, "momentum": MOMENTUM, "adam": ADAM}[rule]
    rows = [adam_row(*r) for r in rules] if rule == "adam" else [[float(v) for v in r] for r in rules]
    state = np.zeros((LANES, step_state.SIZE))
    state[:, step_state.APPLY], state[:, step_state.LR], state[:, step_state.GRAD_MULTIPLIER] = 1.0, 0.05, 0.5
    state[:, step_state.BIAS_CORRECTION1] = [0.1, 0.5, 0.271]
    state[:, step_state.BIAS_CORRECTION2] = [0.0316, 0.5, 0.17]
    state[1] = np.nan
    fp32 = np.dtype(dtype) == np.float32
    compute_host = poison((LANES, size), dtype)
    d_extra = [be.to_device(a) for a in extra]
    compute = param.view if fp32 else be.to_device(compute_host)
    update = getattr(be.kernels.optim, f"{rule}_update")
    count = be.kernels.reduce.PARTIALS
    sums_host = poison((LANES, count))
    summed = {"partials": be.to_device(sums_host)} if sums else {}
    getattr(be.kernels.optim, f"{rule}_update_lanes")(param.view, be.to_device(grad), *d_extra, compute,
                                                      be.to_device(state), be.to_device(np.float32(rows)),
                                                      be.to_device(ACTIVE), **summed)
    solo, solo_sums = [], []
    for z in range(LANES):
        buffers = [be.to_device(param.lane(z).copy())] + [be.to_device(a[z]) for a in extra]
        solo_compute = buffers[0] if fp32 else be.to_device(compute_host[z])
        solo_summed = {"partials": be.to_device(poison(count))} if sums else {}
        if ACTIVE[z]:
            update(buffers[0], be.to_device(grad[z]), *buffers[1:], solo_compute, be.to_device(state[z]), *rules[z],
                   **solo_summed)
        solo.append([be.to_host(a) for a in buffers + ([] if fp32 else [solo_compute])])
        solo_sums.extend(be.to_host(a) for a in solo_summed.values())
    if sums:
        check_lanes(be.to_host(summed["partials"]), solo_sums, sums_host)
    check_lanes(param.after(), [s[0] for s in solo], lane_view(param.host, 13, (size,)))
    for k, (device, host) in enumerate(zip(d_extra, extra)):
        check_lanes(be.to_host(device), [s[1 + k] for s in solo], host)
    if not fp32:
        check_lanes(be.to_host(compute), [s[-1] for s in solo], compute_host)
