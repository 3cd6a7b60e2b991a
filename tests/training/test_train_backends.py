"""The training loop on both backends: the CUDA graph (on the simulator in CI, on the GPU when
present) must follow the NumPy graph step for step on a tiny synthetic dataset."""

import numpy as np
import pytest

from mlptrain.backends.cpu import CpuBackend
from mlptrain.backends.cuda import CudaBackend
from mlptrain.config.load import config_from_dict
from mlptrain.data.dataset import ImageDataset
from mlptrain.training.compilation import compile_kernels
from mlptrain.training.loop import train_epoch
from mlptrain.training.session import build_session
from mlptrain.util.console import console
from tests.conftest import ON_SIMULATOR

OPTIMIZERS = [{"name": "sgd", "lr": 0.1}, {"name": "momentum", "lr": 0.05},
              {"name": "adamw", "lr": 0.01, "weight_decay": 0.1}]


def tiny_dataset(rng, features=10, classes=3, train=40, test=9):
    def images(n):
        return rng.integers(0, 256, (n, features), dtype=np.uint8)

    return ImageDataset(name="tiny", train_images=images(train),
                        train_labels=rng.integers(0, classes, train, dtype=np.uint8),
                        test_images=images(test), test_labels=rng.integers(0, classes, test, dtype=np.uint8),
                        image_shape=(1, 1, features), num_classes=classes, mean=0.5, std=0.25)


def one_epoch_on_both_backends(config, dataset):
    """[(parameters, metric reads, validation (loss, acc))] after one epoch on the NumPy, then the CUDA backend."""
    results = []
    for backend in (CpuBackend(), CudaBackend()):
        session = build_session(config, backend, dataset)
        reads = []
        train_epoch(session, 1, reads.append)
        results.append((session.model.params.to_host_dict(), reads, session.evaluator.evaluate(session.val)))
    return results


def assert_one_epoch_is_bitwise_repeatable_on_the_gpu(config, dataset):
    """Two sessions with one seed, one epoch each on the CUDA backend: every parameter bit equal."""
    runs = []
    for _ in range(2):
        session = build_session(config, CudaBackend(), dataset)
        train_epoch(session, 1, lambda window: None)
        runs.append(session.model.params.to_host_dict())
    for name in runs[0]:
        np.testing.assert_array_equal(runs[0][name], runs[1][name], err_msg=name)


@pytest.mark.gpu
# the simulator takes ~25 s per case: it checks the wiring once; the optimizer kernels have their own tests
@pytest.mark.parametrize("optim", OPTIMIZERS[-1:] if ON_SIMULATOR else OPTIMIZERS)
def test_cuda_graph_matches_numpy_graph(rng, optim):
    dataset = tiny_dataset(rng)
    config = config_from_dict({"seed": 3, "data": {"val_size": 7}, "model": {"hidden": [6, 5]}, "optim": optim,
                               "train": {"batch_size": 8, "eval_batch_size": 4, "log_every": 2}})
    (cpu_params, cpu_reads, cpu_eval), (gpu_params, gpu_reads, gpu_eval) = one_epoch_on_both_backends(config, dataset)
    for name in cpu_params:
        np.testing.assert_allclose(gpu_params[name], cpu_params[name], rtol=1e-4, atol=1e-5, err_msg=name)
    assert [r["step"] for r in gpu_reads] == [r["step"] for r in cpu_reads] == [2, 4, 5]
    np.testing.assert_allclose([r["loss"] for r in gpu_reads], [r["loss"] for r in cpu_reads], rtol=1e-4)
    np.testing.assert_allclose(gpu_eval, cpu_eval, rtol=1e-4)


@pytest.mark.real_gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_mixed_precision_graphs_agree_on_the_gpu(rng, precision):
    """fp16 / bf16 with accumulation and clipping: the backends round the same float32 sums, summed in
    different orders, so they agree to the format's precision, not to float32's."""
    dataset = tiny_dataset(rng, features=64, classes=10, train=600, test=50)
    config = config_from_dict({"seed": 3, "data": {"val_size": 50}, "model": {"hidden": [32]},
                               "optim": {"name": "adamw", "lr": 1e-3, "weight_decay": 0.1},
                               "train": {"batch_size": 16, "grad_accum_steps": 3, "clip_grad_norm": 0.5,
                                         "precision": precision}})
    results = []
    for backend in (CpuBackend(), CudaBackend()):
        session = build_session(config, backend, dataset)
        reads = []
        train_epoch(session, 1, reads.append)
        results.append((session.model.params.to_host_dict(), reads))
    (cpu_params, cpu_reads), (gpu_params, gpu_reads) = results
    assert [r["step"] for r in gpu_reads] == [r["step"] for r in cpu_reads]
    for name in cpu_params:
        np.testing.assert_allclose(gpu_params[name], cpu_params[name], rtol=0.05, atol=2e-3, err_msg=name)


