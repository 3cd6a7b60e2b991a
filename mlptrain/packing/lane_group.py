"""Packed trials in lanes: K runs of one shape whose optimizer steps are one set of launches for all of them.

`mlptrain.packing.side_by_side.side_by_side` trains K runs from one thread, each run's steps its own launches on its
own stream. A `LaneGroup` goes further for MLPs: the K sessions are built on rows of shared slabs
(mlptrain.packing.lane_slabs), so their windows can be launched as one step of every lane
(mlptrain.packing.lane_step), replayed as one CUDA graph: K trials cost about the launches of one.

Each run keeps its own loop (mlptrain.training.loop): its epochs, reads, evaluation, checkpoints, logs and
summary are its own. Only its window is the group's (`LaneWindow`): `run` hands the window to the group, and
side_by_side, once every lane in training has handed in one (`lockstep`), calls `flush`, which launches them.
A run reads nothing of its step before the flush: the loop yields right after each `run`, and side_by_side does
not advance a run whose window waits.

With `stagger` (STAGGER), the group waits only for the lanes that are due, from their first window to their
epoch's last: between epochs (a lane's evaluation, checkpoint and logs, ~6 ms of host work on an H100) and
before its first window, the others step without it, and side_by_side spreads the lanes' starts over an epoch
(Period), so that their epoch ends come one after another while the GPU trains the rest, instead of all at once
with the GPU idle; a lane's evaluation goes ahead of the others' queued steps (lane_slabs.LaneBackend.urgent).
Measured on H100s it is as fast as lockstep, not faster (benchmarks/NOTES.md, issue 30 steps 10-11): a lane
away at its epoch end, waiting first for its last step's results behind the others' queued steps, is a masked
lane in ~40 flushes, so it stays off.

Staggered, which lanes step together changes with the host's timing, so nothing a lane computes may depend on
it: the windows of each size are one launch of their lanes (the others masked, in lockstep too), and the GEMMs'
tile is the one chosen for all K lanes whichever of them a launch covers (LaneStep.tiles_for). A lane's bits
are then those of its run in the group, however its steps fell in with the others'. In lockstep the lanes
launched follow from which lanes train, and the tile is chosen for them, as before.

`LaneResources` gives slot `lane` of a packed worker the group's backend for that lane where the trial's config
has the group's shapes (lane_slabs.lane_signature), and a backend of its own otherwise (one line says why).
"""

from __future__ import annotations

import time
from collections import deque

import numpy as np

from mlptrain.backends.lanes import lane_view
from mlptrain.backends.thread_stream import use_launch_stream
from mlptrain.errors import UserError
from mlptrain.nn import model_dataset
from mlptrain.packing.lane_slabs import LaneBackend, Slabs, lane_signature
from mlptrain.packing.lane_step import LaneStep
from mlptrain.training.memory_plan import estimate
from mlptrain.training.session import build_session
from mlptrain.training.window import TrainingWindow
from mlptrain.util.console import console
from mlptrain.util.host_memory import HEADROOM, gib


def lanes_possible(config) -> str | None:
    """Why runs of `config` cannot train in lanes (None: they can)."""
    if config.model.type != "mlp":
        return f"the lanes hold MLPs only, not a {config.model.type}"
    return None


class LaneWindow(TrainingWindow):
    """A lane's TrainingWindow (the same buffers) whose full and partial windows its group launches."""

    def __init__(self, window: TrainingWindow, group: "LaneGroup", lane: int):
        # the window's own buffers and state, taken over (TrainingWindow.__init__ would allocate new ones)
        self.__dict__.update(window.__dict__)
        self.group, self.lane = group, lane

    @property
    def spans(self) -> bool:
        """A lockstep group's lane hands in its windows up to its next read at once (training.loop.window_spans),
        and its group launches them step after step: the lanes' loops yield once a period instead of once a step,
        where each lane's turn and hand-in cost a 16-lane group ~90 µs of host time a step (at the GPU's ~300). On
        H200 hosts its sweeps measured level, their gaps at reads smaller (benchmarks/NOTES.md, issue 30 steps 33
        and 34). Staggered, the group waits for the lanes that are due, window by window."""
        return not self.group.stagger

    def run(self, start: int, rows: int) -> None:
        self.group.submit(self.lane, start, rows)

    def withdraw(self) -> int:
        return self.group.withdraw(self.lane)

    def plan(self, rows: int) -> None:
        self.group.plan(rows)
        super().plan(rows)

    def read_copies(self, lo: int, hi: int, outcomes: bool):
        return self.group.read_copies(self, lo, hi, outcomes)

    def read_metrics(self, copies, row_metrics) -> tuple[float, float]:
        return self.group.read_metrics(self, copies, row_metrics)

    def kernels_made_ready(self, make) -> list[str]:
        return self.group.kernels_made_ready(make)

    def graphs_record(self) -> dict:
        """The group's graph record, and summary.json's `lanes`: how many lanes the run's group had, its own, and
        how the lanes' GEMMs summed (their engine)."""
        engine = self.group.step.engine if self.group.step is not None else None
        return {**self.group.graphs_record(), "lanes": {"of": self.group.lanes, "lane": self.lane, "gemm": engine}}


