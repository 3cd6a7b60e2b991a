"""`mlptrain sweep SWEEP [KEY=VALUE ...]`: run a sweep's trials (or the rest of them), then rank them."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
from datetime import datetime
from importlib import import_module
from pathlib import Path
from typing import List, NoReturn, Optional

import typer
from rich.markup import escape

from mlptrain.cli.configs import unknown_builtin
from mlptrain.config.builtins import builtin_sweeps
from mlptrain.cli.signals import interrupt_exit_code, sigterm_as_interrupt
from mlptrain.errors import UserError
from mlptrain.run_dirs.folders import check_run_name
from mlptrain.util.console import console

MAX_WORKERS = 256  # processes on one machine; more machines share a study through --storage


def resolve_sweep(name_or_path: str) -> Path:
    """A sweep file, or a built-in sweep by name (`sweep_lr_mnist`, `configs/sweep_lr_mnist.yaml` from anywhere)."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    builtin = builtin_sweeps().get(path.stem)
    if builtin is None or str(path.parent) not in (".", "configs"):
        raise unknown_builtin(name_or_path, "sweep", list(builtin_sweeps()))
    return builtin


def sweep(
    sweep_file: str = typer.Argument(..., metavar="SWEEP", help="a sweep YAML file or a built-in sweep name"),
    overrides: Optional[List[str]] = typer.Argument(None, help="KEY=VALUE overrides for every trial"),
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="folder that holds the sweep's folder"),
    name: Optional[str] = typer.Option(None, "--name", help="sweep name (default: the sweep file's name); "
                                       "re-running a sweep continues it"),
    storage: Optional[str] = typer.Option(None, "--storage", metavar="URL|FILE",
                                          help="the study that workers share: a database URL Optuna takes, or a "
                                          "journal file (default: study.journal in the sweep's folder)"),
    workers: int = typer.Option(1, "--workers", help="trials at once on this machine: threads on its GPUs in turn "
                                "(several on one GPU when there are more workers), processes on the CPU"),
    worker: bool = typer.Option(False, "--worker", hidden=True,
                                help="started by a sweep command of this machine, which opened the study: take "
                                     "trials until none is queued, then exit"),
    pack: str = typer.Option("1", "--pack", metavar="K|auto",
                             help="trials each worker trains at once from one thread (MLPs in lanes, one launch for "
                             "each kernel of all their steps; other models side by side, their kernels overlapping "
                             "on its GPU); auto: as many as add throughput, measured on its GPU once"),
) -> None:
    """Run a hyperparameter sweep; writes runs/<name>/ (a run per trial, results.json, results.csv)."""
    # the command's own modules, imported when it runs: --help and the other commands start without them;
    # none of these starts a thread or imports NumPy, so that a process per GPU can be forked below
    from mlptrain.backends.driver.early import start_driver
    from mlptrain.config.load import config_from_dict
    from mlptrain.sweep.gpu_processes import gpu_shares, process_per_gpu, visible_slots
    from mlptrain.sweep.prefork import drop_planned, trainer_planned
    from mlptrain.sweep.spec import load_sweep
    from mlptrain.sweep.storage import absolute, check_storage, default_storage
    from mlptrain.packing.side_by_side import check_pack
    from mlptrain.cli import sweep_trainer

    began = datetime.now()  # trials its workers finish from now on are reported (Optuna's clock)
    if (workers == 1 or worker) and not trainer_planned():  # nothing to fork: the driver's start while the sweep
        start_driver()  # file is read (a trainer forked at the command's start starts its own)
    path = resolve_sweep(sweep_file)
    spec = load_sweep(path, overrides or [])
    name = check_run_name(name if name is not None else path.stem)
    if not 1 <= workers <= MAX_WORKERS:
        raise UserError(f"--workers {workers}: must be in [1, {MAX_WORKERS}]")
    pack = check_pack(pack)
    if storage is not None:  # before the data is loaded: a mistyped --storage is refused at once
        check_storage(storage)
    sweep_dir = runs_dir / name
    base_config, created = config_from_dict(spec.raw), not sweep_dir.exists()
    url = absolute(storage) if storage is not None else default_storage(sweep_dir)
    command = [sys.executable, "-m", "mlptrain", "sweep", str(path), *(overrides or []), "--runs-dir",
               str(runs_dir), "--name", name, "--storage", url, "--workers", "1", "--pack", str(pack), "--worker"]
    children, forked, pool, trainer = {}, None, None, None  # forked: (the GPUs' CUDA_VISIBLE_DEVICES, each one's share)
    try:
        slots = visible_slots() if not worker and base_config.backend != "cpu" and workers > 1 else None
        if slots and process_per_gpu(workers, len(slots)):
            # first, before this process starts CUDA or a thread: the children start where it stands
            forked = _fork_gpu_processes(children, sweep_file, overrides, runs_dir, name, url, sweep_dir, slots,
                                         gpu_shares(workers, len(slots)), pack)
        if workers == 1 and not worker and base_config.backend != "cpu":
            trainer = sweep_trainer.take(dict(sweep_file=str(path), overrides=overrides or [],
                                              sweep_dir=str(sweep_dir), pack=pack))
        drop_planned()  # children forked at the command's start that it does not use (a CPU sweep, say)
        # a trainer process trains on the GPU: none of this here
        pool, resources, shares = (None, None, None) if trainer else _start_here(base_config, workers, worker, forked)
        # Optuna takes a quarter second to import: only this command pays (on the CPU, after its children start)
        from mlptrain.sweep import study as studies
        from mlptrain.sweep.report import show_results, trial_rows, write_results
        from mlptrain.sweep.workers import announce, blas_share, gpu_slots, start_workers

        # the training's modules (0.1-0.3 s of imports): not where a trainer process trains
        engine = None if trainer else import_module("mlptrain.sweep.engine")

        gpus = len(pool.devices) if pool is not None else 0
        processes = len(shares) if shares else workers if pool is None else 1
        slots = forked[0] if forked else gpu_slots(base_config.backend) if processes > 1 else [None]
        _make_folder(sweep_dir)
        if base_config.logging.mlflow and not worker:  # the store made once, before workers write to it
            # imported on first use: only sweeps that log to MLflow need it
            from mlptrain.run_dirs.mlflow_log import connect

            connect(base_config.logging, sweep_dir)
        if processes > 1 and not forked:  # first: their start (imports, data) overlaps ours; they wait for the study
            children = start_workers(command, processes, slots, sweep_dir, first=1, threads=shares,
                                     env=None if gpus else blas_share(processes))
        study, study_storage = studies.open_study(spec, sweep_dir, name, url, worker=worker)
        if forked:  # the data's refusals, once the children may start (a refusal removes a new study again);
            # the children ask the driver for their own GPUs: no CUDA driver started here
            # imported when used: numpy and the data loaders
            from mlptrain.training.experiment import check_inputs

            check_inputs(base_config, resources, ask_driver=False)
            announce(processes, slots, sweep_dir, threads=shares)
    except BaseException:
        if trainer is not None:
            trainer.stop()  # it has taken no trial: nothing of its work is anyone's
        _stop_children(children)
        if pool is not None:
            _end_threads(pool, base_config, pool.cancel)
        if created:  # nothing of a sweep refused or interrupted before its first trial is left
            shutil.rmtree(sweep_dir, ignore_errors=True)
        raise

    def save():  # after each trial; the sweep's end (or Ctrl-C) writes them durably
        write_results(sweep_dir, spec, trial_rows(study, spec), durable=False)

    problems = []
    try:
        with sigterm_as_interrupt():
            if trainer is not None:
                if pack != 1:
                    console.print(f"one worker{packed(pack)}")
                if not sweep_trainer.serve(trainer, study, study_storage, spec, sweep_dir, save) and created:
                    shutil.rmtree(sweep_dir, ignore_errors=True)  # refused before its first trial: nothing left
                    raise typer.Exit(2)
                sweep_trainer.train_what_is_left(study, study_storage, spec, sweep_dir, save)
            elif forked or (pool is not None and children):  # a process per GPU
                problems = _work_in_processes(engine, pool, study, study_storage, spec, sweep_dir, resources, save,
                                              base_config, command, children, slots, shares, began, pack)
            elif pool is not None:
                _work_in_threads(engine, pool, study, study_storage, spec, sweep_dir, resources, save, workers,
                                 base_config, worker, pack)
            else:
                problems = _work(engine, study, study_storage, spec, sweep_dir, resources, save, workers, command,
                                 worker, children, slots, began, pack)
    except KeyboardInterrupt as err:  # Ctrl-C or SIGTERM: every running trial is queued again
        write_results(sweep_dir, spec, trial_rows(study, spec))
        console.print(f"interrupted: re-run the same command to continue {sweep_dir} (finished trials are kept)")
        raise typer.Exit(interrupt_exit_code(err))
    if worker:  # this machine's sweep command writes the results and shows the table once its workers end
        studies.close_storage(study_storage)
        return
    rows = trial_rows(study, spec)
    write_results(sweep_dir, spec, rows)
    studies.close_storage(study_storage)
    show_results(rows, spec, f"{name}: {len(rows)} trials ranked by {spec.metric} ({spec.direction})")
    for row in rows:
        if row["error"]:
            console.print(f"trial {row['number']} failed: {row['error']}", highlight=False)
    console.print(f"results in {sweep_dir}/results.json and results.csv (tensorboard --logdir {sweep_dir})")
    if problems:
        raise UserError("; ".join(problems))