@pytest.mark.real_gpu
def test_same_seed_gives_bitwise_identical_runs_on_the_gpu(rng):
    dataset = tiny_dataset(rng, features=784, classes=10, train=3000, test=500)
    config = config_from_dict({"seed": 5, "data": {"val_size": 500}, "model": {"hidden": [512, 512]},
                               "train": {"batch_size": 128}})
    assert_one_epoch_is_bitwise_repeatable_on_the_gpu(config, dataset)


GRAPH_CASES = {
    # accumulation over 3 micro-batches, and a partial last window in every epoch (each case has one: launched one
    # by one in the first epoch, then captured as a graph of its own and replayed in the next two)
    "mlp-fp32-accum": ({"model": {"hidden": [64, 32]}, "optim": {"name": "adamw", "lr": 1e-3, "weight_decay": 0.1},
                        "train": {"batch_size": 16, "grad_accum_steps": 3, "clip_grad_norm": 0.5}}, 64),
    "mlp-fp16": ({"model": {"hidden": [64]}, "train": {"batch_size": 32, "precision": "fp16"}}, 64),
    "autoencoder-bf16": ({"data": {"dataset": "cifar10", "val_size": 8}, "model": {"type": "conv_autoencoder", "channels": [8, 4]},
                          "train": {"batch_size": 8, "precision": "bf16"}}, None),
}


@pytest.mark.real_gpu
@pytest.mark.parametrize("case", GRAPH_CASES)
def test_graph_replay_is_bitwise_the_launches_it_captured(rng, case):
    """Three epochs with full windows replayed from one CUDA graph (and partial ones from their own) against the
    same three epochs launched one by one: every parameter, optimizer and step-state bit and every metric read
    equal, and the graphs used.
    The validation passes after each epoch too: launched after the first (no compile_kernels here: a capture then
    would load kernels), captured and replayed after the second and third, every row's result equal to the
    launches'."""
    options, features = GRAPH_CASES[case]
    if features is None:
        dataset = ImageDataset(name="tiny-rgb", train_images=rng.integers(0, 256, (90, 8 * 8 * 3), dtype=np.uint8),
                               train_labels=rng.integers(0, 10, 90, dtype=np.uint8),
                               test_images=rng.integers(0, 256, (10, 8 * 8 * 3), dtype=np.uint8),
                               test_labels=rng.integers(0, 10, 10, dtype=np.uint8),
                               image_shape=(3, 8, 8), num_classes=10, mean=0.5, std=0.25)
    else:
        dataset = tiny_dataset(rng, features=features, classes=10, train=700, test=50)
    runs = []
    for graphs in (True, False):
        config = config_from_dict({"seed": 7, "data": {"val_size": 50}, **options,
                                   "train": {**options["train"], "log_every": 3, "cuda_graphs": graphs}})
        session = build_session(config, CudaBackend(), dataset)
        reads, passes = [], []
        for epoch in (1, 2, 3):
            train_epoch(session, epoch, reads.append)
            loss, acc, rows = session.evaluator.evaluate_rows(session.val)
            passes.append((loss, acc, rows, session.backend.to_host(session.evaluator.row_loss)[:session.val.size]))
        assert (session.window.graph is not None) == graphs
        partial = session.window.partial
        assert (partial is not None and partial[1] is not None) == graphs
        assert [e.graph is not None for e in (session.evaluator.graphs or {}).values()] == ([True] if graphs else [])
        runs.append(({**session.model.params.to_host_dict(), **session.step.state_dict()},
                     [(r["step"], r["loss"], r["grad_norm"]) for r in reads], passes))
    (arrays, reads, passes), (eager_arrays, eager_reads, eager_passes) = runs
    for name in eager_arrays:
        np.testing.assert_array_equal(arrays[name], eager_arrays[name], err_msg=name)
    assert reads == eager_reads and len(reads) > 4
    for (loss, acc, rows, row_loss), (eager_loss, eager_acc, eager_rows, eager_row_loss) in zip(passes, eager_passes):
        assert (loss, acc) == (eager_loss, eager_acc) or np.isnan(acc) and loss == eager_loss
        np.testing.assert_array_equal(row_loss, eager_row_loss)
        if rows is not None:
            np.testing.assert_array_equal(rows, eager_rows)