STAGGER = False  # lanes out of lockstep at their epochs' ends (above): no faster yet


class LaneGroup:
    """K lanes of MLP sessions on one backend (one stream) and the launches of their steps."""

    def __init__(self, backend, lanes: int, cuda_graphs: bool = True, stagger: bool | None = None):
        self.backend, self.lanes = backend, lanes
        self.stagger = STAGGER if stagger is None else stagger
        self.slabs = Slabs(backend, lanes)
        self.signature = None
        self.windows: list[LaneWindow | None] = [None] * lanes  # the window of the run training in each lane
        # lane -> its windows (start, rows) handed in, not launched yet, in order; a lane with none has no entry
        self.pending: dict[int, deque] = {}
        self.withdrawn: dict[int, int] = {}  # lane -> its windows taken back at a stop, not launched (`withdraw`)
        self.due: set[int] = set()  # lanes inside an epoch: the next flush waits for their windows
        self.step: LaneStep | None = None
        # a graph per lanes launched and step plan (LaneStep.plan: a trial joining may change it)
        self.graphs, self.graph_rows, self.graph_tried = {}, None, not cuda_graphs
        self.graphs_off = None if cuda_graphs else "train.cuda_graphs is false"
        self.active = None  # the lanes the device's mask holds
        self.flushes = 0  # flushes so far: a read's copies are the group's for the lanes reading after one flush
        self._read = None  # (flushes, lo, hi, outcomes), and the copies of every lane's rows and step state
        self._read_metrics = None  # those copies, and every lane's loss and accuracy in them (read_metrics)
        self._kernel_notes = {}  # LaneStep.plan -> the notes of making its kernels ready (kernels_made_ready)

    def kernels_made_ready(self, make) -> list[str]:
        """The fallback notes of making the lanes' kernels ready: `make()` (training.compilation) for the first
        run that asks under each step plan (LaneStep.plan), the same notes for the others. Every lane launches
        the group's steps and evaluates batches of the same shapes: planning them again for each of 16 packed
        trials took ~6 ms and printed a line each."""
        key = self.step.plan if self.step is not None else None
        if key not in self._kernel_notes:
            self._kernel_notes[key] = make()
        return self._kernel_notes[key]

    def accepts(self, config) -> bool:
        """Whether `config` makes the group's slabs (the first config asked sets them)."""
        signature = lane_signature(config)
        if self.signature is None:
            self.signature = signature
        return signature == self.signature

    def backend_for(self, lane: int) -> LaneBackend:
        return LaneBackend(self.backend, self.slabs, lane, overtake=self.stagger)

    def attach(self, lane: int, session):
        """Make `session` (built on lane `lane`'s backend) the lane's run: its window becomes the group's."""
        if self.step is None:
            self.step = LaneStep(self.backend, self.slabs, session)
            self.step.tiles_for = self.lanes if self.stagger else None
        self.step.set_lane(lane, session)
        session.window = LaneWindow(session.window, self, lane)
        self.windows[lane] = session.window
        self.pending.pop(lane, None)
        self.withdrawn.pop(lane, None)
        self.due.discard(lane)  # due from its first window
        return session

    def leave(self, lane: int) -> None:
        """Lane `lane` trains nothing more (its slot ended, or trains a run of its own)."""
        if self.step is not None:
            self.step.clear_lane(lane)
        self.windows[lane] = None
        self.pending.pop(lane, None)
        self.withdrawn.pop(lane, None)
        self.due.discard(lane)

    def submit(self, lane: int, start: int, rows: int) -> None:
        self.pending.setdefault(lane, deque()).append((start, rows))
        self.due.add(lane)

    def withdraw(self, lane: int) -> int:
        """How many of lane `lane`'s windows handed in `flush` took back, unlaunched, at a stop (0: none)."""
        return self.withdrawn.pop(lane, 0)

    def waits(self, lane: int) -> bool:
        """Whether lane `lane` handed in a window not launched yet (its run must not go on before the flush
        launches it)."""
        return lane in self.pending

    def ready(self) -> bool:
        """Whether every lane in training (with `stagger`, every lane that is due) has handed in its window, and
        one has."""
        if not self.pending:
            return False
        if self.stagger:
            return self.due.issubset(self.pending)
        return all(w is None or lane in self.pending for lane, w in enumerate(self.windows))

    def flush(self, stop=None) -> None:
        """Launch the windows handed in: each lane's first as one step of their lanes (those of each size as one),
        then the next while every lane in training has one (`ready`; each lane's in the order handed in) and
        `stop.signum` is not set (a run's step reads it after every optimizer step: the lanes take back what is
        left, LaneWindow.withdraw). A lane whose window ends its epoch is not due again until it hands in the
        next."""
        use_launch_stream(getattr(self.backend, "stream", None))

        def stopping() -> bool:
            return stop is not None and bool(stop.signum)

        self._step()
        while self.ready() and not stopping():
            self._step()
        if stopping():  # the lanes' runs go on (side_by_side waits for none) and stop there
            for lane in list(self.pending):
                self.withdrawn[lane] = len(self.pending.pop(lane))
        self.flushes += 1

    def _step(self) -> None:
        """One step: every lane's first window handed in, launched."""
        heads = {lane: windows.popleft() for lane, windows in sorted(self.pending.items())}
        sizes = {}
        for lane, (start, rows) in heads.items():
            sizes.setdefault(rows, []).append(lane)
            window = self.windows[lane]
            if window.cursor_at != start:
                self.backend.copy_from_host(window.cursor, np.array([start], np.int64))
        for rows, together in sorted(sizes.items(), reverse=True):
            if tuple(together) != self.active:
                mask = np.zeros(self.lanes, np.int32)
                mask[together] = 1
                self.step.set_active(mask)
                self.active = tuple(together)
            self._launch(rows, together[-1] + 1)
        for lane, (start, rows) in heads.items():
            window = self.windows[lane]
            window.cursor_at = start + rows
            if window.first_step_at is None:
                window.first_step_at = time.time()
            if window.cursor_at >= window.split.size:  # its epoch's last window: its epoch's end comes next
                self.due.discard(lane)
            if not self.pending[lane]:
                del self.pending[lane]

    def read_copies(self, window: LaneWindow, lo: int, hi: int, outcomes: bool):
        """A lane's read copies (TrainingWindow.read_copies), made for every lane at once where the backend
        copies lane views: the lanes of a lockstep group read after the same flush, the same rows, and a read's
        three copies a lane were ~0.4 ms of host time each at each read, 16 lanes in turn while the GPU ran out
        of queued steps (benchmarks/NOTES.md, issue 30 step 16). Nothing is launched between the lanes' reads of
        one flush but their own epoch ends' work, which writes no row or state of another lane's."""
        if not self.backend.copies_lane_views or self.step is None or self.stagger:  # staggered: apart
            return TrainingWindow.read_copies(window, lo, hi, outcomes)
        key = (self.flushes, lo, hi, outcomes)
        if self._read is None or self._read[0] != key:
            slabs = self.step.slabs
            rows = [lane_view(slabs["row_loss"], lo, (hi - lo,)),
                    *([lane_view(slabs["row_correct"], lo, (hi - lo,))] if outcomes else [])]
            self._read = (key, self.backend.to_host_later([*rows, slabs["state"]]))
        return LaneCopies(self._read[1], window.lane)

    def read_metrics(self, window: LaneWindow, copies, row_metrics) -> tuple[float, float]:
        """A lane's (loss, acc) of its read's copies (TrainingWindow.read_metrics): where they are its share of every
        lane's (read_copies), `row_metrics` of every lane's rows at once, the first time a lane asks, and this lane's
        of them (the same bits as its rows' alone). The lanes of a lockstep group each took their rows' means in
        turn, 16 small NumPy calls a read. With the epochs' means, 372 ms of the feeding thread's sampled training
        in a 16-lane sweep; 215 with one call a read (benchmarks/NOTES.md, issue 30 step 30). The lanes' evaluators
        are alike (lane_signature)."""
        if not isinstance(copies, LaneCopies):
            return TrainingWindow.read_metrics(window, copies, row_metrics)
        if self._read_metrics is None or self._read_metrics[0] is not copies.copies:
            *rows, _ = copies.copies.take()
            loss, acc, _ = row_metrics(*rows)
            self._read_metrics = (copies.copies, loss, acc)
        _, loss, acc = self._read_metrics
        return float(loss[window.lane]), float(acc[window.lane]) if np.ndim(acc) else acc

    def _launch(self, rows: int, lanes: int) -> None:
        """As a lane's own window runs: the first full window launch by launch (compiling), then captured as a
        graph that every later full window replays; other windows launch by launch. Lanes [0, `lanes`) are
        launched: past the last that steps, none."""
        graph = self.graphs.get((lanes, self.step.plan)) if rows == self.graph_rows else None
        if graph is not None:
            graph.replay()
            return
        self.step.launches(rows, lanes)
        if not self.graph_tried and rows == self._full_rows() and self.graph_rows in (None, rows):
            self.graph_rows = rows
            self._capture(rows, lanes)

    def _full_rows(self) -> int:
        return next(w.full_rows for w in self.windows if w is not None)

    def _capture(self, rows: int, lanes: int) -> None:
        try:
            graph = self.backend.capture(lambda: self.step.launches(rows, lanes))
        except RuntimeError as err:  # the driver refused the capture: launch one by one
            self.graphs_off, self.graph_tried = f"the driver refused the capture ({err})", True
            console.print(f"[yellow]warning:[/] no CUDA graph for the lanes ({err}); launching kernels one by one",
                          highlight=False)
            return
        if graph is None:
            self.graphs_off, self.graph_tried = self.backend.graphs_unavailable(), True
            return
        self.graphs[(lanes, self.step.plan)] = graph

    def plan(self, rows: int) -> None:
        """The group's launches of a window of `rows`, for kernel_cache.planning to record."""
        if self.step is not None:
            self.step.launches(rows)

    def graphs_record(self) -> dict:
        off = self.graphs_off
        if not self.graphs and off is None:
            off = "no full window (train.batch_size x train.grad_accum_steps samples) ran"
        return {"cuda_graphs": bool(self.graphs), "cuda_graphs_off": off}