def _fork_gpu_processes(children: dict, sweep_file, overrides, runs_dir, name, url, sweep_dir, slots, shares,
                        pack: int | str):
    """Fork a process for each GPU (mlptrain.sweep.forked), each a `--worker` of this sweep that runs its share
    of the workers as threads, into `children`: this process then trains on none of them (_work_in_processes).
    Returns (slots, shares), or None where this process cannot fork cleanly (a thread already runs here: an
    embedding program's), and its children are then started from nothing once it has counted the GPUs. The
    command forked them at its start already where its arguments said it would (mlptrain.sweep.prefork):
    those are sent their calls."""
    # the command's own modules, imported when it runs: --help and the other commands start without them
    from mlptrain.sweep.forked import Forked, fork_child, open_log
    from mlptrain.sweep.gpu_processes import can_fork
    from mlptrain.sweep.prefork import take_planned

    def call(i):  # the same command as a `--worker` with its share: see `command` in sweep()
        return dict(sweep_file=sweep_file, overrides=overrides or [], runs_dir=str(runs_dir), name=name, url=url,
                    share=shares[i], pack=pack, log=str(sweep_dir / f"worker-{i}.log"))

    planned, ended = take_planned(slots[:len(shares)])
    if planned is None and not can_fork():  # the driver has started here: the workers are threads instead
        for slot, words in ended:
            said = f" (its last words: {escape(words)})" if words else ""
            console.print(f"[yellow]warning:[/] the process forked for GPU {slot} ended before the sweep began{said}: "
                          "every GPU's workers run as threads of this process instead", highlight=False)
        return None
    _make_folder(sweep_dir)
    if planned is not None:
        for i in sorted(planned):
            open_log(Path(call(i)["log"])).close()  # refused here, in one line, when it cannot be written
        for i, child in sorted(planned.items()):
            child.send(call(i))  # one that died since take_planned is seen as a dead worker
            children[i] = Forked(child.pid, child.done)
        return slots, shares
    for i in range(len(shares)):
        children[i] = fork_child(lambda c=call(i): _as_worker(c), sweep_dir / f"worker-{i}.log", slots[i])
    return slots, shares