@pytest.mark.real_gpu
def test_after_compile_kernels_val_is_captured_at_its_first_pass_with_the_launches_bits(rng):
    """compile_kernels loads the evaluation's kernels, so val's first pass is captured (a capture that had to
    load one would be refused): its rows the bits of a session that launches them one by one."""
    dataset = tiny_dataset(rng, features=64, classes=10, train=300, test=50)
    runs = []
    for graphs in (True, False):
        config = config_from_dict({"seed": 7, "data": {"val_size": 50}, "model": {"hidden": [64]},
                                   "train": {"batch_size": 32, "eval_batch_size": 16, "cuda_graphs": graphs}})
        session = build_session(config, CudaBackend(), dataset)
        compile_kernels(session)
        runs.append([session.evaluator.evaluate_rows(session.val)])
        if graphs:
            assert [(e.graph is not None, e.passes) for e in session.evaluator.graphs.values()] == [(True, 1)]
            assert session.evaluator.fallback is None
        runs[-1].append(session.evaluator.evaluate_rows(session.val))
    for (loss, acc, rows), (eager_loss, eager_acc, eager_rows) in zip(*runs):
        assert (loss, acc) == (eager_loss, eager_acc)
        np.testing.assert_array_equal(rows, eager_rows)


def test_a_refused_capture_falls_back_to_launching_one_by_one(rng, monkeypatch):
    """A driver that refuses the graph capture costs speed, not the run: a warning, then the same
    results as without graphs."""
    dataset = tiny_dataset(rng)
    config = config_from_dict({"seed": 3, "data": {"val_size": 7}, "model": {"hidden": [6]},
                               "train": {"batch_size": 8, "log_every": 2}})
    results = []
    for refuse in (True, False):
        backend = CpuBackend()
        if refuse:
            def capture(record):
                raise RuntimeError("cuStreamBeginCapture failed: CUDA_ERROR_NOT_SUPPORTED")
            monkeypatch.setattr(backend, "capture", capture)
        session = build_session(config, backend, dataset)
        with console.capture() as printed:
            train_epoch(session, 1, lambda window: None)
        assert session.window.graph is None and session.window.graph_tried
        assert ("no CUDA graph (cuStreamBeginCapture failed" in printed.get()) == refuse
        results.append(session.model.params.to_host_dict())
    for name in results[0]:
        np.testing.assert_array_equal(results[0][name], results[1][name], err_msg=name)


def test_a_refused_evaluation_capture_warns_once_and_evaluates_the_same(rng, monkeypatch):
    """The evaluation's graph (captured at a split's second pass) refused by the driver: one warning line,
    recorded for summary.json, and every pass launched one by one with the results of a session without
    graphs."""
    dataset = tiny_dataset(rng)
    def config(graphs):
        return config_from_dict({"seed": 3, "data": {"val_size": 7}, "model": {"hidden": [6]},
                                 "train": {"batch_size": 8, "eval_batch_size": 3, "cuda_graphs": graphs}})

    backend = CpuBackend()
    refused = []

    def capture(record):
        refused.append(record)
        raise RuntimeError("cuStreamBeginCapture failed: CUDA_ERROR_NOT_SUPPORTED")

    monkeypatch.setattr(backend, "capture", capture)
    session = build_session(config(True), backend, dataset)
    plain = build_session(config(False), CpuBackend(), dataset)
    assert plain.evaluator.graphs is None
    with console.capture() as printed:
        results = [session.evaluator.evaluate(split) for split in (session.val, session.test) * 3]
    assert printed.get().count("no CUDA graph for the evaluation (cuStreamBeginCapture failed") == 1
    assert len(refused) == 2  # at each split's second pass, never again
    assert session.evaluator.fallback.startswith("no CUDA graph for the evaluation")
    assert results == [plain.evaluator.evaluate(split) for split in (plain.val, plain.test) * 3]



def recorded_session(config, dataset, events: list, monkeypatch):
    """A CPU session whose backend "captures" a stand-in graph (its replay runs the recorded launches again: the
    CPU has no graphs) and whose evaluator's batch launches, captures and replays are appended to `events`."""
    backend = CpuBackend()

    class Replay:
        def __init__(self, record):
            self.record = record

        def replay(self):
            events.append("replay")
            self.record()

    def capture(record):
        events.append("capture")
        return Replay(record)

    monkeypatch.setattr(backend, "capture", capture)
    session = build_session(config, backend, dataset)
    launch_batch = session.evaluator.launch_batch
    monkeypatch.setattr(session.evaluator, "launch_batch", lambda *a: (events.append("launch"), launch_batch(*a)))
    return session

