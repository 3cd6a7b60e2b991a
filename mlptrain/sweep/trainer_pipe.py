"""A single-GPU sweep's trainer process and its command, talking over two pipes.

The command forks the trainer at its first line (mlptrain.sweep.prefork): the trainer starts CUDA and imports
what training needs while the command reads the sweep file, imports Optuna (a quarter of a second on the GPU
machine, holding the interpreter) and opens the study. The trainer then runs the sweep's worker
(mlptrain.sweep.engine) with a `PipeTrials` as its trial source: each claim, run folder, report, pruning
question, requeue and outcome is a message to the command, which answers it from the study
(mlptrain.sweep.study_trials) in `serve`, beats the claimed trials' heartbeats, and saves the results after
each trial. So Optuna is never imported where the trials train, and the study's journal appends are written
by another process than the one feeding the GPU.

A message is a pickled (name, arguments) tuple after its length; each is answered, in the order asked, with
("ok", value) or ("raise", exception). Both processes are the same program, started from one interpreter.
"""

from __future__ import annotations

import os
import pickle
import select
import struct
import threading
from collections import deque
from concurrent.futures import Future
from contextlib import ExitStack, nullcontext

from mlptrain.sweep.trial_source import FAIL

HEADER = struct.Struct("!I")  # a message's length in bytes
ASKED = ("claim", "running", "set_run_dir", "report", "should_prune", "requeue", "tell", "trial_ended")


class CommandGone(KeyboardInterrupt):
    """The sweep's command ended (or closed the pipe) before it answered. The trainer stops as a Ctrl-C stops
    it, quietly: not a trial's failure, and nothing to tell (the command, which would report it, is gone, and
    a re-run queues its trials again once their heartbeats have lapsed)."""

    def __init__(self):
        super().__init__("the sweep's command ended")


def send(fd: int, message) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def receive(fd: int):
    """The next message from `fd`, or None once the other end is closed."""
    header = _read(fd, HEADER.size)
    if header is None:
        return None
    body = _read(fd, HEADER.unpack(header)[0])
    return None if body is None else pickle.loads(body)