def _as_worker(call: dict) -> None:
    """A forked child's part of the sweep: the command's `call` (see _fork_gpu_processes) as a `--worker`."""
    sweep(call["sweep_file"], call["overrides"], Path(call["runs_dir"]), call["name"], call["url"], call["share"],
          True, call["pack"])


def serve_planned(waiting) -> NoReturn:
    """A child forked at the command's start (mlptrain.sweep.prefork): what its trials need is imported while
    the command reads the sweep file; then it runs the command's call, a `--worker` of the sweep with its
    share of the workers, and exits with its code (mlptrain.sweep.forked). Without a call it exits at once.
    A single-GPU sweep's trainer: mlptrain.cli.sweep_trainer."""
    # the command's own modules, imported when it runs: --help and the other commands start without them
    from mlptrain.sweep.forked import open_log, run_child
    from mlptrain.sweep.prefork import early_output

    if waiting.trainer:
        # imported here: only a single-GPU sweep's trainer runs it
        from mlptrain.cli.sweep_trainer import train_for_the_command

        train_for_the_command(waiting)

    try:
        import_module("mlptrain.training.experiment")
        import_module("mlptrain.sweep.engine")
        import_module("mlptrain.run_dirs.event_files").import_tensorboardx()  # tensorboardX, without torch
    except Exception:  # imported again where it is used, which reports the failure in the worker's log
        pass
    call = waiting.call()
    if call is None:
        os._exit(0)

    def start():  # its log, which starts with what it wrote before its call (warnings of its imports)
        log = open_log(Path(call["log"]))
        log.write(early_output(waiting.out))
        log.flush()
        os.close(waiting.out)
        return log

    run_child(start, lambda: _as_worker(call), waiting.done)


