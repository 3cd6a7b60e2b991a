"""A trainer's trial source over pipes (mlptrain.sweep.trainer_pipe): every request answered in order, an error
raised where it was asked, the claims a trainer leaves without an outcome returned to the command, and a
command that is gone raised in the trainer, never a hang."""

import os
import threading
from concurrent.futures import Future

import pytest

from mlptrain.errors import UserError
from mlptrain.sweep.trainer_pipe import CommandGone, PipeTrials, serve
from mlptrain.sweep.trial_source import COMPLETE, Claim


class _Study:
    """A trial source as the command's: three trials, records kept, one report refused."""

    def __init__(self):
        self.queue = [Claim(n, 100 + n, {"optim.lr": 10.0 ** -n}) for n in range(3)]
        self.records, self.beats = [], []

    def claim(self):
        return self.queue.pop(0) if self.queue else None

    def running(self):
        return [1]

    def beating(self, claim):
        study = self

        class Beat:
            def __enter__(self):
                study.beats.append(("start", claim.number))

            def __exit__(self, *exc):
                study.beats.append(("stop", claim.number))
        return Beat()

    def set_run_dir(self, claim, run_dir):
        self.records.append(("run_dir", claim.number, run_dir))
        future = Future()
        future.set_result(None)
        return future

    def report(self, claim, value, epoch):
        if epoch == 2:
            raise OSError("journal: no space left on device")
        self.records.append(("report", claim.number, value, epoch))
        return Future() if False else _done(None)

    def should_prune(self, claim, value, epoch):
        return value < 0.5

    def requeue(self, claim):
        raise UserError("the study is gone")

    def tell(self, claim, state, metrics, value=None, error=None):
        self.records.append(("tell", claim.number, state, value))
        return _done(True)

    def trial_ended(self):
        self.records.append(("ended",))


def _done(value):
    future = Future()
    future.set_result(value)
    return future


def _connected():
    ask_read, ask_write = os.pipe()
    answers_read, answers_write = os.pipe()
    study = _Study()
    left = []
    server = threading.Thread(target=lambda: left.extend(serve(ask_read, answers_write, study)), daemon=True)
    server.start()
    return PipeTrials(ask_write, answers_read), study, server, left, (ask_read, answers_write)


def test_a_trainers_requests_are_answered_in_order_and_errors_raised_where_asked():
    trials, study, server, left, ends = _connected()
    first, second = trials.claim(), trials.claim()
    assert (first.number, first.trial_id, first.params) == (0, 100, {"optim.lr": 1.0})
    assert trials.running() == [1]
    written = [trials.set_run_dir(first, "runs/s/trial-0000"), trials.report(first, 0.9, 1)]
    refused = trials.report(first, 0.9, 2)
    assert trials.should_prune(second, 0.4, 1) is True and trials.should_prune(second, 0.6, 1) is False
    with pytest.raises(UserError, match="the study is gone"):
        trials.requeue(second)
    assert [f.result() for f in written] == [None, None]
    with pytest.raises(OSError, match="no space left"):
        refused.result()
    assert trials.tell(first, COMPLETE, {"val_acc": 0.9}, 0.9).result() is True
    trials.trial_ended()
    trials.close()  # the command's serve ends, and returns the claim left without an outcome
    server.join(10)
    assert not server.is_alive() and [c.number for c in left] == [1]
    assert study.records == [("run_dir", 0, "runs/s/trial-0000"), ("report", 0, 0.9, 1), ("tell", 0, COMPLETE, 0.9),
                             ("ended",)]
    assert study.beats == [("start", 0), ("start", 1), ("stop", 0), ("stop", 1)]  # the command beat them
    for fd in ends:
        os.close(fd)


def test_a_command_that_is_gone_is_raised_in_the_trainer_not_waited_for():
    ask_read, ask_write = os.pipe()
    answers_read, answers_write = os.pipe()
    trials = PipeTrials(ask_write, answers_read)
    os.close(answers_write)  # the command ended without an answer
    with pytest.raises(CommandGone):
        trials.claim()
    with pytest.raises(CommandGone):
        trials.report(Claim(0, 1, {}), 0.5, 1).result()
    os.close(ask_read)
    trials.close(check=False)
