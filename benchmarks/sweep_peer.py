"""The peer of benchmarks/sweep_gpus.py: the same sweep the way a PyTorch user runs it on every GPU.

An Optuna study in a journal file, with one trial queued per seed; K worker processes started at once,
worker i on GPU i mod G (CUDA_VISIBLE_DEVICES), each taking queued trials until none is left and training
each with the PyTorch recipe of benchmarks/torch_recipes.py: the MLP's whole step in one CUDA graph, the
autoencoder channels_last with cuDNN autotuning and fused Adam (TF32 off, as mlptrain computes in float32).
A worker reads the dataset once and keeps it for its trials. A trial is taken the way Optuna's own `ask`
takes a queued one: its RUNNING line in the journal, which only one worker's can win.

    python benchmarks/sweep_peer.py --job adam_mnist|autoencoder_cifar10 --trials N --epochs E --workers K
                                    --data DIR --study FILE

Exits 1 unless every seed ran once and completed with a sane metric (val_acc above 0.9, val_mse below
0.05); then prints one JSON line: the metric per seed, the trials' own training seconds (summed), and the
first trial's start and the last one's end (Unix seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

METRIC = {"adam_mnist": ("val_acc", "maximize", lambda v: v > 0.9),
          "autoencoder_cifar10": ("val_mse", "minimize", lambda v: v < 0.05)}
STUDY = "peer"


def gpu_count() -> int:
    listed = subprocess.run(["nvidia-smi", "--list-gpus"], capture_output=True, text=True).stdout
    return max(1, sum(line.startswith("GPU ") for line in listed.splitlines()))


def launch(args) -> None:
    metric, direction, sane = METRIC[args.job]
    storage = JournalStorage(JournalFileBackend(str(args.study)))
    study = optuna.create_study(storage=storage, study_name=STUDY, direction=direction)
    for seed in range(args.trials):
        study.enqueue_trial({"seed": seed})
    gpus = gpu_count()
    command = [sys.executable, __file__, "--worker", *sys.argv[1:]]
    procs = [subprocess.Popen(command, env={**os.environ, "CUDA_VISIBLE_DEVICES": str(i % gpus)})
             for i in range(args.workers)]
    codes = [p.wait() for p in procs]
    trials = study.get_trials()
    seeds = sorted(t.params.get("seed") for t in trials)
    problems = [f"workers exited {codes}"] if any(codes) else []
    if seeds != list(range(args.trials)):
        problems.append(f"seeds run {seeds}")
    if any(t.state != TrialState.COMPLETE or not sane(t.value) for t in trials):
        problems.append(f"trials {[(t.number, t.state.name, t.value) for t in trials]}")
    if problems:
        raise SystemExit("WRONG RESULT: the peer's sweep: " + "; ".join(problems))
    print(json.dumps({"values": {t.params["seed"]: t.value for t in trials},
                      "train_s": sum(t.user_attrs["train_s"] for t in trials),
                      "first_start": min(t.datetime_start for t in trials).timestamp(),
                      "last_end": max(t.datetime_complete for t in trials).timestamp()}))


def work(args) -> None:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import torch_recipes as recipes

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    metric = METRIC[args.job][0]
    recipe, mode = (recipes.mnist, "graphs") if args.job == "adam_mnist" else (recipes.autoencoder, "channels_last")
    storage = JournalStorage(JournalFileBackend(str(args.study)))
    study = optuna.load_study(study_name=STUDY, storage=storage)
    study_id = storage.get_study_id_from_name(STUDY)
    while True:
        trial = None
        for queued in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, queued.number)
            if storage.set_trial_state_values(trial_id, TrialState.RUNNING):
                trial = optuna.trial.Trial(study, trial_id)
                break
        if trial is None:
            return
        seed = trial.suggest_int("seed", 0, args.trials - 1)
        torch.manual_seed(seed)
        start = time.perf_counter()
        result = recipe(argparse.Namespace(data=args.data, seed=seed, mode=mode, epochs=args.epochs), torch)
        torch.cuda.synchronize()
        trial.set_user_attr("train_s", time.perf_counter() - start)
        study.tell(trial, result[metric])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", choices=sorted(METRIC), required=True)
    parser.add_argument("--trials", type=int, required=True)
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--study", type=Path, required=True, help="the journal file (made here; must not exist)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    (work if args.worker else launch)(args)


if __name__ == "__main__":
    main()