class LaneCopies:
    """One lane's share of host copies of every lane's arrays (a lane axis first): `take` gives its rows."""

    __slots__ = ("copies", "lane")

    def __init__(self, copies, lane: int):
        self.copies, self.lane = copies, lane

    @property
    def mark(self):
        """The copies' mark, every lane's (Backend.to_host_later)."""
        return self.copies.mark

    def take(self) -> list[np.ndarray]:
        return [array[self.lane] for array in self.copies.take()]


class LaneResources:
    """Slot `lane` of a packed worker: `resources`' datasets and GPU, its sessions built in the group's lane
    where their configs allow (else on a backend of its own, on a stream of its own)."""

    def __init__(self, resources, group: LaneGroup, lane: int):
        self._resources, self.group, self.lane = resources, group, lane
        self._own = None  # a view with a stream of its own, for a run that cannot join the lanes

    def __getattr__(self, name):
        return getattr(self._resources, name)

    def prepare(self, config, start_compilers: bool = False, logs: bool | None = None):
        why = lanes_possible(config) or (None if self.group.accepts(config) else
                                         "its shapes or kinds differ from the lanes' first run")
        if why is not None:
            self.group.leave(self.lane)
            console.print(f"[yellow]packing:[/] this run trains beside the lanes, not in them: {why}",
                          highlight=False, soft_wrap=True)
            if self._own is None:
                self._own = self._resources.with_own_stream()
            return self._own.prepare(config, start_compilers, logs)
        backend, dataset = self._resources.prepare(config, start_compilers, logs)
        return self.group.backend_for(self.lane) if backend is self.group.backend else backend, dataset

    def session(self, config, start_compilers: bool = False):
        """`config`'s session: in the lane (its window the group's) where its config allows."""
        backend, dataset = self.prepare(config, start_compilers)
        if not isinstance(backend, LaneBackend):
            return build_session(config, backend, dataset)
        with backend.building():
            session = build_session(config, backend, dataset)
        return self.group.attach(self.lane, session)


