"""Packed runs in lanes (mlptrain.packing.lane_group): K MLP sessions built on rows of shared slabs, their
windows launched as one step of every lane.

On the CPU backend a lane's run gives exactly the bits of the same run alone (the lane kernels' NumPy twins run
the solo kernels lane by lane), whether its window goes with the others' or, of another size, with none; a
lane that hands in no window is not touched; a group waits for every lane in training (staggered, for those
inside an epoch). The sweeps and seeds that use the lanes are tested with the packing
(tests/sweep/test_packing.py, tests/cli/test_seeds_cli.py).
"""

import dataclasses
import json
from types import SimpleNamespace

import numpy as np
import pytest

from mlptrain.backends.lanes import lane_view
from mlptrain.config.load import config_from_dict
from mlptrain.data.loader import epoch_order
from mlptrain.training.evaluation import Evaluator
from mlptrain.training.experiment import Resources
from mlptrain.packing import lane_group
from mlptrain.packing.lane_group import LaneWindow, slots
from mlptrain.packing.lane_slabs import LaneBackend, Slabs, lane_signature
from mlptrain.training.window import TrainingWindow
from tests.sweep.conftest import tiny_mnist  # noqa: F401 (a fixture: a small banded MNIST in place of the real one)

TINY = {"backend": "cpu", "model": {"hidden": [16, 8]}, "data": {"val_size": 100},
        "train": {"epochs": 1, "batch_size": 60, "eval_batch_size": 500}}


def tiny(**changes):
    raw = {key: dict(value) if isinstance(value, dict) else value for key, value in TINY.items()}
    for dotted, value in changes.items():
        section, _, key = dotted.rpartition("__")
        (raw.setdefault(section, {}) if section else raw)[key] = value
    return config_from_dict(raw)


def test_a_lane_view_is_a_range_of_columns_of_every_lane():
    slab = np.arange(3 * 20, dtype=np.float32).reshape(3, 20)
    view = lane_view(slab, 5, (2, 3))
    assert view.shape == (3, 2, 3)
    for lane in range(3):
        np.testing.assert_array_equal(view[lane], slab[lane, 5:11].reshape(2, 3))
    view[1, 1, 2] = -1.0  # a view: writes reach the slab
    assert slab[1, 10] == -1.0
    with pytest.raises(ValueError, match="outside a slab of 20"):
        lane_view(slab, 15, (2, 3))


def test_configs_share_lanes_when_they_differ_only_in_what_a_lane_holds():
    base = lane_signature(tiny())
    assert lane_signature(tiny(seed=3, optim__lr=0.01, optim__weight_decay=0.1, train__clip_grad_norm=1.0,
                               schedule__name="cosine")) == base
    assert lane_signature(tiny(optim__name="adamw")) == base  # one update kernel, decoupled decay a lane's flag
    for other in (tiny(model__hidden=[16, 9]), tiny(optim__name="sgd"), tiny(train__epochs=2),
                  tiny(train__batch_size=50), tiny(train__precision="bf16")):
        assert lane_signature(other) != base


def build(config, lanes=2):
    """`lanes` sessions of `config`'s seeds 0, 1, ... built in lanes of one group."""
    resources = Resources()
    group, views = slots(config, resources, lanes)
    sessions = [view.session(dataclasses.replace(config, seed=lane)) for lane, view in enumerate(views)]
    return group, sessions


def test_sessions_built_in_lanes_are_rows_of_one_slab(tiny_mnist):
    group, sessions = build(tiny())
    params = group.slabs.slab_of(sessions[0].model.params.flat)
    assert params.shape == (2, sessions[0].model.layout.size)
    assert all(isinstance(s.window, LaneWindow) for s in sessions)
    for lane, s in enumerate(sessions):
        assert np.shares_memory(s.model.params.flat, params) and np.shares_memory(params[lane], s.model.params.flat)
    assert not np.array_equal(params[0], params[1])  # seeds 0 and 1: each lane its own initialisation


def solo_windows(config, windows):
    """The parameters and step state of `config`'s run alone after `windows` [(start, rows), ...] of epoch 1."""
    s = Resources().session(config)
    s.window.start_epoch(epoch_order(s.train, config.seed, 1))
    for start, rows in windows:
        s.window.run(start, rows)
    return s.model.params.flat.copy(), s.step.state.copy()


def assert_each_lane_as_alone(sessions, plan):
    """Each lane's parameters and step state are its run's alone after its windows of `plan` (lane -> windows)."""
    for lane, s in enumerate(sessions):
        params, state = solo_windows(s.config, plan[lane])
        np.testing.assert_array_equal(s.model.params.flat, params)
        np.testing.assert_array_equal(s.step.state, state)


def test_lanes_in_step_and_out_of_step_give_each_run_its_bits_alone(tiny_mnist):
    config = tiny(optim__lr=0.003)
    group, sessions = build(config)
    for s in sessions:
        s.window.start_epoch(epoch_order(s.train, s.config.seed, 1))
    plan = {0: [(0, 60), (60, 60), (120, 60)], 1: [(0, 60), (60, 30), (90, 60)]}  # lane 1's second window is short
    for turn in range(3):
        for lane, s in enumerate(sessions):
            s.window.run(*plan[lane][turn])
        assert group.ready()
        group.flush()
        assert not group.pending
    assert_each_lane_as_alone(sessions, plan)