def _start_here(base_config, workers: int, worker: bool, forked):
    """This process's start once any children are forked: the CUDA driver and contexts, the data's checks,
    and on GPUs the worker threads (their contexts made while Optuna is imported and the study opened); with
    `forked` children on every GPU, none of these: the command checks the data once it has opened the study,
    which the children wait for. Returns (the threads or None, the resources, each process's share of the
    workers or None)."""
    # the command's own modules, imported when it runs: --help and the other commands start without them
    from mlptrain.backends.driver.early import start_driver

    if forked:  # no CUDA here (see mlptrain.sweep.prefork)
        # imported when used: numpy and the data loaders
        from mlptrain.training.experiment import Resources

        return None, Resources(), forked[1]
    start_driver()  # first, in a thread, once (a sweep with nothing to fork started it already)
    # then the rest, NumPy's import among them, while the driver starts
    from mlptrain.sweep.gpu_processes import gpu_shares, process_per_gpu
    from mlptrain.sweep.threads import TrialThreads, make_contexts_early, thread_gpus
    from mlptrain.training.experiment import Resources, check_inputs  # numpy and the data loaders: when used

    resources = Resources()
    if base_config.backend != "cpu":
        # the GPU contexts the workers will use, made from now on beside Optuna's import
        threading.Thread(target=make_contexts_early, args=(workers, forked is not None), name="cuda-contexts",
                         daemon=True).start()
        # imported anyway, and now while the driver starts: cuInit does not hold the interpreter (a CPU
        # sweep imports it after its child workers have started instead)
        import_module("mlptrain.sweep.engine")
    gpus = thread_gpus(base_config.backend)  # > 0: the workers are threads of this process
    if workers == 1 and not gpus:
        resources.prepare(base_config)  # refusals before the sweep's folder exists
    else:  # the same refusals, without a GPU context: each worker makes its own
        check_inputs(base_config, resources)
    # a process per GPU started from nothing, asked for where this one could not fork (mlptrain.sweep.threads),
    # each with its share of the workers as threads: this process takes the first GPU's share
    started = not worker and process_per_gpu(workers, gpus, forking=False)
    shares = gpu_shares(workers, gpus) if started else None
    pool = TrialThreads(shares[0] if shares else workers, 1 if shares else gpus, resources,
                        lambda view: view.prepare(base_config, logs=True)) if gpus else None
    return pool, resources, shares


def _stop_children(children: dict) -> None:
    """Stop a sweep's children that its command started or forked (each queues its trial again), and wait
    for them."""
    if children:
        # the command's own modules, imported when it runs: --help and the other commands start without them
        from mlptrain.sweep.workers import stop_workers

        stop_workers(list(children.values()), signal.SIGTERM)


def _trials_in_thread(engine, study, study_storage, spec, sweep_dir, save, progress: bool,
                      pack: int | str):
    """What each worker thread runs: take trials until none is queued (`pack` at once, side by side), saving the
    results after each."""
    saving = threading.Lock()

    def save_in_order():  # threads finish trials at once: each write holds the study's latest rows
        with saving:
            save()

    def in_thread(view, stop):
        if pack != 1:
            engine.work_packed(study, study_storage, spec, sweep_dir, view, pack, on_trial_end=save_in_order,
                               stop=stop)
        else:
            engine.work(study, study_storage, spec, sweep_dir, view, on_trial_end=save_in_order,
                        wait_for_others=False, stop=stop, progress=progress)

    return in_thread


def _work_in_threads(engine, pool, study, study_storage, spec, sweep_dir, resources, save, workers, base_config,
                     worker, pack: int | str) -> None:
    """The trials in `pool`'s threads (mlptrain.sweep.threads), then, unless this is a `--worker` child, the
    trials of other machines' workers that died meanwhile."""
    # several trials at once: a terminal holds one bar
    in_thread = _trials_in_thread(engine, study, study_storage, spec, sweep_dir, save, workers == 1, pack)
    if workers > 1:
        gpus = len(pool.devices)
        console.print(f"{workers} workers in this process on {gpus} GPU{'s' if gpus > 1 else ''} "
                      f"({-(-workers // gpus)} at most on each){packed(pack)}")
    elif pack != 1:
        console.print(f"one worker{packed(pack)}")
    _end_threads(pool, base_config, lambda: pool.run(in_thread))
    if not worker:  # trials other machines run: when one's worker dies, its trial is queued again and run here
        engine.work(study, study_storage, spec, sweep_dir, resources.on_gpu(0), on_trial_end=save)


