"""`backend: auto | cuda | cpu`: the backend a run gets.

`auto` asks the CUDA driver library first (milliseconds, no numba import) and takes the CPU with a noted
fallback when no GPU is usable.
"""

from __future__ import annotations

from mlptrain.backends.cpu import CpuBackend
from mlptrain.backends.cuda import CudaBackend, cuda_unusable_reason
from mlptrain.backends.driver.early import make_context_early
from mlptrain.errors import UserError


def get_backend(name: str, device: int | None = None, own_stream: bool = False, resident=None):
    """`auto` picks CUDA when a GPU is usable, else the CPU, noting why in the backend's `fallbacks` (a
    run warns of them once it starts, after every refusal, and records them in summary.json). A CUDA
    backend is made on `device`, with a stream of its own when `own_stream`, keeping its resident data in
    `resident` (a cuda.ResidentCopies other backends of the GPU share; default: its own; see CudaBackend)."""
    if name == "cpu":
        return CpuBackend()
    if name in ("auto", "cuda"):
        make_context_early(device)  # while numba imports (no-op where the driver offers no GPU)
    if name == "auto":
        reason = cuda_unusable_reason()
        if reason is None:
            return CudaBackend(device, own_stream, resident)
        return CpuBackend(fallback=f"backend auto: no usable GPU ({reason}); running on the CPU")
    if name == "cuda":
        if cuda_unusable_reason() is not None:
            raise UserError("backend=cuda: no usable NVIDIA GPU or CUDA driver was found; use backend=cpu or backend=auto")
        return CudaBackend(device, own_stream, resident)
    raise UserError(f"backend: '{name}' is not one of auto, cuda, cpu")