def test_lanes_that_clip_beside_lanes_that_do_not_each_get_their_bits_alone(tiny_mnist):
    """Adam's update sums the squares of the lanes whose norm nothing reads first; a lane that clips has its norm
    before: while one does, the group runs the sum of squares first (its plan) and each lane keeps its own path."""
    configs = [tiny(optim__lr=0.003, train__clip_grad_norm=0.05), tiny(optim__lr=0.01, seed=1)]
    resources = Resources()
    group, views = slots(configs[0], resources, 2)
    sessions = [view.session(config) for view, config in zip(views, configs)]
    assert [s.step.norm_later for s in sessions] == [False, True]
    assert group.step.plan  # lane 0 reads its norm before its update
    for s in sessions:
        s.window.start_epoch(epoch_order(s.train, s.config.seed, 1))
    windows = [(0, 60), (60, 60)]
    for start, rows in windows:
        for s in sessions:
            s.window.run(start, rows)
        group.flush()
    for s in sessions:
        params, state = solo_windows(s.config, windows)
        np.testing.assert_array_equal(s.model.params.flat, params)
        np.testing.assert_array_equal(s.step.state, state)
        assert s.step.read()["grad_norm"] > 0.05  # the clipping lane's norm was above its max_norm
    group.leave(0)
    assert not group.step.plan  # no lane left that reads its norm first


def test_a_groups_kernels_are_made_ready_once_for_each_step_plan(tiny_mnist):
    """compile_kernels's work (`make`) runs for the first lane that asks, and again only when the group's step
    launches other kernels (a lane that clips joins); every lane gets the notes of the plan it launches."""
    configs = [tiny(optim__lr=0.003), tiny(optim__lr=0.01, seed=1), tiny(train__clip_grad_norm=1.0, seed=2)]
    group, views = slots(configs[0], Resources(), 3)
    made = []

    def make():
        made.append(group.step.plan)
        return [f"note {len(made)}"]

    sessions = [views[0].session(configs[0]), views[1].session(configs[1])]
    assert [s.window.kernels_made_ready(make) for s in sessions] == [["note 1"]] * 2 and made == [False]
    sessions.append(views[2].session(configs[2]))
    assert sessions[2].window.kernels_made_ready(make) == ["note 2"] and made == [False, True]
    assert sessions[0].window.kernels_made_ready(make) == ["note 2"]  # the plan the group now launches


def _flushed_reads(turns: int):
    """A lockstep group of three lanes, each turn flushed after every lane ran 60 rows: (the sessions, the turn, each
    lane's read copies of the turn's rows)."""
    group, sessions = build(tiny(), lanes=3)
    for s in sessions:
        s.window.start_epoch(epoch_order(s.train, s.config.seed, 1))
    for turn in range(turns):
        for s in sessions:
            s.window.run(60 * turn, 60)
        group.flush()
        yield sessions, turn, [s.window.read_copies(60 * turn, 60 * turn + 60, True) for s in sessions]


def test_the_lanes_reads_after_one_flush_share_one_copy_and_each_gets_its_own_rows(tiny_mnist):
    """A lockstep group's lanes read the same rows after the same flush: one set of copies of every lane's rows and
    step state (the backend copies lane views), each lane given its own, as its window alone would copy them."""
    for sessions, turn, reads in _flushed_reads(2):
        assert len({id(read.copies) for read in reads}) == 1
        for s, read in zip(sessions, reads):
            alone = TrainingWindow.read_copies(s.window, 60 * turn, 60 * turn + 60, True).take()
            for got, want in zip(read.take(), alone):
                np.testing.assert_array_equal(got, want)
        assert not np.array_equal(reads[0].take()[0], reads[1].take()[0])  # each lane its own losses
    assert sessions[0].window.read_copies(0, 60, False).copies is not reads[0].copies  # another read: its own


def test_the_lanes_read_metrics_are_taken_once_a_read_for_every_lane_with_each_lanes_bits(tiny_mnist):
    """A read's loss and accuracy: every lane's taken at once, the first time a lane of the flush asks, and each
    lane's the bits of its rows alone (Evaluator.row_metrics over the lane axis)."""
    calls = []

    def counted(*rows):
        calls.append(rows[0].shape)
        return Evaluator.row_metrics(SimpleNamespace(classifies=True), *rows)

    for sessions, turn, reads in _flushed_reads(2):
        got = [s.window.read_metrics(read, counted) for s, read in zip(sessions, reads)]
        assert calls == [(3, 60)] * (turn + 1)  # once a read, every lane's rows
        for s, read, (loss, acc) in zip(sessions, reads, got):
            alone = s.evaluator.row_metrics(*TrainingWindow.read_copies(s.window, 60 * turn, 60 * turn + 60,
                                                                         True).take()[:2])
            assert (loss, acc) == alone[:2] and type(loss) is float and type(acc) is float
        assert got[0] != got[1]


