"""One thread beats for every trial a process trains (mlptrain.sweep.heartbeats): each on its own schedule,
none after its trial left, a failing beat said once a trial."""

import threading
import time

from mlptrain.sweep import claims
from mlptrain.sweep.heartbeats import Heartbeats


class Recording:
    def __init__(self, fail_for=()):
        self.beats, self.fail_for, self.lock = [], set(fail_for), threading.Lock()

    def __call__(self, storage, trial_id):
        if trial_id in self.fail_for:
            raise RuntimeError("database is locked")
        with self.lock:
            self.beats.append((trial_id, time.monotonic()))

    def of(self, trial_id):
        return [t for i, t in self.beats if i == trial_id]


def test_every_trial_beats_on_its_schedule_from_one_thread_and_never_after_it_left(monkeypatch):
    beats = Recording()
    monkeypatch.setattr(claims, "beat", beats)
    hearts = Heartbeats(every=0.05)
    def beating_threads():  # those of other Heartbeats (earlier tests') run on: they never end
        return sum(thread.name == "mlptrain-heartbeats" for thread in threading.enumerate())

    before = beating_threads()
    with hearts.beating("storage", 1):
        time.sleep(0.02)
        with hearts.beating("storage", 2), hearts.beating("storage", 3):
            assert beating_threads() == before + 1  # one thread for the three of them
            time.sleep(0.28)
        left = time.monotonic()
        time.sleep(0.12)
    ended = time.monotonic()
    time.sleep(0.15)
    for trial in (1, 2, 3):
        times = beats.of(trial)
        assert len(times) >= 2
        assert all(b - a >= 0.03 for a, b in zip(times, times[1:]))  # HEARTBEAT_S apart, not bunched up
    assert all(t <= left for t in beats.of(2) + beats.of(3))
    assert all(t <= ended for t in beats.of(1)) and len(beats.of(1)) > len(beats.of(2))


def test_a_failing_heartbeat_warns_once_a_trial(monkeypatch, capsys):
    monkeypatch.setattr(claims, "beat", Recording(fail_for={7, 8}))
    hearts = Heartbeats(every=0.02)
    with hearts.beating("storage", 7), hearts.beating("storage", 8):
        time.sleep(0.2)
    captured = capsys.readouterr()
    said = " ".join((captured.out + captured.err).split())
    assert said.count("the trial's heartbeat failed (RuntimeError: database is locked)") == 2


def test_a_trial_leaving_waits_for_its_beat_under_way(monkeypatch):
    started, release = threading.Event(), threading.Event()

    def slow(storage, trial_id):
        started.set()
        release.wait(5)

    monkeypatch.setattr(claims, "beat", slow)
    hearts = Heartbeats(every=0.01)
    done = []

    def trial():
        with hearts.beating("storage", 1):
            started.wait(5)
        done.append(time.monotonic())

    runner = threading.Thread(target=trial)
    runner.start()
    assert started.wait(5)
    time.sleep(0.05)
    assert not done  # its beat is under way: leaving waits for it
    release.set()
    runner.join(5)
    assert done
