"""K trials of one architecture trained side by side on one GPU, against the same K one after another and
against JAX's `jax.vmap` over the trial axis inside one `jax.jit` over the epoch.

Each trial is an ordinary mlptrain training session (its own parameters, optimizer state, data order and
captured CUDA graph of a window), built from the recipe with its own learning rate and seed. The modes:

    solo      trial 0 alone: its epochs, then its parameters' digest (the reference for bitwise equality)
    serial    the K trials one after another, each over all its epochs (a one-worker sweep's training)
    streams   the K trials in lockstep from one thread: each window, every trial replays its own graph on a
              stream of its own, so their kernels overlap on the GPU
    branches  the same, with the K trials' windows captured as ONE graph of K parallel branches: one
              replay a window for all of them
    lanes     the K trials in lanes of one group (mlptrain.packing.lane_group, what `--pack` does for MLPs):
              each window of all K is one set of lane-axis launches, one graph replay
    jax       the MLP in JAX: `jax.vmap` over K trials inside one `jax.jit` of a `lax.scan` over the
              epoch's steps, optax's Adam scaled by each trial's cosine-annealed lr (matmul precision
              "highest", no TF32), the dataset resident on the GPU as uint8

Every trial's last-epoch training loss must show learning (MNIST below 0.5, the autoencoder's MSE below
0.05), and a packed trial 0's parameters must equal the solo run's bitwise (in lanes, whose GEMMs sum in
another order: each trial's loss within 5% of its run on a stream of its own), or the script exits 1.
Each mode runs in a process of its own (`--connections` sets CUDA_DEVICE_MAX_CONNECTIONS there: the
hardware queues streams are spread over). The table shows the median epoch for all K trials after the
first (which compiles and captures), and the host's share: the seconds spent queueing an epoch's work.

    python benchmarks/packed_trials.py [--job mnist|ae] [--trials 16] [--epochs 4] [--connections 8,32]
                                       [--modes solo,serial,streams,branches,lanes,jax] [--json FILE]

`--sweeps ';--pack 16;--workers 16'` measures whole `mlptrain sweep` commands instead: the job's K trials
(its learning rates x as many seeds as needed) for --epochs each, one sweep per set of flags, each timed from
its start to its exit, after an untimed one-epoch sweep of the same flags has put its kernels in the cache;
every trial must complete once, and each trial's metrics must be the same bits in every sweep. `--peer-workers 1,4` adds the same number of trials in PyTorch + Optuna with that many processes
on the GPU (benchmarks/sweep_peer.py: the MLP's step in one CUDA graph, the autoencoder channels_last), timed
the same way; its trials differ in seed only, each as costly as ours.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

JOBS = {  # job: (recipe overrides, learning rates the K trials cycle through, the loss that shows learning)
    "mnist": ({"data": {"dataset": "mnist", "val_size": 5000}, "model": {"type": "mlp", "hidden": [512, 512]},
               "train": {"batch_size": 128}}, [1e-4, 2e-4, 3e-4, 5e-4, 1e-3, 1.5e-3, 2e-3, 3e-3], 0.5),
    "ae": ({"data": {"dataset": "cifar10", "val_size": 500},
            "model": {"type": "conv_autoencoder", "channels": [256, 128], "kernel_size": 3},
            "train": {"batch_size": 64, "eval_batch_size": 256}}, [3e-4, 5e-4, 1e-3, 2e-3], 0.05),
}


def trial_config(job: str, k: int, epochs: int, backend: str = "cuda"):
    from mlptrain.config.load import config_from_dict

    base, lrs, _ = JOBS[job]
    raw = json.loads(json.dumps(base))
    raw.update({"backend": backend, "seed": k // len(lrs), "optim": {"name": "adam", "lr": lrs[k % len(lrs)]},
                "schedule": {"name": "cosine"}})
    raw["train"].update({"epochs": epochs})
    return config_from_dict(raw)


def sessions(job: str, trials: int, epochs: int, dataset):
    from mlptrain.backends.selection import get_backend
    from mlptrain.backends.numba_kernels import streams
    from mlptrain.training.session import build_session

    built = []
    for k in range(trials):
        backend = get_backend("cuda", own_stream=True)
        built.append(build_session(trial_config(job, k, epochs), backend, dataset))
    streams.use(built[0].backend.stream)
    return built


def lane_sessions(job: str, trials: int, epochs: int, backend: str = "cuda"):
    """The trials built in lanes of one group (mlptrain.packing.lane_group): (the group, their sessions)."""
    from mlptrain.training.experiment import Resources
    from mlptrain.packing.lane_group import slots

    group, views = slots(trial_config(job, 0, epochs, backend), Resources(), trials)
    return group, [view.session(trial_config(job, k, epochs, backend)) for k, view in enumerate(views)]


def lanes_lockstep(group, lanes, epochs: int) -> tuple[list, list]:
    """As `lockstep`, each window of every trial launched by the group at once (one graph replay)."""
    from mlptrain.backends.driver import api
    from mlptrain.data.loader import epoch_order

    first, walls, host = lanes[0], [], []
    window, steps, size = first.config.train.effective_batch_size, first.steps_per_epoch, first.train.size
    for epoch in range(1, epochs + 1):
        for s in lanes:
            s.window.start_epoch(epoch_order(s.train, s.config.seed, epoch))
        api.synchronize()
        t0 = time.perf_counter()
        for i in range(steps):
            start = i * window
            for s in lanes:
                s.window.run(start, min(window, size - start))
            group.flush()
        t1 = time.perf_counter()
        api.synchronize()
        walls.append(time.perf_counter() - t0)
        host.append(t1 - t0)
    return walls, host


def digest(session) -> str:
    return hashlib.sha256(np.asarray(session.backend.to_host(session.model.params.flat)).tobytes()).hexdigest()[:16]


def last_loss(session) -> float:
    loss, _, _ = session.evaluator.read_rows(session.window.row_loss, session.window.row_correct, 0, session.train.size)
    return loss


class Branches:
    """The K sessions' full windows captured as one graph: a fork from one stream, each session's launches
    on a branch stream of its own, joined back; one cuGraphLaunch a window for all of them."""

    def __init__(self, group, rows):
        from cuda.bindings import driver as cu

        from mlptrain.backends.driver.api import Stream
        from mlptrain.backends.numba_kernels import streams

        def ok(result):
            err, *values = result
            assert err == cu.CUresult.CUDA_SUCCESS, err
            return values[0] if len(values) == 1 else values

        flags = cu.CUstream_flags.CU_STREAM_NON_BLOCKING
        origin = ok(cu.cuStreamCreate(flags))
        ok(cu.cuStreamBeginCapture(origin, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
        fork = ok(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING))
        ok(cu.cuEventRecord(fork, origin))
        home = streams.current()
        self.keep = []
        for s in group:
            branch = ok(cu.cuStreamCreate(flags))
            ok(cu.cuStreamWaitEvent(branch, fork, 0))
            streams.use(Stream(branch))
            s.window.plan(rows)
            joined = ok(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING))
            ok(cu.cuEventRecord(joined, branch))
            ok(cu.cuStreamWaitEvent(origin, joined, 0))
            self.keep += [branch, joined]
        streams.use(home)
        graph = ok(cu.cuStreamEndCapture(origin))
        self.exec = ok(cu.cuGraphInstantiate(graph, 0))
        self.stream, self.launch = origin, cu.cuGraphLaunch

    def replay(self):
        err, = self.launch(self.exec, self.stream)
        assert int(err) == 0, err


def lockstep(group, epochs: int, combined: bool) -> tuple[list, list]:
    """Train `group` epoch by epoch, window by window; per epoch (seconds for all, host seconds queueing)."""
    from mlptrain.backends.driver import api
    from mlptrain.backends.numba_kernels import streams
    from mlptrain.data.loader import epoch_order

    first, walls, host = group[0], [], []
    window, steps, size = first.config.train.effective_batch_size, first.steps_per_epoch, first.train.size
    graph = None
    for epoch in range(1, epochs + 1):
        for s in group:
            streams.use(s.backend.stream)
            if graph is not None or (combined and epoch == 2):  # the combined graph reads each cursor as left
                s.backend.copy_from_host(s.window.cursor, np.zeros(1, np.int64))
                s.window.cursor_at = 0
            s.window.start_epoch(epoch_order(s.train, s.config.seed, epoch))
        if combined and epoch == 2:
            graph = Branches(group, window)
        api.synchronize()
        t0 = time.perf_counter()
        for i in range(steps):
            start = i * window
            rows = min(window, size - start)
            if graph is not None and rows == window:
                graph.replay()
                for s in group:
                    s.window.cursor_at = start + rows
                continue
            if graph is not None:  # the branches' streams are not the sessions': order them first
                api.synchronize()
            for s in group:
                streams.use(s.backend.stream)
                s.window.run(start, rows)
        t1 = time.perf_counter()
        api.synchronize()
        walls.append(time.perf_counter() - t0)
        host.append(t1 - t0)
    return walls, host


def run_mode(args) -> dict:
    from mlptrain.data import load_dataset

    if args.mode == "jax":
        return jax_mode(args)
    trials = 1 if args.mode == "solo" else args.trials
    if args.mode == "lanes":  # a lane's GEMMs sum in another order than its run alone: no digest to compare
        lane_group, runs = lane_sessions(args.job, trials, args.epochs)
        per_epoch, host = lanes_lockstep(lane_group, runs, args.epochs)
        return {"mode": args.mode, "trials": trials, "epochs_s": per_epoch, "host_s": host,
                "losses": [last_loss(s) for s in runs], "digest0": None}
    dataset = load_dataset("mnist" if args.job == "mnist" else "cifar10")
    group = sessions(args.job, trials, args.epochs, dataset)
    if args.mode == "serial":
        walls = [lockstep([s], args.epochs, False)[0] for s in group]
        per_epoch, host = [sum(w[e] for w in walls) for e in range(args.epochs)], [0.0] * args.epochs
    else:
        per_epoch, host = lockstep(group, args.epochs, args.mode == "branches")
    losses = [last_loss(s) for s in group]
    return {"mode": args.mode, "trials": trials, "epochs_s": per_epoch, "host_s": host, "losses": losses,
            "digest0": digest(group[0])}


def jax_mode(args) -> dict:
    import jax
    import jax.numpy as jnp
    import optax

    from mlptrain.data import load_dataset

    jax.config.update("jax_default_matmul_precision", "highest")
    dataset = load_dataset("mnist")
    lrs = JOBS["mnist"][1]
    n_val, batch, widths = 5000, 128, [784, 512, 512, 10]
    index = np.random.default_rng([0, 0x5EED]).permutation(len(dataset.train_images))
    train_index = index[n_val:]
    steps = len(train_index) // batch
    images, labels = jnp.asarray(dataset.train_images), jnp.asarray(dataset.train_labels.astype(np.int32))
    mean, std = float(dataset.mean), float(dataset.std)
    total = steps * args.epochs
    K = args.trials
    lr = jnp.asarray([lrs[k % len(lrs)] for k in range(K)], jnp.float32)

    def init(key):
        params = []
        for a, b in zip(widths[:-1], widths[1:]):
            key, sub = jax.random.split(key)
            bound = (6.0 / a) ** 0.5 / 2 ** 0.5
            params.append((jax.random.uniform(sub, (a, b), jnp.float32, -bound, bound), jnp.zeros(b, jnp.float32)))
        return params

    def loss_fn(params, x, y):
        h = x
        for i, (w, b) in enumerate(params):
            h = h @ w + b
            if i + 1 < len(params):
                h = jax.nn.relu(h)
        return optax.softmax_cross_entropy_with_integer_labels(h, y).mean()

    tx = optax.scale_by_adam()

    def epoch_fn(params, state, step0, lr_k, order, images, labels):
        def body(carry, idx):
            params, state, step = carry
            x = (images[idx].astype(jnp.float32) / 255.0 - mean) / std
            loss, grads = jax.value_and_grad(loss_fn)(params, x, labels[idx])
            updates, state = tx.update(grads, state)
            scale = -lr_k * 0.5 * (1 + jnp.cos(jnp.pi * step / total))
            params = jax.tree_util.tree_map(lambda p, u: p + scale * u, params, updates)
            return (params, state, step + 1), loss
        (params, state, _), losses = jax.lax.scan(body, (params, state, step0), order)
        return params, state, losses

    run = jax.jit(jax.vmap(epoch_fn, in_axes=(0, 0, None, 0, 0, None, None)))
    params = jax.vmap(init)(jax.random.split(jax.random.PRNGKey(0), K))
    state = jax.vmap(tx.init)(params)
    walls, losses = [], None
    for epoch in range(args.epochs):
        order = np.stack([np.random.default_rng([k, epoch]).permutation(train_index)[:steps * batch]
                          .reshape(steps, batch) for k in range(K)]).astype(np.int32)
        order = jax.device_put(order).block_until_ready()
        t0 = time.perf_counter()
        params, state, losses = run(params, state, jnp.float32(epoch * steps), lr, order, images, labels)
        jax.block_until_ready((params, state, losses))
        walls.append(time.perf_counter() - t0)
    last = np.asarray(losses).mean(axis=1)
    return {"mode": "jax", "trials": K, "epochs_s": walls, "host_s": [0.0] * args.epochs,
            "losses": [float(v) for v in last], "digest0": None}


SWEEP_BASE = {"mnist": "adam_mnist", "ae": "autoencoder_cifar10"}
LEARNED = ("val_acc", "val_loss", "val_mse", "test_acc", "test_loss", "test_mse")


def sweep_file(job: str, trials: int, folder: Path) -> tuple[Path, int, int]:
    """(the sweep file of the job's `trials` trials: its learning rates x as many seeds as needed, written in
    `folder`; its seeds; its learning rates per seed)."""
    import yaml

    lrs = JOBS[job][1]
    folder.mkdir(parents=True, exist_ok=True)
    seeds, per_seed = -(-trials // len(lrs)), min(len(lrs), trials)
    path = folder / f"{job}-{trials}.yaml"
    path.write_text(yaml.safe_dump({"base": SWEEP_BASE[job], "method": "grid",
                                    "metric": "val_acc" if job == "mnist" else "val_mse",
                                    "direction": "maximize" if job == "mnist" else "minimize",
                                    "parameters": {"optim.lr": lrs[:per_seed], "seed": list(range(seeds))}}))
    return path, seeds, per_seed


def sweep_wall(args, flags: list[str], folder: Path, epochs: int | None = None) -> dict:
    """`mlptrain sweep` of the job's K trials (the learning rates x seeds above, `--epochs` each, or `epochs`)
    with `flags`, timed as a whole process; every trial must complete, once."""
    path, seeds, per_seed = sweep_file(args.job, args.trials, folder)
    name = f"{args.job}-{len(list(folder.glob('*.log')))}"  # one per sweep of the call
    command = [sys.executable, "-m", "mlptrain", "sweep", str(path), f"train.epochs={epochs or args.epochs}", "--runs-dir",
               str(folder / "runs"), "--name", name, *flags]
    began = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - began
    (folder / f"{name}.log").write_text(done.stdout + done.stderr)
    if done.returncode:
        raise SystemExit(f"sweep {flags} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    trials = json.loads((folder / "runs" / name / "results.json").read_text())["trials"]
    if len(trials) != seeds * per_seed or any(t["state"] != "complete" for t in trials):
        raise SystemExit(f"WRONG RESULT: sweep {flags}: {[(t['params'], t['state']) for t in trials]}")
    metrics = {json.dumps(t["params"], sort_keys=True): {k: v for k, v in t["metrics"].items() if k in LEARNED}
               for t in trials}
    trained = sum(json.loads((folder / "runs" / name / Path(t["run_dir"]).name / "summary.json").read_text())
                  ["wall_s"] for t in trials)
    chose = [line.split(": ", 1)[1].split(" packed")[0] + "; steps/s "
             + line.split("together: ")[-1].split(";")[0]
             for line in done.stderr.splitlines() if line.startswith("--pack auto: ") and " packed on " in line]
    measured = "measuring how many" in done.stderr
    label = " ".join(flags) + (f" (chose {chose[0]}; {'measured' if measured else 'cached'})" if chose else "")
    return {"flags": label or "(one worker)", "wall_s": wall, "trials": len(trials),
            "trials_wall_s": trained, "metrics": metrics}


def peer_wall(args, workers: int, folder: Path) -> dict:
    """The same number of trials as a PyTorch user sweeps them (benchmarks/sweep_peer.py: Optuna, `workers`
    processes on the GPU, the MLP's whole step in one CUDA graph, the autoencoder channels_last with cuDNN
    autotuning), timed as a whole process; it exits 1 unless every trial ran once and learned."""
    command = [sys.executable, str(Path(__file__).resolve().parent / "sweep_peer.py"), "--job", SWEEP_BASE[args.job],
               "--trials", str(args.trials), "--epochs", str(args.epochs), "--workers", str(workers), "--data",
               os.environ["MLPTRAIN_DATA_DIR"], "--study", str(folder / f"peer-{workers}.journal")]
    began = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - began
    if done.returncode:
        raise SystemExit(f"WRONG RESULT: the PyTorch peer with {workers} workers: {done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {"flags": f"PyTorch + Optuna, {workers} process{'es' if workers > 1 else ''}", "wall_s": wall,
            "trials": args.trials, "trials_wall_s": result["train_s"], "metrics": None}


def sweeps(args) -> None:
    """The sweeps of --sweeps, one after another, then the peer's (--peer-workers), then their table; a trial's
    metrics must be those of the first sweep: the same bits where it trains as it does alone (side by side),
    within 0.01 for every accuracy in lanes (the losses' drift printed)."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        # each distinct command once for one epoch first, untimed: the timed sweeps find their kernels in the
        # cache, as a user's second sweep does (a packed sweep's lane kernels compiled inside its timed run
        # made it 16.0 s against 3.8 s warm on an H100; a first run's compile is issue 33's)
        for flags in dict.fromkeys(args.sweeps):
            sweep_wall(args, flags.split(), Path(folder) / "warm", epochs=1)
        rows = [sweep_wall(args, flags.split(), Path(folder)) for flags in args.sweeps]
        peers = [peer_wall(args, workers, Path(folder)) for workers in args.peer_workers]
    first = rows[0]["metrics"]
    for i, row in enumerate(rows):  # the same command twice: the same bits (runs are reproducible)
        again = next((other for other in rows[i + 1:] if other["flags"] == row["flags"]), None)
        if again is not None and again["metrics"] != row["metrics"]:
            raise SystemExit(f"WRONG RESULT: two sweeps {row['flags']} gave different metrics")
    for row in rows[1:]:
        if row["metrics"] == first:
            print(f"{row['flags']}: every trial's metrics the same bits as {rows[0]['flags']}'s")
            continue
        # lanes sum their GEMMs in another order than a trial alone: a bound, not bits. Over thousands of steps
        # such rounding grows into different trajectories: the accuracies stay close, while the loss of a model
        # that fits its training set (a few confident mistakes) moves by several percent
        worst = {}
        for trial, values in row["metrics"].items():
            for metric, value in values.items():
                kind = "accuracies" if "acc" in metric else "losses"
                drift = abs(value - first[trial][metric]) / (1.0 if kind == "accuracies" else abs(first[trial][metric]))
                if drift >= worst.get(kind, (0.0,))[0]:
                    worst[kind] = (drift, trial, metric)
        print(f"{row['flags']}: against {rows[0]['flags']}, the accuracies differ by at most "
              f"{worst['accuracies'][0]:.4f} (absolute), the losses by {worst['losses'][0]:.1%} (relative; "
              f"{worst['losses'][2]} of {worst['losses'][1]})")
        if worst["accuracies"][0] > 0.01:
            raise SystemExit(f"WRONG RESULT: {row['flags']}: trial {worst['accuracies'][1]}'s "
                             f"{worst['accuracies'][2]} is {worst['accuracies'][0]:.4f} off {rows[0]['flags']}'s")
    print(f"\n{args.job}: {rows[0]['trials']} trials x {args.epochs} epochs, whole `mlptrain sweep` processes")
    print("| sweep | wall s | trials per hour | x the first | trials' own wall_s, summed |")
    print("| --- | --- | --- | --- | --- |")
    rows += peers
    for row in rows:
        print(f"| {row['flags']} | {row['wall_s']:.1f} | {3600 * row['trials'] / row['wall_s']:,.0f} | "
              f"{rows[0]['wall_s'] / row['wall_s']:.2f} | {row['trials_wall_s']:.1f} |")
    if args.json:
        args.json.with_suffix(".sweeps.json").write_text(json.dumps([{k: v for k, v in r.items() if k != "metrics"}
                                                                     for r in rows], indent=2))


def measure(args, mode: str, connections: int | None) -> dict:
    env = dict(os.environ)
    if connections:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = str(connections)
    command = [sys.executable, __file__, "--mode", mode, "--job", args.job, "--trials", str(args.trials),
               "--epochs", str(args.epochs)]
    began = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    process_s = time.perf_counter() - began
    if done.returncode:
        raise SystemExit(f"{mode} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result.update(connections=connections, process_s=process_s)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", choices=sorted(JOBS), default="mnist")
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--modes", type=lambda s: s.split(","),
                        default=["solo", "serial", "streams", "lanes", "jax"])
    parser.add_argument("--connections", type=lambda s: [int(c) for c in s.split(",")], default=[8, 32])
    parser.add_argument("--sweeps", type=lambda s: s.split(";"), help="instead of the modes: whole `mlptrain sweep` "
                        "processes, one per ';'-separated set of flags ('' for one worker), e.g. ';--pack 16'")
    parser.add_argument("--peer-workers", type=lambda s: [int(w) for w in s.split(",") if w], default=[],
                        help="with --sweeps: the same trials in PyTorch + Optuna (benchmarks/sweep_peer.py) with "
                        "these numbers of processes, e.g. 1,4")
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(run_mode(args)))
        return
    if args.sweeps:
        sweeps(args)
        return
    rows, limit = [], JOBS[args.job][2]
    for mode in args.modes:
        if mode == "jax" and args.job != "mnist":
            continue
        for connections in (args.connections if mode in ("streams", "branches") else [None]):
            rows.append(measure(args, mode, connections))
            print(json.dumps(rows[-1]), flush=True)
    wrong = [f"{r['mode']}: losses {r['losses']}" for r in rows if not all(v < limit for v in r["losses"])]
    solo = next((r["digest0"] for r in rows if r["mode"] == "solo"), None)
    wrong += [f"{r['mode']} (connections {r['connections']}): trial 0's parameters differ from the solo run's"
              for r in rows if solo and r["digest0"] and r["digest0"] != solo]
    streams, lanes = (next((r["losses"] for r in rows if r["mode"] == m), None) for m in ("streams", "lanes"))
    if streams and lanes:  # the same trials: their float32 sums differ in order only
        drift = max(abs(a - b) / abs(b) for a, b in zip(lanes, streams))
        print(f"lanes against streams: each trial's last epoch's training loss within {drift:.2e} (relative)")
        if drift > 0.05:
            wrong.append(f"lanes: a trial's training loss is {drift:.1%} off its run on a stream of its own")
    if wrong:
        raise SystemExit("WRONG RESULT: " + "; ".join(wrong))
    print(f"\n{args.job}, {args.trials} trials, median epoch after the first")
    print("| mode | connections | s/epoch, all trials | host s queueing | x serial | whole process s |")
    print("| --- | --- | --- | --- | --- | --- |")
    serial = next((statistics.median(r["epochs_s"][1:]) for r in rows if r["mode"] == "serial"), None)
    for r in rows:
        wall = statistics.median(r["epochs_s"][1:])
        ratio = f"{serial / wall:.2f}" if serial and r["mode"] != "solo" else "-"
        print(f"| {r['mode']} | {r['connections'] or '-'} | {wall:.4f} | {statistics.median(r['host_s'][1:]):.4f} | "
              f"{ratio} | {r['process_s']:.1f} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