def slots(config, resources, count: int):
    """(the LaneGroup or None, the `count` slots' resources) of a packed worker whose runs are like `config`:
    lanes of one group where `config` can train in lanes (each run then joins if its own config allows), else
    views of `resources` with a stream of their own each (side by side; one line says why)."""
    why = lanes_possible(config)
    if why is not None or count == 1:
        if why is not None and count > 1:
            console.print(f"packing: {count} runs side by side, each on a stream of its own ({why})", highlight=False,
                          soft_wrap=True)
        return None, [resources, *(resources.with_own_stream() for _ in range(count - 1))]
    home = resources.with_own_stream()
    backend, dataset = home.prepare(config, start_compilers=True)
    count = _lanes_that_fit(config, backend, dataset, count)
    if count == 1:
        return None, [resources]
    group = LaneGroup(backend, count, config.train.cuda_graphs)
    return group, [LaneResources(home, group, lane) for lane in range(count)]


def _lanes_that_fit(config, backend, dataset, count: int) -> int:
    """`count`, or as many lanes as the device's free memory holds (the first lane's session allocates every
    lane's buffers), with one line saying so."""
    try:
        need, _, _ = estimate(config, backend, model_dataset(config, dataset))
    except UserError:  # the config's own refusal comes when its first run is built
        return count
    free = backend.free_bytes()
    if free is None or need.device * count <= HEADROOM * free:
        return count
    fits = max(1, int(HEADROOM * free // max(need.device, 1)))
    console.print(f"[yellow]packing:[/] {fits} lane{'s' if fits > 1 else ''}, not {count}: {count} runs of this "
                  f"config need about {gib(need.device * count)} of memory, {gib(free)} is free", highlight=False,
                  soft_wrap=True)
    return fits