def _read(fd: int, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = os.read(fd, left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class PipeTrials:
    """In the trainer: a trial source (mlptrain.sweep.trial_source) that asks the command over the pipes `ask`
    (written) and `answers` (read). The command beats the heartbeats of the trials it handed out."""

    def __init__(self, ask: int, answers: int):
        self._ask, self._answers = ask, answers
        self._lock = threading.Lock()  # a request and its place in the queue of answers, together
        self._waiting: deque[Future] = deque()
        self._gone = False
        self._ended: list[Future] = []  # the trial_ended calls, whose errors `close` raises
        self._ahead: deque[Future] = deque()  # claims asked for before a slot needed them (`claim_ahead`)
        self._none_left = False  # the command answered a claim with none, and this trainer queued none again since
        threading.Thread(target=self._read_answers, name="mlptrain-sweep-answers", daemon=True).start()

    def _read_answers(self) -> None:
        try:
            while (answer := receive(self._answers)) is not None:
                kind, value = answer
                future = self._waiting.popleft()
                if kind == "ok":
                    future.set_result(value)
                else:
                    future.set_exception(value)
        except (OSError, EOFError, pickle.UnpicklingError):  # the command died mid-answer
            pass
        with self._lock:
            self._gone = True
            while self._waiting:
                self._waiting.popleft().set_exception(CommandGone())

    def _call(self, name: str, *args) -> Future:
        future = Future()
        with self._lock:
            if self._gone:
                future.set_exception(CommandGone())
                return future
            self._waiting.append(future)
            try:
                send(self._ask, (name, args))
            except OSError:  # the command closed its end: it is gone
                self._waiting.remove(future)
                future.set_exception(CommandGone())
        return future

    def claim_ahead(self, count: int) -> None:
        """Ask now for the claims of `count` slots about to start (a packed worker's, each claiming first): the command
        answers them while the first trials' sessions are built, where one round trip between two sessions cost
        ~3-4 ms of a packed sweep's start, 16 times (benchmarks/NOTES.md, issue 30 step 29)."""
        self._ahead.extend(self._call("claim") for _ in range(count))

    def claim(self):
        """The next trial, or None where none is left. Once the command has said none is left, a later claim is
        None without asking, until this trainer queues a trial again (`requeue`): its slots ask for no more once
        told none (they do not wait for others'), and a packed group's 16 lanes, ending together, waited ~25 ms
        at a sweep's end for one round trip each, behind their tells (benchmarks/NOTES.md, issue 30 step 30)."""
        if self._none_left and not self._ahead:
            return None
        claim = (self._ahead.popleft() if self._ahead else self._call("claim")).result()
        self._none_left = claim is None
        return claim

    def running(self) -> list[int]:
        return self._call("running").result()

    def beating(self, claim):
        return nullcontext()  # the command beats it (`serve`)

    def set_run_dir(self, claim, run_dir: str) -> Future:
        return self._call("set_run_dir", claim, run_dir)

    def report(self, claim, value: float, epoch: int) -> Future:
        return self._call("report", claim, value, epoch)

    def should_prune(self, claim, value: float, epoch: int) -> bool:
        return self._call("should_prune", claim, value, epoch).result()

    def requeue(self, claim) -> None:
        self._none_left = False  # a slot still running may take it
        self._call("requeue", claim).result()

    def tell(self, claim, state: str, metrics: dict, value=None, error: str | None = None) -> Future:
        return self._call("tell", claim, state, metrics, value, error)

    def trial_ended(self) -> None:
        self._ended.append(self._call("trial_ended"))  # the results saved behind the next trials' training

    def close(self, check: bool = True) -> None:
        """Once the trainer's work is done: the claims asked ahead that no slot took (it stopped first) queued again,
        as an interrupted trial is; the results' saves waited for (`check`: the first error raised); then the pipe
        closed, which ends the command's `serve`."""
        try:
            self._give_back_ahead(quiet=not check)
            for future in self._ended if check else ():
                future.result()
        finally:
            os.close(self._ask)

    def _give_back_ahead(self, quiet: bool) -> None:
        """`quiet`: an error here is not raised (the trainer is failing already, with the error that matters)."""
        while self._ahead:
            try:
                claim = self._ahead.popleft().result()
                if claim is not None:
                    self.requeue(claim)
                    self.tell(claim, FAIL, {}).result()
            except CommandGone:  # nothing to give back to: a re-run queues them again once their heartbeats lapse
                return
            except Exception:
                if not quiet:
                    raise


def serve(requests: int, answers: int, source) -> list:
    """In the command: answer the trainer's requests from `source` (a StudyTrials), in the order they come, each
    written before the next is read, until the trainer closes its pipe; each trial it claims beats its heartbeat
    here until its outcome is told. Returns the claims it left without an outcome (it died, or the command stops).

    A trial's end saves the sweep's results (`trial_ended`); where the trainer's next requests wait already (a
    packed group's lanes end together: 16 tells, saves and claims in a row), the save is made once they are
    answered, for all of them: each save reads every trial and writes two files. Its error is then raised here
    once the trainer is done, where the trainer would have raised it."""
    beating: dict[int, tuple] = {}  # by trial id: (its claim, its heartbeat's context)
    owed, failed = False, []  # a results' save put off while requests waited; its error
    try:
        while True:
            if owed and not _waiting(requests):
                owed = False
                _save(source, failed)
            try:
                request = receive(requests)
            except (OSError, EOFError, pickle.UnpicklingError):  # the trainer died mid-request
                request = None
            if request is None:
                break
            name, args = request
            try:
                if name not in ASKED:
                    raise ValueError(f"the sweep's trainer asked for {name!r}")
                if name == "trial_ended" and _waiting(requests):
                    owed, value = True, None
                else:
                    value = getattr(source, name)(*args)
                if isinstance(value, Future):
                    value = value.result()
                if name == "claim" and value is not None:
                    stack = ExitStack()
                    stack.enter_context(source.beating(value))
                    beating[value.trial_id] = value, stack
                elif name == "tell" and args[0].trial_id in beating:
                    beating.pop(args[0].trial_id)[1].close()
                answer = ("ok", value)
            except Exception as err:  # the trainer raises it where it asked
                answer = ("raise", err)
            try:
                _answer(answers, answer)
            except OSError:  # the trainer closed its end: it is ending
                break
        if owed:
            _save(source, failed)
    finally:
        for _, stack in beating.values():
            stack.close()
    if failed:
        raise failed[0]
    return [claim for claim, _ in beating.values()]


def _waiting(fd: int) -> bool:
    """Whether a request can be read from `fd` now."""
    return bool(select.select([fd], [], [], 0)[0])


def _save(source, failed: list) -> None:
    try:
        source.trial_ended()
    except Exception as err:  # kept for the end: the requests after it are still answered
        failed.append(err)


def _answer(fd: int, answer) -> None:
    try:
        send(fd, answer)
    except (pickle.PicklingError, TypeError, AttributeError) as err:  # an exception that cannot be pickled
        send(fd, ("raise", RuntimeError(f"{type(answer[1]).__name__}: {answer[1]} ({err})")))
