"""A trainer's trial source over pipes (mlptrain.sweep.trainer_pipe): every request answered in order, an error
raised where it was asked, the claims a trainer leaves without an outcome returned to the command, and a
command that is gone raised in the trainer, never a hang."""

import os
import threading
from concurrent.futures import Future

import pytest

from mlptrain.errors import UserError
from mlptrain.sweep.trainer_pipe import CommandGone, PipeTrials, serve
from mlptrain.sweep.trial_source import COMPLETE, FAIL, Claim


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


def _connected(study=None):
    ask_read, ask_write = os.pipe()
    answers_read, answers_write = os.pipe()
    study = _Study() if study is None else study
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


class _Requeued(_Study):
    def requeue(self, claim):
        self.records.append(("requeue", claim.number))


def test_claims_asked_ahead_serve_the_slots_in_order_and_those_no_slot_took_are_queued_again():
    """A packed trainer asks for its slots' first claims at once (PipeTrials.claim_ahead); a slot that stopped before
    taking its claim leaves it queued again and told FAIL, as an interrupted trial is, not running in the study."""
    trials, study, server, left, ends = _connected(_Requeued())
    trials.claim_ahead(2)
    assert trials.claim().number == 0  # the first asked ahead
    trials.close()  # the second slot stopped before it claimed
    server.join(10)
    assert not server.is_alive() and [c.number for c in left] == [0]  # the taken one had no outcome yet
    assert study.records == [("requeue", 1), ("tell", 1, "fail", None)]
    assert study.queue and study.queue[0].number == 2  # asked ahead for two slots, not more
    for fd in ends:
        os.close(fd)


class _Counted(_Requeued):
    """Counts the claims it is asked for."""

    def __init__(self):
        super().__init__()
        self.asked = 0

    def claim(self):
        self.asked += 1
        return super().claim()


def test_once_none_is_left_a_claim_asks_no_more_until_the_trainer_queues_one_again():
    """A packed group's lanes end together, each claiming its next trial: once the command has said none is left,
    the other slots are told so without a round trip each; a trial this trainer queues again (a lane that does not
    fit) is asked for again, and found."""
    trials, study, server, left, ends = _connected(_Counted())
    taken = [trials.claim() for _ in range(3)]
    assert [c.number for c in taken] == [0, 1, 2] and study.asked == 3
    assert trials.claim() is None and study.asked == 4  # asked: the command says none is left
    assert [trials.claim() for _ in range(5)] == [None] * 5 and study.asked == 4  # not asked again
    trials.requeue(taken[2])  # queued again by this trainer, as a lane that does not fit is, and told FAIL
    trials.tell(taken[2], FAIL, {}).result()
    study.queue.append(taken[2])  # (this study only records a requeue)
    again = trials.claim()
    assert again.number == 2 and study.asked == 5
    assert trials.claim() is None and trials.claim() is None and study.asked == 6
    for claim in (*taken[:2], again):
        trials.tell(claim, COMPLETE, {}, 0.5).result()
    trials.close()
    server.join(10)
    assert not server.is_alive() and left == []
    for fd in ends:
        os.close(fd)


class _Saving(_Study):
    """Saves its results at each trial's end; the save of `refuse` (its count) fails."""

    def __init__(self, refuse=None):
        super().__init__()
        self.saves, self.refuse = [], refuse

    def trial_ended(self):
        told = [r[1] for r in self.records if r[0] == "tell"]
        self.saves.append(told)
        if len(self.saves) == self.refuse:
            raise OSError("results.json: no space left on device")


@pytest.mark.parametrize("refuse", [None, 1])
def test_trial_ends_that_come_together_save_the_results_once_for_all(refuse):
    """Where the trainer's next requests wait already (a packed group's lanes end at once), the results are saved
    once they are answered, not at each trial's end; the save still follows every tell before it. A save that
    fails then is raised by the command once the trainer is done, every request answered meanwhile."""
    ask_read, ask_write = os.pipe()
    answers_read, answers_write = os.pipe()
    study, out = _Saving(refuse), []

    def command():
        try:
            out.append(serve(ask_read, answers_write, study))
        except OSError as err:
            out.append(err)

    trials = PipeTrials(ask_write, answers_read)
    for number in range(3):  # three ends queued before the command reads the first
        claim = Claim(number, 100 + number, {})
        trials.tell(claim, COMPLETE, {}, 0.5)
        trials.trial_ended()
    after = trials.set_run_dir(claim, "runs/s/trial-0003")  # a request after the ends
    server = threading.Thread(target=command, daemon=True)
    server.start()
    assert after.result() is None
    trials.close()
    server.join(10)
    assert not server.is_alive()
    assert study.saves[-1] == [0, 1, 2] and len(study.saves) < 3  # after every tell, fewer saves than ends
    if refuse:
        assert isinstance(out[0], OSError) and "no space left" in str(out[0])
    else:
        assert out == [[]]
    for fd in (ask_read, answers_write):
        os.close(fd)
