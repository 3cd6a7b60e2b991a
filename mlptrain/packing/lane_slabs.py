"""Packed trials' buffers as lanes: every buffer a trial's session allocates is one row of an array of K rows.

K trials of one shape (mlptrain.packing.lane_group) build their sessions each through a `LaneBackend`: its
allocations while the session is built go to `Slabs`, where the i-th allocation of any lane is row `lane` of
the i-th slab (K, *shape). Each trial's model, optimizer step and window then work on views exactly as on
buffers of their own (their checkpoints, reads and evaluation are unchanged), while one launch over a slab
serves all K trials: the flat parameters of every lane are one (K, P) array, a layer's weights one lane view
(mlptrain.backends.lanes). Everything else a LaneBackend does is its backend's.

`lane_signature` says which configs make the same slabs: the trials of a sweep or the seeds of a run may differ
in what the lanes hold per trial (the seed, the optimizer's hyperparameters, the schedule, clipping, loss
scaling) and in the host's work (logging, checkpoints, early stopping), not in shapes or kinds.
"""

from __future__ import annotations

import json
from contextlib import contextmanager

import numpy as np

from mlptrain.backends.lanes import lane_view
from mlptrain.backends.thread_stream import launch_stream, use_launch_stream
from mlptrain.config.load import config_to_dict

# what lanes of one group may differ in: section -> keys (None: the whole section)
PER_LANE = {"": ("seed", "description"), "optim": ("lr", "momentum", "nesterov", "betas", "eps", "weight_decay"),
            "schedule": None, "logging": None,
            "train": ("log_every", "checkpoint_every_epochs", "eval_test", "clip_grad_norm", "loss_scale",
                      "early_stopping")}
ADAM_FAMILY = ("adam", "adamw")  # one update kernel: AdamW's decoupled decay is a lane's flag


def lane_signature(config) -> str:
    """What must be equal for configs to train in lanes of one group, as one string."""
    plain = config_to_dict(config)
    for section, keys in PER_LANE.items():
        where = plain if not section else plain.get(section, {})
        if keys is None:
            plain.pop(section, None)
            continue
        for key in keys:
            where.pop(key, None)
    optim = plain.get("optim", {})
    if optim.get("name") in ADAM_FAMILY:
        optim["name"] = "adam or adamw"
    return json.dumps(plain, sort_keys=True, default=str)


class SlabMismatch(Exception):
    """A lane's session asked for a buffer unlike the group's (an internal error: lane_signature let it in)."""


ROW_ALIGN = 16  # bytes: the tf32x3 engine stages a weight row 16 bytes a load (numba_kernels.wide)