def test_row_metrics_over_a_lane_axis_are_each_rows_bits_alone():
    """NumPy sums each row of the last axis as it sums that row alone, pairwise, at sizes past its 8,192-element
    blocks too: so every lane's read metrics may be taken at once."""
    rng = np.random.default_rng(5)
    evaluator = SimpleNamespace(classifies=True)
    for shape in [(16, 6400), (3, 1), (5, 4097), (4, 60000), (7, 8193)]:
        losses = (rng.standard_normal(shape) * rng.uniform(0.1, 100, (shape[0], 1)) + 3).astype(np.float32)
        outcomes = rng.integers(0, 2, shape).astype(np.int32)
        loss, acc, _ = Evaluator.row_metrics(evaluator, losses, outcomes)
        for z in range(shape[0]):
            assert (float(loss[z]), float(acc[z])) == Evaluator.row_metrics(evaluator, losses[z], outcomes[z])[:2]


def test_a_lane_that_hands_in_nothing_is_not_touched(tiny_mnist):
    group, sessions = build(tiny(), lanes=3)
    for s in sessions:
        s.window.start_epoch(epoch_order(s.train, s.config.seed, 1))
    group.leave(2)  # its slot ended
    before = sessions[2].model.params.flat.copy(), sessions[2].step.state.copy()
    for s in sessions[:2]:
        s.window.run(0, 60)
    assert group.ready()
    group.flush()
    np.testing.assert_array_equal(sessions[2].model.params.flat, before[0])
    np.testing.assert_array_equal(sessions[2].step.state, before[1])
    assert list(group.step._prefixes) == [2]  # launched over lanes 0 and 1 only: lane 2 costs nothing
    assert not np.array_equal(sessions[0].model.params.flat, solo_windows(sessions[0].config, [])[0])
    group.leave(1)
    lane_1 = sessions[1].model.params.flat.copy()
    sessions[0].window.run(60, 60)
    group.flush()  # lane 0 alone: still launched over two lanes (a one-lane view is another kernel signature)
    assert list(group.step._prefixes) == [2]
    np.testing.assert_array_equal(sessions[1].model.params.flat, lane_1)
    np.testing.assert_array_equal(sessions[0].model.params.flat, solo_windows(sessions[0].config,
                                                                              [(0, 60), (60, 60)])[0])


def test_a_group_waits_for_every_lane_in_training(tiny_mnist):
    group, sessions = build(tiny())
    assert not group.stagger and not group.ready()
    for s in sessions:
        s.window.start_epoch(epoch_order(s.train, s.config.seed, 1))
    sessions[0].window.run(0, 60)
    assert group.waits(0) and not group.waits(1) and not group.ready()
    group.leave(1)
    assert group.ready()


def test_a_lockstep_group_launches_each_lanes_windows_in_order_while_every_lane_has_one(tiny_mnist):
    """A lockstep lane hands in its windows up to its next read at once (LaneWindow.spans): a flush launches a step
    of every lane while each has a window, in the order handed in, and keeps the rest of a lane's for later."""
    config = tiny(optim__lr=0.003)
    group, sessions = build(config)
    assert all(s.window.spans for s in sessions)
    for s in sessions:
        s.window.start_epoch(epoch_order(s.train, s.config.seed, 1))
    plan = {0: [(0, 60), (60, 60), (120, 60)], 1: [(0, 60), (60, 30)]}
    for lane, s in enumerate(sessions):
        for window in plan[lane]:
            s.window.run(*window)
    flushes = group.flushes
    group.flush()  # two steps: lane 1 has no third window
    assert group.flushes == flushes + 1
    assert group.waits(0) and not group.waits(1) and not group.ready()
    assert [s.window.cursor_at for s in sessions] == [120, 90]
    sessions[1].window.run(90, 60)
    plan[1].append((90, 60))
    assert group.ready()
    group.flush()
    assert not group.pending
    assert_each_lane_as_alone(sessions, plan)


