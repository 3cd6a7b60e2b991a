"""`--workers K` on GPUs: K trials at once, one thread each, in a process per GPU.

Worker i trains on GPU i mod G (of the G visible) on a CUDA stream of its own, so K > G puts several
trials on one GPU at once: a small model leaves most of a GPU idle, and their kernels overlap. The
workers of one GPU are threads of one process: the data is read once, and kernels are loaded once for
them all. With several GPUs each GPU's share (gpu_shares) is a process of its own, forked from the command
before it starts CUDA (mlptrain.sweep.forked), which then trains on none: threads of one process take turns
on its interpreter, and trials with short steps would wait for each other there. Where the command cannot
fork, the workers of all GPUs are threads of this process (or, with $MLPTRAIN_SWEEP_PROCESS_PER_GPU=1,
children started from nothing, mlptrain.sweep.workers, which reach their first trial later). The workers
start first thing; this thread opens the study meanwhile, then waits for them.

A signal reaches this thread only. It then sets `Stop.signum`, which every trial's training loop reads
after each optimizer step: each worker queues its running trial again and takes no other; this thread
waits for them and re-raises. An error outside a trial (the study's storage, say) stops the others the
same way and is raised here. A trial's own failure is only that trial's (mlptrain.sweep.engine).

One worker on a GPU runs this way too: its thread makes the GPU's context while this one imports Optuna
and opens the study.
"""

from __future__ import annotations

import signal
import threading

from mlptrain.backends.driver.early import driver_gpu_count, make_context_early
from mlptrain.sweep.gpu_processes import process_per_gpu

WAIT_S = 0.05  # a timed join: Ctrl-C still reaches this thread while it waits for the others


class Stop:
    """Read by every trial's training loop after each optimizer step: non-zero (the signal) once the
    sweep stops."""

    signum = 0


def thread_gpus(backend: str) -> int:
    """How many GPUs a sweep's workers share as threads of this process (the driver's count of the visible
    ones); 0 where they run as processes instead: on the CPU, where NumPy's work holds the interpreter's
    lock between its calls, and on the CUDA simulator, which runs a kernel through state its threads share."""
    if backend == "cpu":
        return 0
    found = driver_gpu_count()
    return found if isinstance(found, int) else 0


def make_contexts_early(workers: int, forked: bool = False) -> None:
    """Start making the CUDA contexts of the GPUs this process's workers will train on (make_context_early),
    once the driver has started: the workers then find them made. `forked`: this process runs the first
    GPU's share of a process per GPU (mlptrain.sweep.forked)."""
    found = driver_gpu_count()
    if isinstance(found, int):
        one = forked or process_per_gpu(workers, found, forking=False)
        for device in range(1 if one else min(workers, found)):
            make_context_early(device)


class TrialThreads:
    """`workers` threads, worker i on GPU i mod `gpus` (`resources.on_gpu`). They start at once and run
    `prepare(view)` (their GPU's context, the data) while this thread opens the study; `run(work)` then has
    each run `work(view, stop)` (take trials until none is queued) and waits for them all."""

    def __init__(self, workers: int, gpus: int, resources, prepare):
        self.stop, self.errors = Stop(), []
        self._go, self._work = threading.Event(), None
        self.devices = sorted({i % gpus for i in range(workers)})
        self.threads = [threading.Thread(target=self._worker, args=(resources.on_gpu(i % gpus), prepare),
                                          name=f"sweep-worker-{i}", daemon=True) for i in range(workers)]
        for thread in self.threads:
            thread.start()

    def _worker(self, view, prepare) -> None:
        try:
            prepare(view)
            self._go.wait()
            if self._work is not None and not self.stop.signum:
                self._work(view, self.stop)
        except BaseException as err:  # kept for run(), which raises it; the others stop
            self.errors.append(err)
            self.stop.signum = self.stop.signum or signal.SIGTERM

    def cancel(self) -> None:
        """The sweep ends before its trials begin (a refusal, Ctrl-C): each thread ends after its preparation."""
        self.stop.signum = self.stop.signum or signal.SIGTERM
        self._go.set()
        for thread in self.threads:
            thread.join()

    def run(self, work) -> None:
        """Let the workers take trials with `work`, and wait for them; raises the first error one raised. Ctrl-C
        or SIGTERM here sets `stop`: each worker queues its trial again after its optimizer step and ends."""
        self._work = work
        self._go.set()
        try:
            for thread in self.threads:
                while thread.is_alive():  # a timed join: a signal still reaches this thread
                    thread.join(WAIT_S)
        except BaseException as err:
            self.stop.signum = self.stop.signum or getattr(err, "signum", signal.SIGINT)
            for thread in self.threads:
                thread.join()
            raise
        if self.errors:
            raise self.errors[0]