class Slabs:
    """The K lanes' buffers: allocation i of a lane's session is row `lane` of slab i (allocated by the first
    session that asks for it, zeroed).

    On the CUDA backend a float32 vector's lanes start ROW_ALIGN bytes apart (their rows padded), so a layer's
    weights in every lane are as aligned as in a trial's own buffer, and the tf32x3 engine stages them four
    elements a load (gemm_tf32); the slab is then the lane view of its rows without the padding."""

    def __init__(self, backend, lanes: int):
        self.backend, self.lanes = backend, lanes
        self.arrays = []
        self._of = {}  # id(a lane's row) -> (slab index, the row), for `slab_of`
        self._padded = []
        self._handed = set()  # (slab index, lane) of every row handed out: the others are still as allocated, zero

    def _allocate(self, shape: tuple, dtype):
        per_row = ROW_ALIGN // dtype.itemsize
        if self.backend.name != "cuda" or len(shape) != 1 or dtype != np.float32 or shape[0] % per_row == 0:
            return self.backend.zeros((self.lanes, *shape), dtype)
        padded = self.backend.zeros((self.lanes, -(-shape[0] // per_row) * per_row), dtype)
        self._padded.append(padded)  # a lane view need not keep its allocation alive (numba's holds a weak proxy)
        return lane_view(padded, 0, shape)

    def row(self, lane: int, index: int, shape, dtype):
        shape, dtype = tuple(int(n) for n in np.atleast_1d(shape)), np.dtype(dtype)
        if index == len(self.arrays):
            self.arrays.append(self._allocate(shape, dtype))
        slab = self.arrays[index]
        if tuple(slab.shape[1:]) != shape or slab.dtype != dtype:
            raise SlabMismatch(f"buffer {index}: {shape} {dtype} where the group holds {tuple(slab.shape[1:])} "
                               f"{slab.dtype}")
        view = slab[lane]
        self._of[id(view)] = (index, view)
        self._handed.add((index, lane))
        return view

    def fresh(self, lane: int, index: int) -> bool:
        """Whether row `lane` of slab `index` was never handed out: zero as the slab was allocated (in the stream's
        order), so a session's zeroed buffer there needs no memset of its own."""
        return (index, lane) not in self._handed

    def slab_of(self, view):
        """The slab whose lane row `view` is (a buffer a lane's session allocated)."""
        return self.arrays[self._of[id(view)][0]]

    def forget(self, lane_views) -> None:
        """Drop the records of rows no session uses any more."""
        for view in lane_views:
            self._of.pop(id(view), None)


class LaneBackend:
    """A backend whose allocations, while `building`, are rows of a lane of `slabs`; otherwise its backend."""

    def __init__(self, backend, slabs: Slabs, lane: int, overtake: bool = False):
        self._backend, self.slabs, self.lane, self.overtake = backend, slabs, lane, overtake
        self._next, self._building, self.rows = 0, False, []

    def __getattr__(self, name):
        return getattr(self._backend, name)

    def free_bytes(self) -> int | None:
        """The device's free memory, for the group's first session (mlptrain.training.memory_plan.check_fits); None
        (nothing to check) once the slabs exist: that session allocated every lane's rows (the lanes' shapes are the
        same: lane_signature), after lane_group checked that all K fit, so a later lane's session allocates nothing new
        (an allocation that still fails is refused where it is made). Asking the driver took ~2.4 ms a lane in a
        packed sweep's start (benchmarks/NOTES.md, issue 30 step 29)."""
        return None if self.slabs.arrays else self._backend.free_bytes()

    @contextmanager
    def urgent(self, after=None):
        """With `overtake` (a staggered group, whose other lanes step on while this one ends its epoch): the
        block's launches, copies and marks go to the backend's urgent stream, which waits for `after` (the lane's
        last step's mark) alone, not for the other lanes' steps queued since; the lanes' stream then waits for
        the block's work before its next launches. Only this lane's backend is switched, by a copy of the shared
        one (`overtaking`): the shared backend's own `urgent` would switch the stream every lane shares while this
        lane yields inside the block (mlptrain.packing.side_by_side), sending the other lanes' copies and the
        group's launches there, out of order (two identical sweeps gave different bits). The lane's operands are
        its own rows, which the group's launches leave alone while it is away (masked). In lockstep nothing is
        queued while the lanes evaluate, so the block stays on the lanes' stream."""
        shared = self._backend
        view = shared.overtaking(after) if self.overtake else None
        if view is None:
            yield
            return
        self._backend, before = view, launch_stream()
        use_launch_stream(view.stream)
        try:
            yield
        finally:
            self._backend = shared
            shared.rejoin(view)
            use_launch_stream(before)

    @contextmanager
    def building(self):
        """Around building a session: its allocations become this lane's rows, in order."""
        self.slabs.forget(self.rows)
        self._next, self._building, self.rows = 0, True, []
        try:
            yield
        finally:
            self._building = False

    def _row(self, shape, dtype):
        view = self.slabs.row(self.lane, self._next, shape, dtype)
        self._next += 1
        self.rows.append(view)
        return view

    def empty(self, shape, dtype=np.float32):
        return self._row(shape, dtype) if self._building else self._backend.empty(shape, dtype)

    def zeros(self, shape, dtype=np.float32):
        if not self._building:
            return self._backend.zeros(shape, dtype)
        fresh = self.slabs.fresh(self.lane, self._next)
        view = self._row(shape, dtype)
        # a row never handed out is zero as allocated, so a new group's lanes make no memsets of their own (7 driver
        # calls a lane of adam_mnist: benchmarks/NOTES.md, issue 30 step 31). A lane used before is set on the
        # device, not copied from a host array of zeros (a lane's gradients and Adam's moments are ~11 MB for
        # adam_mnist).
        if not fresh:
            self._backend.zero(view)
        return view

    def to_device(self, array):
        if not self._building:
            return self._backend.to_device(array)
        array = np.ascontiguousarray(array)
        view = self._row(array.shape, array.dtype)
        self._backend.copy_from_host(view, array)
        return view