@pytest.mark.parametrize("ready", [True, False])
def test_a_splits_graph_is_captured_at_its_first_pass_if_every_epoch_evaluates_it_else_at_its_second(rng, monkeypatch,
                                                                                                  ready):
    """Once compile_kernels has loaded the evaluation's kernels (`kernels_ready`), val, evaluated at every epoch's
    end, is captured at its first pass; before (a capture must not load kernels), and for test (train.eval_test
    end: evaluated once, at a run's end), a split's first pass is launched one by one and its second captured;
    every later pass replays its graph, on the launch stream it was captured on (a replay stands in for the
    launches here: the CPU has no graphs)."""
    dataset = tiny_dataset(rng)
    config = config_from_dict({"seed": 3, "data": {"val_size": 7}, "model": {"hidden": [6]},
                               "train": {"batch_size": 8, "eval_batch_size": 3}})
    events = []
    session = recorded_session(config, dataset, events, monkeypatch)
    session.evaluator.kernels_ready = ready
    launches = ["launch"] * 3  # 7 rows in batches of 3
    captured = ["capture", "replay", *launches]
    first = [session.evaluator.evaluate(session.val)]
    assert events == (captured if ready else launches)
    events.clear()
    tested = [session.evaluator.evaluate(session.test) for _ in range(2)]
    batches = ["launch"] * -(-session.test.size // 3)
    assert events == [*batches, "capture", "replay", *batches]
    events.clear()
    first += [session.evaluator.evaluate(session.val) for _ in range(2)]
    assert events == (["replay", *launches] * 2 if ready else [*captured, "replay", *launches])
    assert first[0] == first[1] == first[2] and tested[0] == tested[1]



@pytest.mark.parametrize("ready", [True, False])
def test_a_split_captured_ahead_replays_at_its_first_pass(rng, monkeypatch, ready):
    """capture_ahead records a split's graph before its first pass (the test split of a packed lane, while it
    trains), which that pass and every later one replay, with the launches' results; before its kernels are
    loaded it records nothing, and the split is launched, then captured at its second pass, as before."""
    dataset = tiny_dataset(rng)
    config = config_from_dict({"seed": 3, "data": {"val_size": 7}, "model": {"hidden": [6]},
                               "train": {"batch_size": 8, "eval_batch_size": 3}})
    events = []
    session = recorded_session(config, dataset, events, monkeypatch)
    alone = build_session(config, CpuBackend(), dataset)
    session.evaluator.kernels_ready = ready
    session.evaluator.capture_ahead(session.test)
    session.evaluator.capture_ahead(session.test)  # once
    assert events == (["capture"] if ready else [])
    events.clear()
    tested = [session.evaluator.evaluate(session.test) for _ in range(2)]
    batches = ["launch"] * -(-session.test.size // 3)
    assert events == (["replay", *batches] * 2 if ready else [*batches, "capture", "replay", *batches])
    assert tested == [alone.evaluator.evaluate(alone.test)] * 2
    session.evaluator.capture_ahead(None)  # a run without a test split: nothing



def test_a_refused_capture_ahead_is_tried_once_and_the_split_launched(rng, monkeypatch):
    """A driver that refuses capture_ahead's capture is asked once (a lane asks at each queued epoch end), with one
    warning line; the split's pass then launches its batches, with the launches' results."""
    dataset = tiny_dataset(rng)
    config = config_from_dict({"seed": 3, "data": {"val_size": 7}, "model": {"hidden": [6]},
                               "train": {"batch_size": 8, "eval_batch_size": 3}})
    backend, refused = CpuBackend(), []

    def capture(record):
        refused.append(record)
        raise RuntimeError("cuStreamBeginCapture failed: CUDA_ERROR_NOT_SUPPORTED")

    monkeypatch.setattr(backend, "capture", capture)
    session = build_session(config, backend, dataset)
    session.evaluator.kernels_ready = True
    with console.capture() as printed:
        for _ in range(3):
            session.evaluator.capture_ahead(session.test)
    assert len(refused) == 1 and printed.get().count("no CUDA graph for the evaluation") == 1
    alone = build_session(config, CpuBackend(), dataset)
    assert session.evaluator.evaluate(session.test) == alone.evaluator.evaluate(alone.test)


def test_an_epochs_start_queues_its_order_without_waiting_for_the_device(rng, monkeypatch):
    """The epoch's order is a copy queued behind the last epoch's steps, with no synchronisation: in a packed
    group, whose lanes share a stream, one at each lane's epoch start drained every other lane's queued steps. It is
    queued to be made later (copy_from_host_later: from pinned memory on a GPU, the host not waiting for it)."""
    dataset = tiny_dataset(rng)
    config = config_from_dict({"seed": 3, "data": {"val_size": 7}, "model": {"hidden": [6]},
                               "train": {"batch_size": 8}})
    session = build_session(config, CpuBackend(), dataset)
    calls = []
    monkeypatch.setattr(session.backend, "synchronize", lambda: calls.append("synchronize"))
    copy = session.backend.copy_from_host_later
    monkeypatch.setattr(session.backend, "copy_from_host_later",
                        lambda dst, src: (calls.append("copy"), copy(dst, src)))
    session.window.start_epoch(np.arange(session.train.size, dtype=np.int32)[::-1].copy())
    assert calls == ["copy"]
    np.testing.assert_array_equal(session.backend.to_host(session.window.order), np.arange(session.train.size)[::-1])


def test_the_next_epochs_order_is_made_while_this_one_trains(rng, monkeypatch):
    """Once an epoch's first read is queued, the next epoch's order is made (training.loop.epoch_steps: at its last
    window, a packed group's lanes made theirs in turn at the epoch's end), and that epoch starts from it: the order
    epoch_order gives, not made again; the last epoch makes none."""
    from mlptrain.data.loader import epoch_order
    from mlptrain.training import loop

    config = config_from_dict({"seed": 5, "data": {"val_size": 8}, "model": {"hidden": [6]},
                               "train": {"batch_size": 7, "epochs": 2, "log_every": 2}})
    session = build_session(config, CpuBackend(), tiny_dataset(rng))  # 32 training rows: 5 windows an epoch
    made = []
    monkeypatch.setattr(loop, "epoch_order", lambda split, seed, epoch: made.append(epoch) or
                        made.append(session.window.cursor_at) or epoch_order(split, seed, epoch))
    train_epoch(session, 1, lambda read: None)
    assert made == [1, None, 2, 14] and session.window.order_ahead[0] == 2  # epoch 2's after the second window
    np.testing.assert_array_equal(session.window.order_ahead[1], epoch_order(session.train, 5, 2))
    train_epoch(session, 2, lambda read: None)
    assert made == [1, None, 2, 14]  # epoch 2 took the order made ahead; epoch 3 is past train.epochs
    np.testing.assert_array_equal(session.window.order, epoch_order(session.train, 5, 2))


@pytest.mark.parametrize("refused", [False, True])
def test_the_partial_window_replays_a_graph_of_its_own_or_warns_once(rng, monkeypatch, refused):
    """The epoch's partial last window is captured right after its first launch, where the full window's graph was,
    and replayed in every later epoch (a stand-in graph replays the recorded launches: the CPU has none); a refused
    capture of it warns once (summary.json's fallbacks) and launches it one by one. Either way the parameters and
    reads are those of a session without graphs."""
    dataset = tiny_dataset(rng)  # 40 rows, 8 held out: 4 full windows of 7 and a partial one of 4
    def config(graphs):
        return config_from_dict({"seed": 3, "data": {"val_size": 8}, "model": {"hidden": [6]},
                                 "train": {"batch_size": 7, "epochs": 3, "log_every": 2, "cuda_graphs": graphs}})

    events = []
    backend = CpuBackend()

    class Replay:
        def __init__(self, rows, record):
            self.rows, self.record = rows, record

        def replay(self):
            events.append(("replay", self.rows))
            self.record()

    def capture(record):
        rows = window.full_rows if window.partial is None and window.graph is None else "partial"
        events.append(("capture", rows))
        if refused and rows == "partial":
            raise RuntimeError("cuStreamBeginCapture failed: CUDA_ERROR_NOT_SUPPORTED")
        return Replay(rows, record)

    monkeypatch.setattr(backend, "capture", capture)
    session = build_session(config(True), backend, dataset)
    window = session.window
    plain = build_session(config(False), CpuBackend(), dataset)
    runs = []
    with console.capture() as printed:
        for s in (session, plain):
            reads = []
            for epoch in (1, 2, 3):
                train_epoch(s, epoch, reads.append)
            runs.append((s.model.params.to_host_dict(), [(r["step"], r["loss"], r["grad_norm"]) for r in reads]))
    assert events.count(("capture", 7)) == 1 and events.count(("capture", "partial")) == 1
    assert events.count(("replay", "partial")) == (0 if refused else 2)  # epochs 2 and 3
    assert (window.partial[1] is None) == refused
    assert printed.get().count("no CUDA graph for the partial last window") == (1 if refused else 0)
    assert (window.fallback or "").startswith("no CUDA graph for the partial last window") == refused
    (params, reads), (plain_params, plain_reads) = runs
    assert reads == plain_reads
    for name in plain_params:
        np.testing.assert_array_equal(params[name], plain_params[name], err_msg=name)