def test_a_lockstep_lanes_loop_yields_once_a_read_and_its_runs_keep_their_bits(tiny_mnist, tmp_path):
    """Packed in lockstep, each run's loop hands in its windows from one read to the next and yields once
    (training.loop.window_spans): the group flushes once a read, and each run's results are those of its run alone."""
    from mlptrain.seeds.runner import run_seeds
    from mlptrain.training.checkpoint import load_checkpoint

    config = tiny(train__epochs=2, train__log_every=3)
    flushes = []
    real = lane_group.LaneGroup.flush

    def counted(self, stop=None):
        flushes.append(sum(len(windows) for windows in self.pending.values()))
        real(self, stop)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lane_group.LaneGroup, "flush", counted)
        run_seeds(config, [0, 1], tmp_path, "packed", "tiny", Resources(), pack=2)
    run_seeds(config, [0, 1], tmp_path, "alone", "tiny", Resources())
    windows = -(-Resources().session(config).train.size // 60)
    assert len(flushes) == 2 * -(-windows // 3)  # a flush a read, each epoch's last included
    assert max(flushes) == 2 * 3  # three windows of each lane's at a flush
    for seed in (0, 1):
        packed, alone = (load_checkpoint(tmp_path / group / f"seed-{seed}" / "checkpoints" / "last.npz")
                         for group in ("packed", "alone"))
        for key in (key for key in alone if not key.startswith("meta/")):  # the meta: wall times, the run's name
            np.testing.assert_array_equal(packed[key], alone[key], err_msg=key)


def test_a_stop_asked_while_the_lanes_step_lands_after_that_step(tiny_mnist, tmp_path, monkeypatch):
    """A stop asked while the group launches the lanes' windows handed in up to their next read: the group
    launches no more, each lane takes back the rest (LaneWindow.withdraw), and its `last` checkpoint is at the step
    the stop was asked in, with the bits of lanes that handed in a window at a time (a read a step)."""
    import signal

    from mlptrain.errors import TrainingInterrupted
    from mlptrain.seeds.runner import run_seeds
    from mlptrain.training.checkpoint import load_checkpoint

    real = lane_group.LaneGroup._step

    def stopped(log_every):
        stop, steps = SimpleNamespace(signum=0), []

        def stopping_at_step_two(self):
            real(self)
            steps.append(self.flushes)
            if len(steps) == 2:
                stop.signum = signal.SIGINT  # as Ctrl-C while the second step is launched

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(lane_group.LaneGroup, "_step", stopping_at_step_two)
            with pytest.raises(TrainingInterrupted):
                run_seeds(tiny(train__epochs=2, train__log_every=log_every), [0, 1], tmp_path, f"every-{log_every}",
                          "tiny", Resources(), stop=stop, pack=2)
        assert len(steps) == 2 and steps == ([0, 0] if log_every > 2 else [0, 1])  # one flush, or a flush a step
        lasts = [load_checkpoint(tmp_path / f"every-{log_every}" / f"seed-{seed}" / "checkpoints" / "last.npz")
                 for seed in (0, 1)]
        assert all((int(last["meta/epoch"]), int(last["meta/window"])) == (0, 2) for last in lasts)
        return lasts

    for spans, steps in zip(stopped(3), stopped(1)):
        keys = [key for key in steps if not key.startswith("meta/")]  # the meta: wall times, the config
        assert keys and sorted(keys) == sorted(key for key in spans if not key.startswith("meta/"))
        for key in keys:
            np.testing.assert_array_equal(spans[key], steps[key], err_msg=key)


def test_a_staggered_groups_gemms_take_the_tile_of_all_its_lanes(tiny_mnist, monkeypatch):
    """Which lanes a staggered group launches follows the host's timing: its GEMMs take the tile chosen for all K
    lanes, so that a lane's sums never depend on it; in lockstep, the tile of the lanes launched, as before."""
    group, _ = build(tiny(), lanes=3)
    assert group.step.tiles_for is None
    monkeypatch.setattr(lane_group, "STAGGER", True)
    group, _ = build(tiny(), lanes=3)
    assert group.stagger and group.step.tiles_for == 3


def test_a_staggered_group_waits_for_every_lane_inside_an_epoch(tiny_mnist):
    group, sessions = build(tiny(), lanes=3)
    group.stagger = True
    assert not group.ready()
    for s in sessions:
        s.window.start_epoch(epoch_order(s.train, s.config.seed, 1))
    sessions[0].window.run(0, 60)  # lanes 1 and 2 have handed in nothing yet: not due, the group goes on
    assert group.waits(0) and not group.waits(1) and group.ready()
    group.flush()
    sessions[1].window.run(0, 60)
    assert not group.ready()  # lane 0 is inside its epoch: due
    sessions[0].window.run(60, 60)
    assert group.ready()
    group.flush()
    size = sessions[2].train.size
    sessions[2].window.run(size - 60, 60)  # the last window of its epoch (out of order: a cursor of its own)
    sessions[0].window.run(120, 60)
    assert not group.ready()  # lane 1 is due
    group.leave(1)  # its run ended
    assert group.ready()
    group.flush()
    assert group.due == {0}  # lane 2's epoch ends: the group steps on without it until it hands in the next


def test_an_autoencoder_packs_side_by_side_and_says_why(capsys):
    config = config_from_dict({"backend": "cpu", "model": {"type": "conv_autoencoder"}, "data": {"dataset": "cifar10"}})
    group, views = slots(config, Resources(), 2)
    assert group is None and len(views) == 2
    out = capsys.readouterr()
    assert "side by side" in out.out + out.err and "MLPs only" in out.out + out.err


@pytest.mark.parametrize("kind", ["cuda", "cpu"])
def test_a_float32_vectors_lanes_start_16_bytes_apart_on_the_gpu(kind):
    """On the CUDA backend the rows of a float32 vector (parameters, gradients, optimizer state) are padded to
    whole 16 bytes, so a layer's weights in every lane are 16-byte aligned wherever a trial's own would be (the
    tf32x3 engine's staging reads them 16 bytes a load); the slab is the lane view of the rows without the padding.
    Other buffers, and every buffer on the CPU, are rows of one C-contiguous slab as before."""

    class Backend:
        name = kind

        def zeros(self, shape, dtype):
            return np.zeros(shape, dtype)

    slabs = Slabs(Backend(), 3)
    rows = [slabs.row(lane, 0, 10, np.float32) for lane in range(3)]
    slab = slabs.slab_of(rows[1])
    assert slab.shape == (3, 10) and slab.strides == ((48 if kind == "cuda" else 40), 4)
    for lane, row in enumerate(rows):
        assert row.shape == (10,) and row.flags.c_contiguous and np.shares_memory(row, slab[lane])
        row[:] = lane + 1
    np.testing.assert_array_equal(slab, np.repeat([[1.0], [2.0], [3.0]], 10, axis=1))
    for index, (shape, dtype) in enumerate([(12, np.float32), (10, np.float64), (10, np.int32), ((2, 5), np.float32)],
                                           start=1):
        slabs.row(0, index, shape, dtype)
        assert slabs.arrays[index].flags.c_contiguous  # already whole 16 bytes, or not a float32 vector


@pytest.mark.parametrize("kind", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_lanes_zeroed_buffers_are_zero_where_a_lane_was_used_before(kind):
    """A session built again in a lane (its next trial) gets zeroed rows, set on the device, the other lanes'
    rows untouched (padded float32 vectors on CUDA, other buffers too)."""
    from mlptrain.backends.cpu import CpuBackend
    from mlptrain.backends.cuda import CudaBackend

    shared = CpuBackend() if kind == "cpu" else CudaBackend()
    slabs = Slabs(shared, 3)
    lanes = [LaneBackend(shared, slabs, lane) for lane in range(3)]
    shapes = [((10,), np.float32), ((2, 5), np.float32), ((7,), np.float64)]
    for round_ in range(2):
        for lane in lanes:
            with lane.building():
                rows = [lane.zeros(shape, dtype) for shape, dtype in shapes]
            for row, (shape, dtype) in zip(rows, shapes):
                np.testing.assert_array_equal(shared.to_host(row), np.zeros(shape, dtype))
                shared.copy_from_host(row, np.full(shape, lane.lane + 1 + round_, dtype))
    for index, (shape, dtype) in enumerate(shapes):
        for lane in range(3):
            np.testing.assert_array_equal(shared.to_host(slabs.arrays[index][lane]), np.full(shape, lane + 2, dtype))


def test_a_new_groups_lanes_make_no_memsets_of_their_own():
    """Rows never handed out are zero as their slab was allocated: a new group's lanes build with no memset, and a
    lane built again (its next trial) zeroes its own rows alone."""
    from mlptrain.backends.cpu import CpuBackend

    shared, zeroed = CpuBackend(), []
    memset = shared.zero
    shared.zero = lambda array: (zeroed.append(array.shape), memset(array))
    slabs = Slabs(shared, 3)
    lanes = [LaneBackend(shared, slabs, lane) for lane in range(3)]
    shapes = [((10,), np.float32), ((2, 5), np.float32)]

    def build(lane):
        with lane.building():
            rows = [lane.zeros(shape, np.float32) for shape, _ in shapes] + [lane.empty((3,), np.float32)]
        for row, (shape, dtype) in zip(rows, shapes):
            np.testing.assert_array_equal(row, np.zeros(shape, dtype))
        for row in rows:
            row[...] = lane.lane + 1
        return rows

    for lane in lanes:
        build(lane)
    assert zeroed == []
    build(lanes[1])
    assert zeroed == [(10,), (2, 5)]
    for index in range(len(shapes)):
        for lane in range(3):
            assert (slabs.arrays[index][lane] == lane + 1).all()


def test_a_lanes_evaluation_leaves_the_shared_stream_alone():
    """A lane's `urgent` block (its evaluation, which yields to the other lanes inside it) must not switch the
    stream the lanes share: the backend's own `urgent` would, for every lane at once."""
    from mlptrain.packing.lane_slabs import LaneBackend, Slabs

    class Switching:
        stream = "home"

        def urgent(self):
            raise AssertionError("the shared backend's urgent() was entered")

    shared = Switching()
    lane = LaneBackend(shared, Slabs(shared, 2), 0)
    with lane.urgent("mark"):
        assert shared.stream == "home"


def test_a_staggered_lanes_evaluation_overtakes_on_a_copy_of_the_shared_backend(monkeypatch):
    """In a staggered group a lane's `urgent` block goes ahead of the other lanes' queued steps: its work on a
    copy of the shared backend (`overtaking`, waiting for the lane's own mark alone), the shared backend and
    every other lane untouched, and the shared stream made to wait for the block's work when it ends."""
    from mlptrain.packing import lane_slabs
    from mlptrain.packing.lane_slabs import LaneBackend, Slabs

    class Shared:
        stream = "home"

        def __init__(self):
            self.calls = []

        def overtaking(self, after):
            self.calls.append(("overtaking", after))
            view = Shared()
            view.stream = "side"
            return view

        def rejoin(self, view):
            self.calls.append(("rejoin", view.stream))

    launches = []  # the thread's launch stream, as the block switches it
    monkeypatch.setattr(lane_slabs, "use_launch_stream", launches.append)
    monkeypatch.setattr(lane_slabs, "launch_stream", lambda: "before")
    shared = Shared()
    lane = LaneBackend(shared, Slabs(shared, 2), 0, overtake=True)
    other = LaneBackend(shared, Slabs(shared, 2), 1, overtake=True)
    with lane.urgent("lane 0's last step"):
        assert lane.stream == "side" and other.stream == "home" and shared.stream == "home"
    assert lane.stream == "home"
    assert shared.calls == [("overtaking", "lane 0's last step"), ("rejoin", "side")]
    assert launches == ["side", "before"]
    in_lockstep = LaneBackend(shared, Slabs(shared, 2), 0)
    with in_lockstep.urgent("mark"):
        assert in_lockstep.stream == "home"
    assert len(shared.calls) == 2


def test_a_pack_larger_than_the_memory_holds_gets_the_lanes_that_fit(tiny_mnist, monkeypatch, capsys):
    from mlptrain.backends.cpu import CpuBackend

    monkeypatch.setattr(CpuBackend, "free_bytes", lambda self: 10 * 2**20)  # 10 MiB free
    config = tiny()
    group, views = slots(config, Resources(), 64)
    out = capsys.readouterr()
    assert group is not None and 1 < group.lanes < 64 and len(views) == group.lanes
    assert f"packing: {group.lanes} lanes, not 64" in out.out + out.err


@pytest.mark.real_gpu
def test_staggered_lanes_on_the_gpu_give_the_bits_of_lockstep(tmp_path, data_dir, monkeypatch):
    """On the GPU a staggered group (its lanes' epoch ends apart, each lane's evaluation ahead of the others'
    queued steps on the urgent stream) gives every lane the bits lockstep gives, run after run: its GEMMs take
    the tile of all K lanes, which lockstep launching all K takes too, and a lane's evaluation reads only its own
    rows, which the others' steps leave alone."""
    from mlptrain.config.load import load_config
    from mlptrain.seeds.runner import run_seeds
    from tests.cli.test_cli import REPO

    monkeypatch.setenv("MLPTRAIN_DATA_DIR", str(data_dir))
    config = load_config(REPO / "configs" / "adam_mnist.yaml",
                         ["backend=cuda", "train.epochs=2", "model.hidden=[64]", "data.val_size=1000",
                          "train.batch_size=256", "train.checkpoint_every_epochs=2"])
    groups = []
    for name, stagger in (("lockstep", False), ("staggered", True), ("staggered-again", True)):
        monkeypatch.setattr(lane_group, "STAGGER", stagger)
        group, record = run_seeds(config, [0, 1, 2], tmp_path, name, "adam_mnist", Resources(), pack=3)
        assert record["seeds"] == [0, 1, 2]
        groups.append(group)
    for seed in (0, 1, 2):
        runs = [json.loads((g / f"seed-{seed}" / "summary.json").read_text()) for g in groups]
        assert runs[0]["lanes"] == {"of": 3, "lane": seed, "gemm": "fma"}
        assert len({json.dumps({k: runs[i][k] for k in ("val_acc", "val_loss", "test_acc", "test_loss")})
                    for i in range(3)}) == 1
        checkpoints = [np.load(g / f"seed-{seed}" / "checkpoints" / "last.npz") for g in groups]
        for key in checkpoints[0].files:
            if not key.startswith("meta/"):
                for other in checkpoints[1:]:
                    np.testing.assert_array_equal(checkpoints[0][key], other[key], err_msg=f"seed {seed} {key}")



@pytest.mark.real_gpu
def test_a_lanes_test_split_captured_ahead_gives_the_launches_bits_on_the_gpu(tmp_path, data_dir, monkeypatch):
    """On the GPU each lane's test split, captured while the group trains (Evaluator.capture_ahead) and replayed
    at the run's end, gives the test metrics of launching it batch by batch there, and the group's capture is
    replayed, not launched."""
    from mlptrain.config.load import load_config
    from mlptrain.seeds.runner import run_seeds
    from mlptrain.training.evaluation import Evaluator
    from tests.cli.test_cli import REPO

    monkeypatch.setenv("MLPTRAIN_DATA_DIR", str(data_dir))
    config = load_config(REPO / "configs" / "adam_mnist.yaml",
                         ["backend=cuda", "train.epochs=2", "model.hidden=[64]", "data.val_size=1000",
                          "train.batch_size=256", "train.checkpoint_every_epochs=2"])
    replayed, launch_split = [], Evaluator.launch_split

    def noting(self, split):
        entry = (self.graphs or {}).get(next((key for key in (self.graphs or {}) if key[0] == id(split)), None))
        replayed.append(entry is not None and entry.graph is not None and entry.passes == 0)
        launch_split(self, split)

    monkeypatch.setattr(Evaluator, "launch_split", noting)
    ahead, _ = run_seeds(config, [0, 1, 2], tmp_path, "ahead", "adam_mnist", Resources(), pack=3)
    assert replayed.count(True) == 3  # each lane's test pass, at its end
    monkeypatch.setattr(Evaluator, "capture_ahead", lambda self, split: None)
    launched, _ = run_seeds(config, [0, 1, 2], tmp_path, "launched", "adam_mnist", Resources(), pack=3)
    for seed in (0, 1, 2):
        runs = [json.loads((g / f"seed-{seed}" / "summary.json").read_text()) for g in (ahead, launched)]
        assert {k: runs[0][k] for k in ("test_acc", "test_loss", "val_loss")} == \
            {k: runs[1][k] for k in ("test_acc", "test_loss", "val_loss")}


def test_a_lanes_deferred_epoch_record_is_written_before_a_later_error(tiny_mnist, tmp_path, monkeypatch):
    """A lane logs an epoch that is not its last during the next one's reads (training.queued_end.logs_later); a run
    that fails before that still has the epoch's record in metrics.jsonl, as when it was logged at once."""
    from mlptrain.errors import TrainingDiverged
    from mlptrain.seeds.runner import run_seeds
    from mlptrain.training.monitor import TrainingMonitor

    real = TrainingMonitor.__call__

    def diverging_in_epoch_two(self, read):
        if read["epoch"] == 2:
            raise TrainingDiverged("the training loss became nan (injected)")
        real(self, read)

    monkeypatch.setattr(TrainingMonitor, "__call__", diverging_in_epoch_two)
    config = tiny(train__epochs=3, train__checkpoint_every_epochs=3, train__log_every=2)
    with pytest.raises(TrainingDiverged, match="injected"):
        run_seeds(config, [0, 1], tmp_path, "g", "tiny", Resources(), pack=2)
    for seed in (0, 1):
        lines = (tmp_path / "g" / f"seed-{seed}" / "metrics.jsonl").read_text().splitlines()
        assert [json.loads(line)["epoch"] for line in lines] == [1]


def test_a_stop_after_a_lanes_epoch_writes_its_record_before_its_checkpoint(tiny_mnist, tmp_path, monkeypatch):
    """A stop asked at a lane's epoch end whose record waits for the next epoch (training.queued_end.logs_later):
    the record is written, then the checkpoint the stop writes, so a resume finds the epoch's record."""
    import signal
    from types import SimpleNamespace

    from mlptrain.errors import TrainingInterrupted
    from mlptrain.seeds.runner import run_seeds
    from mlptrain.training import loop
    from mlptrain.training.checkpoint import load_checkpoint

    stop, real = SimpleNamespace(signum=0), loop._after_evaluation

    def stopping_after_epoch_one(s, run_dir, record, best, *copies):
        result = real(s, run_dir, record, best, *copies)
        stop.signum = signal.SIGINT  # as Ctrl-C right after the epoch's evaluation
        return result

    monkeypatch.setattr(loop, "_after_evaluation", stopping_after_epoch_one)
    config = tiny(train__epochs=3, train__checkpoint_every_epochs=3, train__log_every=2)
    with pytest.raises(TrainingInterrupted):
        run_seeds(config, [0, 1], tmp_path, "g", "tiny", Resources(), stop=stop, pack=2)
    for seed in (0, 1):
        run = tmp_path / "g" / f"seed-{seed}"
        lines = (run / "metrics.jsonl").read_text().splitlines()
        assert [json.loads(line)["epoch"] for line in lines] == [1]
        assert int(load_checkpoint(run / "checkpoints" / "last.npz")["meta/epoch"]) == 1


def test_sixteen_float32_lanes_or_more_sum_their_gemms_on_tensor_cores():
    from mlptrain.packing.lane_step import TF32_LANES, gemm_engine

    assert gemm_engine("cuda", np.float32, TF32_LANES) == gemm_engine("cuda", np.float32, 64) == "tf32x3"
    assert gemm_engine("cuda", np.float32, TF32_LANES - 1) == "fma"
    assert gemm_engine("cuda", np.uint16, 64) == gemm_engine("cuda", np.float16, 64) == "fma"  # 16-bit storage
    assert gemm_engine("cpu", np.float32, 64) == "fma"  # BLAS either way: the record says what ran
    assert gemm_engine("cuda", np.float32, 64, tensor_cores=False) == "fma"  # a GPU before compute capability 8.0


def test_a_pass_takes_tf32x3_where_its_tiles_fill_a_wave():
    from mlptrain.packing.lane_step import tf32x3_fills

    tile = (64, 64, 2, 2, 16)
    assert tf32x3_fills(128, 512, 16, tile)  # 2 x 8 tiles a lane: a hidden layer's forward of 16 lanes
    assert tf32x3_fills(784, 512, 2, tile) and not tf32x3_fills(784, 512, 1, tile)  # 13 x 8 tiles a lane
    assert not tf32x3_fills(128, 10, 16, tile)  # 2 tiles a lane, K = 512 each: the output layer's forward
    assert not tf32x3_fills(128, 512, 7, tile)


@pytest.mark.real_gpu
def test_lanes_on_tensor_cores_stay_within_float32_rounding_of_cuda_cores(tmp_path, data_dir, monkeypatch):
    """16 float32 lanes sum their GEMMs on the tf32x3 engine, the same lanes with fewer than TF32_LANES on CUDA
    cores: the bits differ, the learning not. After an epoch (231 steps) every seed's validation loss is within 2%
    of the other engine's (0.29% the most seen, on an H200: rounding grown over the steps), and its accuracy within
    half a point."""
    from mlptrain.config.load import load_config
    from mlptrain.packing import lane_step
    from mlptrain.seeds.runner import run_seeds
    from tests.cli.test_cli import REPO

    monkeypatch.setenv("MLPTRAIN_DATA_DIR", str(data_dir))
    config = load_config(REPO / "configs" / "adam_mnist.yaml",
                         ["backend=cuda", "train.epochs=1", "model.hidden=[64]", "data.val_size=1000",
                          "train.batch_size=256"])
    seeds = list(range(16))
    groups = []
    for name, from_lanes in (("tensor-cores", 16), ("cuda-cores", 17)):
        monkeypatch.setattr(lane_step, "TF32_LANES", from_lanes)
        groups.append(run_seeds(config, seeds, tmp_path, name, "adam_mnist", Resources(), pack=16)[0])
    for seed in seeds:
        tensor, cuda = (json.loads((g / f"seed-{seed}" / "summary.json").read_text()) for g in groups)
        assert tensor["lanes"]["gemm"] == "tf32x3" and cuda["lanes"]["gemm"] == "fma"
        assert abs(tensor["val_loss"] - cuda["val_loss"]) <= 0.02 * cuda["val_loss"], (seed, tensor, cuda)
        assert abs(tensor["val_acc"] - cuda["val_acc"]) <= 0.005, (seed, tensor, cuda)


@pytest.mark.real_gpu
@pytest.mark.parametrize("engines, lanes", [(("fma",), 2), (("tf32x3",), 16)])
def test_lanes_updating_their_hidden_layers_in_the_gradients_epilogue_keep_their_bits(tmp_path, data_dir, monkeypatch,
                                                                                     engines, lanes):
    """The hidden layers' update in their weight gradients' epilogue (lane_step.EPILOGUE_UPDATE, off by default;
    forced on CUDA cores for 2 lanes, where both hidden layers fuse, and on tf32x3 for 16) gives every seed's
    parameters and optimizer state the bits of the one update after the backward; the recorded gradient norms,
    summed in another order, stay within rounding."""
    from mlptrain.backends.numba_kernels import gemm_update
    from mlptrain.config.load import load_config
    from mlptrain.packing import lane_step
    from mlptrain.seeds.runner import run_seeds
    from tests.cli.test_cli import REPO

    monkeypatch.setenv("MLPTRAIN_DATA_DIR", str(data_dir))
    config = load_config(REPO / "configs" / "adam_mnist.yaml",
                         ["backend=cuda", "train.epochs=1", "model.hidden=[64, 32]", "data.val_size=1000",
                          "train.batch_size=256", "train.cuda_graphs=false"])
    fused, launch = [], gemm_update.linear_backward_weight_bias_update
    monkeypatch.setattr(gemm_update, "linear_backward_weight_bias_update", lambda *a: fused.append(1) or launch(*a))
    groups = []
    for name, on in (("epilogue", engines), ("apart", ())):
        monkeypatch.setattr(lane_step, "EPILOGUE_UPDATE", on)
        before = len(fused)
        groups.append(run_seeds(config, list(range(lanes)), tmp_path, name, "adam_mnist", Resources(), pack=lanes)[0])
        assert (len(fused) > before) == bool(on)
    for seed in range(lanes):
        checkpoints = [np.load(g / f"seed-{seed}" / "checkpoints" / "last.npz") for g in groups]
        for key in checkpoints[0].files:
            if key.startswith(("params/", "optim/")):
                np.testing.assert_array_equal(checkpoints[0][key], checkpoints[1][key], err_msg=f"seed {seed} {key}")
        norms = [np.load(g / f"seed-{seed}" / "grad_norms.npy") for g in groups]
        assert len(norms[0]) > 0
        np.testing.assert_allclose(norms[0], norms[1], rtol=1e-5)


def test_a_lanes_session_checks_the_free_memory_only_before_the_slabs_exist(monkeypatch):
    """The first session of a group allocates every lane's rows (lane_group checked that K lanes fit first); the
    later lanes' sessions allocate nothing new, so check_fits has no device memory of theirs to check."""
    from mlptrain.backends.cpu import CpuBackend

    monkeypatch.setattr(CpuBackend, "free_bytes", lambda self: 123)
    slabs = Slabs(CpuBackend(), 4)
    first, later = LaneBackend(slabs.backend, slabs, 0), LaneBackend(slabs.backend, slabs, 3)
    assert first.free_bytes() == 123 and later.free_bytes() == 123
    with first.building():
        first.zeros((5,))
    assert later.free_bytes() is None and first.free_bytes() is None
