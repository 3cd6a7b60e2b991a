"""A single-GPU sweep's trainer process (mlptrain.sweep.prefork forks it at the command's first line): the command's
side (`take` sends it its call, `serve` answers it from the study until it ends, `train_what_is_left` trains what a
killed trainer or another machine's dead worker left queued) and the trainer's (`train_for_the_command`)."""

from __future__ import annotations

import os
import signal
import threading
import time
from importlib import import_module
from pathlib import Path
from typing import NoReturn

import typer
from rich.markup import escape

from mlptrain.util.console import console


def take(call: dict):
    """The trainer process forked at the command's start (mlptrain.sweep.prefork), sent its `call`, where one
    was forked and is alive; otherwise None, and the sweep trains in this process (one that died before its
    call is said in one line)."""
    # the command's own modules, imported when it runs: --help and the other commands start without them
    from mlptrain.sweep.prefork import take_trainer

    trainer, words = take_trainer()
    if trainer is not None and trainer.send(call):
        return trainer
    if trainer is not None:
        words = trainer.last_words()
        trainer.stop()
    if words is not None:
        said = f" (its last words: {escape(words)})" if words else ""
        console.print(f"[yellow]warning:[/] the sweep's trainer process ended before the sweep began{said}: its "
                      "trials train in this process instead", highlight=False)
    return None


def train_for_the_command(waiting) -> NoReturn:
    """The trainer forked at a single-GPU sweep command's start (mlptrain.sweep.prefork): what its trials need
    is imported while the command reads the sweep file and opens the study; then it trains the sweep's
    trials, asking the command for each (mlptrain.sweep.trainer_pipe), and exits with its code, its output
    the command's. Without a call it exits at once."""
    # the command's own modules, imported when it runs: --help and the other commands start without them
    from mlptrain.sweep.forked import run_child

    try:
        import_module("mlptrain.sweep.engine")
        import_module("mlptrain.run_dirs.event_files").import_tensorboardx()  # tensorboardX, without torch
    except Exception:  # imported again where it is used, which reports the failure
        pass
    call = waiting.call()
    if call is None:
        os._exit(0)
    run_child(waiting.to_the_command_streams, lambda: _train(call, waiting), waiting.done)


def _train(call: dict, waiting) -> None:
    """In the trainer: the sweep's one worker, its trials from the command. Ctrl-C or SIGTERM (forwarded by
    the command) sets a stop: each trial is queued again after its step, then it is raised."""
    # the command's own modules, imported when it runs: --help and the other commands start without them
    from mlptrain.cli.signals import StopOnSignal, Terminated
    from mlptrain.config.load import config_from_dict
    from mlptrain.sweep.engine import run_packed, run_trials
    from mlptrain.sweep.spec import load_sweep
    from mlptrain.sweep.trainer_pipe import PipeTrials
    from mlptrain.training.experiment import Resources

    spec = load_sweep(Path(call["sweep_file"]), call["overrides"])
    sweep_dir, pack = Path(call["sweep_dir"]), call["pack"]
    source = PipeTrials(waiting.ask, waiting.answers)
    with StopOnSignal() as stop:
        try:
            view = Resources().on_gpu(0)  # as a worker thread's (mlptrain.sweep.threads)
            view.prepare(config_from_dict(spec.raw), logs=True)  # the data's refusals, before any trial
            if pack != 1:
                run_packed(lambda: source, spec, sweep_dir, view, pack, stop, source.claim_ahead)
            else:
                run_trials(source, spec, sweep_dir, view, wait_for_others=False, stop=stop)
        except BaseException:
            source.close(check=False)
            raise
        source.close()
    if stop.signum == signal.SIGINT:
        raise KeyboardInterrupt
    if stop.signum:
        raise Terminated(stop.signum)


def serve(trainer, study, study_storage, spec, sweep_dir, save) -> bool:
    """Serve the trainer process its trials from the study (mlptrain.sweep.trainer_pipe) until it ends, saving
    the results after each. Ctrl-C or SIGTERM here is passed on to it, and raised once it has queued its
    trials again. Returns False where it refused the sweep before taking a trial (it said why: exit code 2);
    raises typer.Exit with its code where it failed otherwise. A trainer killed outright leaves its trials
    queued again, for this process to train (`train_what_is_left`)."""
    # the command's own modules, imported when it runs: --help and the other commands start without them
    from mlptrain.cli.signals import Terminated
    from mlptrain.sweep.forked import POLL_S, Forked
    from mlptrain.sweep.study_trials import StudyTrials
    from mlptrain.sweep.threads import WAIT_S
    from mlptrain.sweep.trainer_pipe import serve as answer
    from mlptrain.sweep.trial_source import FAIL

    source = StudyTrials(study, study_storage, spec, on_trial_end=save)
    failed = []

    def serving():  # in a thread of its own: a signal lands in the main thread, never mid-write here
        try:
            for claim in answer(trainer.requests, trainer.answers, source):  # what a trainer that died held
                source.requeue(claim)
                source.tell(claim, FAIL, {}).result()
                console.print(f"trial {claim.number}: the trainer process ended during it; queued again")
        except BaseException as err:  # the study's storage, say: raised in the main thread
            failed.append(err)

    server = threading.Thread(target=serving, name="sweep-trainer-pipe", daemon=True)
    server.start()
    child, interrupted = Forked(trainer.pid, trainer.done), None
    trainer.done = None  # the Forked's now, which closes it
    while server.is_alive() or child.poll() is None:
        try:  # timed waits: a signal still reaches this (the main) thread
            if server.is_alive():
                server.join(WAIT_S)
            else:
                time.sleep(POLL_S)
        except KeyboardInterrupt as err:  # each trial is queued again once its step is done, there
            interrupted = interrupted or err
            child.send_signal(getattr(err, "signum", signal.SIGINT))
    trainer.close()  # its pipes; the process has said its code and ends on its own (the driver's teardown)
    code = child.returncode
    if interrupted is not None:
        raise interrupted
    if failed:
        raise failed[0]
    if code == 0:
        return True
    if code == 2 and not source.claimed:
        return False
    if code in (128 + signal.SIGINT, 128 + signal.SIGTERM, 128 + signal.SIGHUP):  # stopped from elsewhere
        raise Terminated(code - 128) if code != 128 + signal.SIGINT else KeyboardInterrupt
    if code > 0:  # it said what failed
        raise typer.Exit(code)
    console.print(f"[yellow]warning:[/] the sweep's trainer process was killed ({signal.Signals(-code).name}); "
                  "its trials train in this process instead", highlight=False)
    return True


def train_what_is_left(study, study_storage, spec, sweep_dir, save) -> None:
    """After a trainer process: the trials left queued (it was killed) or running elsewhere (other machines'
    workers: when one dies, its trial is queued again and run here), trained in this process."""
    # the command's own modules, imported when it runs: --help and the other commands start without them
    from optuna.trial import TrialState

    from mlptrain.backends.driver.early import start_driver

    if not study.get_trials(deepcopy=False, states=(TrialState.WAITING, TrialState.RUNNING)):
        return  # nothing left: the training's modules are not imported
    start_driver()
    # imported when used: the training's modules
    from mlptrain.sweep.engine import work
    from mlptrain.training.experiment import Resources

    work(study, study_storage, spec, sweep_dir, Resources().on_gpu(0), on_trial_end=save)
