"""A sweep's process per GPU forked at the command's first line, before it imports anything, so that every
process starts its CUDA driver at once.

A process's driver start (cuInit and a context) takes 0.3 s alone and 0.45 s when two processes start
theirs together (the driver does much of that work one process at a time), and it was the path to a two-GPU
sweep's first trial: forked after the command had read the sweep file (0.25 s in), the processes only
started their drivers then (benchmarks/NOTES.md, issue 29). So `mlptrain sweep --workers K` on several
GPUs forks a child per GPU from what its arguments say (`start_early`, called by mlptrain.__main__), and each
child at once pins its GPU, starts its driver and its context, imports what its trials need, and waits.
The command reads the sweep file meanwhile, then either sends each child its call (the same sweep as a
`--worker`, with its share: `Planned.send`) or, where it does not fork after all (a refused sweep file, a
CPU backend, other GPUs than planned), stops them (`drop_planned`, also run at its exit) and starts its
driver then. Until its call comes a child writes nothing where anyone sees it: its output goes to a file in
memory (`memfd_create`), which starts its worker log once the call comes, and which the command quotes if the
child dies before.

The command itself trains on none of the GPUs: it opens the study, watches its children and reports. Without
a CUDA context it ends at once after the last trial, where a process with one takes 0.1-0.15 s to end (its
context's teardown), and no thread of its own competes with a trial for its interpreter.

A sweep of one worker on a GPU forks one child the same way, its trainer (`take_trainer`): it starts CUDA and
imports what training needs while the command imports Optuna and opens the study, then trains the sweep's
trials, asking the command for each over a pipe (mlptrain.sweep.trainer_pipe). Its output is the command's
terminal once its call comes. $MLPTRAIN_SWEEP_TRAINER_PROCESS=0 keeps such a sweep in the command's process.

Standard library only, besides the driver's early start: nothing here starts a thread before the fork.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys

from mlptrain.backends.driver.early import make_context_early, start_driver
from mlptrain.sweep.gpu_processes import BLAS_THREADS, can_fork, detach, gpu_shares, process_per_gpu, visible_slots

GPU_COMMANDS = ("run", "sweep")  # the commands that start the CUDA driver first thing (a thread; harmless on a CPU)
WORK_QUEUES_ENV = "CUDA_DEVICE_MAX_CONNECTIONS"  # read by the CUDA driver as it makes a context
MAX_WORDS = 300  # of a child's last line, quoted when it died before its call
TRAINER_ENV = "MLPTRAIN_SWEEP_TRAINER_PROCESS"  # "0": a single-GPU sweep trains in the command's own process


class Planned:
    """In the command: a child forked at its start for GPU `slot`, waiting for its call."""

    def __init__(self, pid: int, slot: str, go: int, done: int, out: int, requests: int | None = None,
                 answers: int | None = None):
        self.pid, self.slot, self.go, self.done, self.out = pid, slot, go, done, out
        self.requests, self.answers = requests, answers  # a trainer's pipes (mlptrain.sweep.trainer_pipe)
        self.ended = False  # reaped: its pid may be another process's now

    def last_words(self) -> str:
        """The last line the child wrote before its call (its output until then), or ""."""
        said = early_output(self.out).strip().splitlines()
        return said[-1][:MAX_WORDS] if said else ""

    def alive(self) -> bool:
        if not self.ended:
            self.ended = os.waitpid(self.pid, os.WNOHANG)[0] != 0
        return not self.ended

    def send(self, call: dict) -> bool:
        """Hand the child its call (JSON) and the pipe `done`, through which it says its exit code, to the
        caller; whether the child took it (False: it had died)."""
        try:
            data = json.dumps(call).encode()
            while data:
                data = data[os.write(self.go, data):]
            return True
        except BrokenPipeError:
            return False
        finally:
            os.close(self.go)
            os.close(self.out)  # the child copies it into its log
            self.go = self.out = None

    def close(self) -> None:
        """Its pipes and file closed, here."""
        for fd in (self.go, self.done, self.out, self.requests, self.answers):
            if fd is not None:
                os.close(fd)
        self.go = self.done = self.out = self.requests = self.answers = None

    def stop(self) -> None:
        self.close()
        if not self.ended:
            os.kill(self.pid, signal.SIGKILL)  # it has done nothing anyone sees: nothing to let it finish
            os.waitpid(self.pid, 0)
            self.ended = True


class Waiting:
    """In a child forked at the command's start: worker process `index`, until the command's call comes."""

    def __init__(self, index: int, go: int, done: int, out: int, ask: int | None = None, answers: int | None = None,
                 streams: tuple[int, int] | None = None):
        self.index, self.go, self.done, self.out = index, go, done, out
        self.ask, self.answers = ask, answers  # a trainer's pipes to the command (mlptrain.sweep.trainer_pipe)
        self.streams = streams  # a trainer's: the command's stdout and stderr, its own once its call comes

    @property
    def trainer(self) -> bool:
        return self.ask is not None

    def to_the_command_streams(self) -> None:
        """A trainer's output from now on: the command's stdout and stderr, starting with what it wrote
        before its call (its imports' warnings)."""
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        for target, saved in zip((1, 2), self.streams):
            os.dup2(saved, target)
            os.close(saved)
        said = early_output(self.out)
        os.close(self.out)
        if said:
            sys.stderr.write(said)
            sys.stderr.flush()

    def call(self) -> dict | None:
        """The command's call for this child (blocks until it comes); None when the command will not fork
        (it closed the pipe without one, or ended)."""
        chunks = []
        while chunk := os.read(self.go, 1 << 16):
            chunks.append(chunk)
        os.close(self.go)
        return json.loads(b"".join(chunks)) if chunks else None


PLANNED: dict[int, Planned] = {}  # in the command: its children forked at its start, by worker-process index
TRAINER: list[Planned] = []  # in the command: the trainer forked at its start, if any


def start_early(argv: list[str]) -> Waiting | None:
    """The command's first step: for `mlptrain sweep ... --workers K` on several GPUs, fork a child per GPU
    (where the sweep would fork them later: mlptrain.sweep.gpu_processes), each with its share of the workers,
    and import NumPy in each process with one BLAS thread (`import_numpy_alone`); otherwise a sweep's process
    sizes its GPU contexts for its workers (`work_queues`), and the commands that use a GPU start the CUDA
    driver in a thread. Returns None in the command, and in a child its Waiting."""
    args = argv[1:]
    if not args or args[0] not in GPU_COMMANDS:
        return None
    workers = workers_asked(args[1:]) if args[0] == "sweep" else None
    slots = visible_slots() if workers is not None else None
    if workers is not None:
        shares = gpu_shares(workers, len(slots) if slots else 1)
        if slots and process_per_gpu(workers, len(slots)) and can_fork():
            atexit.register(drop_planned)
            for i, share in enumerate(shares):
                waiting = _fork(i, slots[i], share)
                if waiting is not None:
                    return waiting
            import_numpy_alone()
            return None  # no driver here: the command trains on none of its GPUs
        if workers == 1 and slots and trainer_process() and can_fork():
            atexit.register(drop_planned)
            return _fork_trainer()  # None here: the command starts the driver only if it trains after all
        work_queues(max(shares))
    start_driver()
    return None


def trainer_process() -> bool:
    """Whether a single-GPU sweep trains in a trainer process (unless $MLPTRAIN_SWEEP_TRAINER_PROCESS=0)."""
    return os.environ.get(TRAINER_ENV) != "0"


def trainer_planned() -> bool:
    """Whether the command forked a trainer at its start that it has neither taken nor stopped: until it
    decides, it starts no CUDA driver of its own."""
    return bool(TRAINER)


def take_trainer() -> tuple[Planned | None, str | None]:
    """The trainer forked at the command's start, alive: the caller sends it its call and serves it. Otherwise
    (None, its last words when it had died before its call: "" if it said nothing), and None, None when
    none was forked."""
    if not TRAINER:
        return None, None
    trainer = TRAINER.pop()
    if trainer.alive():
        return trainer, None
    words = trainer.last_words()
    trainer.stop()
    return None, words


def import_numpy_alone() -> None:
    """In the processes of a sweep forked per GPU (the command, which trains on none, and each GPU's child):
    NumPy imported with one BLAS thread unless the user set its threads. None of them computes products on
    the host, and NumPy's BLAS would otherwise start a thread per core as it loads, each spinning for a while,
    in every process at once: a child's import of NumPy took 0.15-0.36 s, against 0.06-0.08 s for the command
    with one BLAS thread beside it (benchmarks/NOTES.md, issue 29, step 11). The variables are removed again
    once read: a worker started later gets the machine's default."""
    names = [] if any(name in os.environ for name in BLAS_THREADS) else list(BLAS_THREADS)
    os.environ.update(dict.fromkeys(names, "1"))
    try:
        # here, not at the top: only such a command imports it this early (a child after its fork)
        import numpy  # noqa: F401
    finally:
        for name in names:
            del os.environ[name]


def work_queues(workers: int) -> None:
    """CUDA_DEVICE_MAX_CONNECTIONS for a process whose GPU runs `workers` of a sweep's workers at most: two
    each (a worker launches on a stream of its own and captures its CUDA graphs on another), unless the user
    set it. A context makes each of these hardware work queues as it starts (8 by default), ~12 ms of driver
    work apiece: a context took 0.115 s alone and 0.19-0.30 s beside another process's, against 0.07 s and
    0.11-0.23 s with 2 (benchmarks/NOTES.md, issue 29, step 10)."""
    os.environ.setdefault(WORK_QUEUES_ENV, str(2 * max(workers, 1)))


def workers_asked(args: list[str]) -> int | None:
    """The K of a sweep command's `--workers K` (the last one given, as Click reads it; 1 without one); None
    with one that is not a number, or where the command is a `--worker` or asks for help: then nothing is
    decided here, and the command decides as it reads its arguments itself."""
    if any(arg in ("--worker", "--help") for arg in args):
        return None
    found = "1"
    for i, arg in enumerate(args):
        if arg == "--workers" and i + 1 < len(args):
            found = args[i + 1]
        elif arg.startswith("--workers="):
            found = arg.partition("=")[2]
    return int(found) if found.strip().isdigit() and int(found) > 0 else None


def take_planned(slots: list[str]) -> tuple[dict[int, Planned] | None, list[tuple[str, str]]]:
    """The children forked at the command's start, by worker-process index, when they are for exactly `slots`
    (the GPUs of the sweep's process per GPU, in order) and all alive: the caller sends each its call.
    Otherwise None, and any there are stopped; with (GPU, last words) for each child that had ended already
    (it died before the sweep began)."""
    planned = dict(PLANNED)
    PLANNED.clear()
    ended = [(child.slot, child.last_words()) for child in planned.values() if not child.alive()]
    if planned and not ended and [planned[i].slot for i in sorted(planned)] == list(slots) and sorted(
            planned) == list(range(len(slots))):
        return planned, []
    for child in planned.values():
        child.stop()
    return None, ended


def drop_planned() -> None:
    """Stop the children forked at the command's start that it has not sent a call (it refused the sweep,
    or runs it otherwise)."""
    while PLANNED:
        PLANNED.popitem()[1].stop()
    while TRAINER:
        TRAINER.pop().stop()


def early_output(out: int) -> str:
    """What a child forked at the command's start wrote before its call (the file in memory `out`)."""
    try:
        return os.pread(out, 1 << 16, 0).decode(errors="replace")
    except OSError:  # /dev/null where memfd_create is missing: nothing kept
        return ""


def _early_file(name: str) -> int:
    """Where a child forked at the start writes until its call: a file in memory."""
    try:
        return os.memfd_create(name)
    except (AttributeError, OSError):  # not Linux, or an old kernel: what it says before its call is lost
        return os.open(os.devnull, os.O_WRONLY)


def _fork_trainer() -> Waiting | None:
    """Fork the trainer of a single-GPU sweep (see the module's docstring); in the child its Waiting."""
    go_read, go_write = os.pipe()
    done_read, done_write = os.pipe()
    ask_read, ask_write = os.pipe()
    answers_read, answers_write = os.pipe()
    out = _early_file("mlptrain-trainer")
    pid = os.fork()
    if pid:
        for fd in (go_read, done_write, ask_write, answers_read):
            os.close(fd)
        os.set_blocking(done_read, False)
        TRAINER.append(Planned(pid, "", go_write, done_read, out, requests=ask_read, answers=answers_write))
        return None
    for fd in (go_write, done_read, ask_read, answers_write):
        os.close(fd)
    atexit.unregister(drop_planned)
    detach(None)  # Ctrl-C reaches it from the command, which queues nothing until the trainer has
    streams = os.dup(1), os.dup(2)
    os.dup2(out, 1)
    os.dup2(out, 2)
    work_queues(1)
    start_driver()
    make_context_early(0)
    return Waiting(0, go_read, done_write, out, ask=ask_write, answers=answers_read, streams=streams)


def _fork(index: int, slot: str, share: int) -> Waiting | None:
    go_read, go_write = os.pipe()
    done_read, done_write = os.pipe()
    out = _early_file(f"mlptrain-worker-{index}")
    pid = os.fork()
    if pid:
        os.close(go_read)
        os.close(done_write)
        os.set_blocking(done_read, False)
        PLANNED[index] = Planned(pid, slot, go_write, done_read, out)
        return None
    os.close(go_write)
    os.close(done_read)
    for sibling in PLANNED.values():  # the earlier children's pipes and files: theirs and the command's alone
        os.close(sibling.go)
        os.close(sibling.done)
        os.close(sibling.out)
    PLANNED.clear()
    atexit.unregister(drop_planned)
    detach(slot)
    os.dup2(out, 1)
    os.dup2(out, 2)
    work_queues(share)
    start_driver()
    make_context_early(0)  # its only GPU
    import_numpy_alone()  # while the driver starts
    return Waiting(index, go_read, done_write, out)
