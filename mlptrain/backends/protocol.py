"""What a backend is: the one interface the model, the optimizer and the training loop use, whichever
device runs them. `CpuBackend` (cpu.py) and `CudaBackend` (cuda.py) satisfy it; tests/backends/test_protocol.py
checks both, and that their kernel sets are twins.

A backend's `kernels` is a kernel set: a package with one module per kernel family below, each offering
the same public functions with the same signatures on both backends (numpy_kernels/ and numba_kernels/),
over that backend's arrays.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Callable, Protocol, runtime_checkable

FAMILIES = ("conv", "data", "gemm", "loss", "optim", "pool", "precision", "reduce", "step_rules")


@runtime_checkable
class Backend(Protocol):
    name: str  # "cpu" or "cuda"
    device_name: str  # what summary.json records as the device
    kernels: ModuleType  # the kernel set: a module per name in FAMILIES
    fallbacks: list[str]  # why this backend runs instead of the one asked for (one line each)
    copies_lane_views: bool  # whether to_host_later takes a lane view of one axis (mlptrain.backends.lanes)

    def empty(self, shape, dtype=...) -> Any:
        """An uninitialised array on the device."""

    def zeros(self, shape, dtype=...) -> Any:
        """A zeroed array on the device."""

    def zero(self, array) -> None:
        """Set a (C-contiguous) device array to zero, queued after the launches so far."""

    def to_device(self, array) -> Any:
        """A device copy of a host array."""

    def resident(self, array) -> Any:
        """The device copy of a host array that nothing writes (a dataset's images), made once per backend and
        reused while the same array comes back (a sweep's trials on one worker share their data)."""

    def resident_index(self, index) -> Any:
        """The device copy of a split's row index, a read-only host array (mlptrain.data.loader), made once per
        GPU and kept while that host array lives: the runs of one seed, and every run's test split, share it."""

    def holds(self, array) -> bool:
        """Whether `resident(array)` (or `resident_index`) needs no new device memory (a copy kept, or the
        host's own array)."""

    def to_host(self, array) -> Any:
        """A NumPy copy of a device array."""

    def copy_from_host(self, dst, src) -> None:
        """`src` (host) written into the existing device array `dst`."""

    def copy_from_host_later(self, dst, src) -> None:
        """`copy_from_host`, queued after the launches so far without the host waiting for them to run: `src` may
        change as soon as this returns."""

    def synchronize(self) -> None:
        """Wait until every queued launch has finished."""

    def mark(self) -> Any:
        """A mark after the launches queued so far (`.done()` asks whether they have run, `.wait()` waits), for
        a caller with other work to do meanwhile; None where nothing runs behind the host's back (the CPU)."""

    def urgent(self, after=None) -> Any:
        """A context manager: the block's launches and copies go before other work on the device, in order after
        what was queued before it (a packed run's evaluation, waited for while other runs fill the device);
        `after`, a mark of this backend, may narrow that to the work before it where the backend can tell
        (a staggered lane's, mlptrain.packing.lane_slabs)."""

    def overtaking(self, after) -> Any:
        """A copy of this backend whose work waits for `after` (a mark of this one) alone, not for what was
        queued since, and goes before it; None where there is no such stream (mlptrain.packing.lane_slabs)."""

    def rejoin(self, view) -> None:
        """What is queued on this backend from now on waits for the work of `view` (an `overtaking` copy)."""

    def beside(self) -> Any:
        """A context manager: the block's launches follow every launch queued before it, but those queued after it
        may run beside them until `join_beside` (a layer's weight gradient beside the input gradients below it:
        mlptrain.nn.mlp). The block's launches need buffers of their own; in order where the backend has a single
        stream."""

    def join_beside(self) -> None:
        """What is queued from now on waits for every `beside` block's launches."""

    def copy(self, dst, src) -> None:
        """`src` copied into the existing device array `dst` (same shape and dtype), after the launches so far."""

    def to_host_after(self, array, mark) -> Any:
        """A NumPy copy of `array` as it is once `mark` is done, not waiting for launches queued after it (None:
        `to_host`). The caller keeps those launches from writing `array`."""

    def to_host_later(self, arrays: list) -> Any:
        """Host copies of `arrays` as they are after the launches queued so far, queued now and taken later:
        `.take()` returns them (a list of NumPy arrays), `.views()` the same arrays in the copies' own memory (no copy;
        valid until `.drop()`), `.drop()` gives them up (mlptrain.backends.host_copies); `.mark` is a mark (as `mark`'s)
        after the copies, or None where they were made at once."""

    def reserve_host_copies(self, *copies: list) -> None:
        """Make ready, behind the host's back, what `to_host_later(arrays)` will need for each `arrays` of
        `copies` (a run that holds its best epoch's checkpoint until its end)."""

    def free_bytes(self) -> int | None:
        """Bytes the device can still give now; None where it will not say."""

    def capture(self, record: Callable[[], None]) -> Any:
        """A replayable recording (`.replay()`) of the launches `record()` makes, or None."""

    def graphs_unavailable(self) -> str | None:
        """Why `capture` records nothing; None when it records."""

    def start_compilers(self) -> None:
        """Start compiling the kernels a run will need, where compiling is needed."""