def _work_in_processes(engine, pool, study, study_storage, spec, sweep_dir, resources, save, base_config, command,
                       children, slots, shares, began, pack: int | str) -> list[str]:
    """`children`, a process per GPU, run the trials: forked ones every GPU's share while this process only
    watches them (`pool` None: it reports and saves their trials as they finish), started ones the other
    GPUs' shares while this process's threads (`pool`) run the first GPU's. Then the trials of other
    machines' workers that died meanwhile run here (on the first GPU; a context made only then where this
    process had none). Returns a line per failed child."""
    # the command's own modules, imported when it runs: --help and the other commands start without them
    from mlptrain.sweep.workers import run_workers

    here = None
    if pool is not None:
        in_thread = _trials_in_thread(engine, study, study_storage, spec, sweep_dir, save, False, pack)

        def here():
            _end_threads(pool, base_config, lambda: pool.run(in_thread))
    problems = run_workers(command, len(shares), slots, sweep_dir, study, spec, study_storage, procs=children,
                           threads=shares, here=here, on_report=save if pool is None else None, since=began)
    engine.work(study, study_storage, spec, sweep_dir, resources.on_gpu(0), on_trial_end=save)
    return problems


def _end_threads(pool, base_config, finish) -> None:
    """finish() (the pool's run or cancel), then leave the GPUs' contexts to the driver (see
    leave_to_the_driver): numba made them in the pool's threads, which have ended."""
    # the command's own modules, imported when it runs: --help and the other commands start without them
    from mlptrain.backends.cuda import leave_to_the_driver

    try:
        finish()
    finally:
        for device in pool.devices if base_config.backend != "cpu" else ():
            leave_to_the_driver(device)


def _work(engine, study, study_storage, spec, sweep_dir, resources, save, workers, command, worker, children,
          slots, began, pack: int | str) -> list[str]:
    """Run trials here, and with `workers` > 1 in the `children` started beside this process; returns a line
    per failed child. Each compiles what the kernel cache lacks itself, all at once rather than one after
    another."""
    # the command's own modules, imported when it runs: --help and the other commands start without them
    from threadpoolctl import threadpool_limits

    from mlptrain.sweep.gpu_processes import BLAS_THREADS
    from mlptrain.sweep.workers import blas_share, cores, run_workers

    def here():
        if pack != 1:
            _packed_here(engine, study, study_storage, spec, sweep_dir, resources, save, pack)
            return
        engine.work(study, study_storage, spec, sweep_dir, resources, on_trial_end=save,
                    wait_for_others=not worker and workers == 1)

    if workers == 1:
        here()
        return []
    if workers > cores():
        console.print(f"note: {workers} workers on {cores()} CPU cores: the workers beyond {cores()} only take turns "
                      "with the others", highlight=False)
    share = blas_share(workers)
    # NumPy is loaded here: its BLAS threads are limited now, as the children's by their environment; what
    # the user set NumPy read at its import already
    limit = None if any(name in os.environ for name in BLAS_THREADS) else max(1, cores() // workers)

    def here_with_its_share():
        with threadpool_limits(limits=limit, user_api="blas"):
            here()

    return run_workers(command, workers, slots, sweep_dir, study, spec, study_storage, here=here_with_its_share,
                       procs=children, env=share, since=began)


def _packed_here(engine, study, study_storage, spec, sweep_dir, resources, save,
                 pack: int | str) -> None:
    """`pack` trials side by side in this thread (engine.work_packed). Ctrl-C or SIGTERM sets a stop instead of
    raising where the signal lands, so that every trial is queued again after its step, as a worker thread's
    are; then it is raised as the interrupt it was."""
    # the command's own modules, imported when it runs: --help and the other commands start without them
    from mlptrain.cli.signals import StopOnSignal, Terminated

    console.print(f"one worker{packed(pack)}")
    with StopOnSignal() as stop:
        engine.work_packed(study, study_storage, spec, sweep_dir, resources, pack, on_trial_end=save, stop=stop)
    if stop.signum == signal.SIGINT:
        raise KeyboardInterrupt
    if stop.signum:
        raise Terminated(stop.signum)


def packed(pack) -> str:
    """What a worker line adds for `--pack`."""
    if pack == "auto":
        return ", each training as many trials at once as add throughput (--pack auto)"
    return f", each training {pack} trials at once" if pack > 1 else ""


def _make_folder(sweep_dir: Path) -> None:
    try:
        sweep_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"{sweep_dir}: cannot create the sweep folder ({err.strerror})") from None
