"""The GPU's own timeline of a packed sweep: how long its optimizer steps ran, and where it waited between them.

    python benchmarks/sweep_timeline.py [--trials 16] [--epochs 10] [--flags "--pack 16"] [--repeats 1]
                                        [--set KEY=VALUE ...] [--json FILE]

Runs `mlptrain sweep` of adam_mnist's K trials (benchmarks/packed_trials.py's sweep file) in a child process
whose lane group (mlptrain.packing.lane_group) records a timing event on its stream before and after each step
of every lane it launches (`LaneGroup._step`; in a version without it, each flush, then one step), from a pool
made ahead so that no event is created between two steps. Once
the sweep ends, the events give each step's GPU time and the gap before it: the GPU idle, or running other work
queued on the lanes' stream (an epoch end's evaluations and copies). Gaps are counted where they fall: after an
epoch's last step, after a read (every train.log_every steps), or elsewhere; the host's own intervals between two
steps over 20 ms are counted too. After an untimed one-epoch sweep (the kernels in the cache).

The child is `python -c` code, not a script: a packed sweep draws its TensorBoard images in spawned processes,
and a spawned child imports its parent's main script again, so a timing wrapper run by path would run a second
sweep in each of them (their drawings then fall back to the loggers' threads: benchmarks/NOTES.md, issue 30 step
24). On the CPU backend (`--set backend=cpu`) there are no events: the host's columns only.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

# its neighbour: the script's folder is on the path
from sweep_host import COMMAND, records, sweep_arguments, sweep_in_child

HOST_GAP_S = 0.02  # a host interval between two steps counted as a stall

# The child: records (host start s, host end s, its lanes ending an epoch, GPU ms of the step, GPU ms of the gap
# before it) for each step (`flushes`: a flush was one step before lanes handed in their windows a read at a
# time); `dump()` writes them, at the command's end (sweep_host.COMMAND runs the command after
# this, as `mlptrain` runs it, its os._exit wrapped to write first).
CHILD = r"""
import os, sys, time, json
T0 = time.perf_counter()
out = os.environ["SWEEP_TIMELINE_OUT"]
flushes, events, spare, context = [], [], [], []
real = lane_group = None  # instrument() wraps its step
cu = api = None  # the driver's calls, imported at a CUDA group's first flush

def refill():
    spare.extend(api.check(cu.cuEventCreate(0), "cuEventCreate") for _ in range(1024))

def event(stream):
    made = spare.pop()
    api.check(cu.cuEventRecord(made, api.handle(0 if stream is None else stream)), "cuEventRecord")
    return made

def flush(self):
    cuda = self.backend.name == "cuda"
    stream = getattr(self.backend, "stream", None)
    if cuda and not context:
        global cu, api
        from cuda.bindings import driver as cu
        from mlptrain.backends.driver import api
        context.append(api.current_context())
    # the lanes whose epoch's last window this step launches: each lane's first window handed in (LaneGroup.pending:
    # a lane's windows, or one (start, rows) in a version that launched every window handed in at each flush)
    ending = sum(1 for lane, windows in self.pending.items()
                 if sum(windows if isinstance(windows[0], int) else windows[0]) >= self.windows[lane].split.size)
    if cuda and len(spare) < 2:
        refill()  # in batches, between two flushes' timings: no event made inside one
    began = time.perf_counter() - T0
    pre = event(stream) if cuda else None
    real(self)
    post = event(stream) if cuda else None
    flushes.append([began, time.perf_counter() - T0, ending])
    events.append((pre, post))

def instrument():  # run by COMMAND: at once, or in the trainer only (--trainer)
    global lane_group, real
    import mlptrain.packing.lane_group as lane_group
    name = "_step" if hasattr(lane_group.LaneGroup, "_step") else "flush"
    real = getattr(lane_group.LaneGroup, name)
    setattr(lane_group.LaneGroup, name, flush)

def after_fork():  # the trainer (sweep_host.COMMAND): its own flushes only
    for kept in (flushes, events, spare, context):
        kept.clear()

def dump():
    if getattr(dump, "done", False):
        return
    dump.done = True
    if context:
        api.set_current(context[0])  # the exiting thread may not be the one that fed the GPU
        api.check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
        elapsed = lambda a, b: api.check(cu.cuEventElapsedTime(a, b), "cuEventElapsedTime")
        for i, (pre, post) in enumerate(events):
            flushes[i] += [elapsed(pre, post), elapsed(events[i - 1][1], pre) if i else 0.0]
    with open(out, "w") as file:
        json.dump({"flushes": flushes, "end": time.perf_counter() - T0}, file)

"""


def summarise(flushes: list, log_every: int) -> dict:
    """One sweep's figures from its flushes' records (CHILD's): GPU figures where the events gave them."""
    starts, first = [], True  # the flush index each epoch of the group starts at
    for i, record in enumerate(flushes):
        if first:
            starts.append(i)
        first = record[2] > 0  # its lanes ended an epoch: the next flush starts the next one
    epoch_of = {}
    for epoch, start in enumerate(starts):
        for i in range(start, starts[epoch + 1] if epoch + 1 < len(starts) else len(flushes)):
            epoch_of[i] = start
    host_gaps = [flushes[i][0] - flushes[i - 1][1] for i in range(1, len(flushes))]
    found = {"flushes": len(flushes), "epochs": len(starts), "first_flush_s": flushes[0][0],
             "last_flush_s": flushes[-1][1], "host_stalls": sum(1 for gap in host_gaps if gap > HOST_GAP_S),
             "host_stall_s": sum(gap for gap in host_gaps if gap > HOST_GAP_S)}
    if len(flushes[0]) < 5:
        return found
    steps = [record[3] for record in flushes]
    gaps = {"epoch_ends": 0.0, "reads": 0.0, "other": 0.0}
    for i in range(1, len(flushes)):
        kind = ("epoch_ends" if flushes[i - 1][2] > 0 else
                "reads" if (i - epoch_of[i]) % log_every == 0 else "other")
        gaps[kind] += flushes[i][4]
    return {**found, "gpu_span_ms": sum(steps) + sum(gaps.values()), "steps_ms": sum(steps),
            "median_step_us": 1e3 * statistics.median(steps), **{f"gaps_{k}_ms": v for k, v in gaps.items()}}


def one_sweep(args, folder: Path, name: str, epochs: int) -> dict:
    """One sweep in a child, timed; exits on a failed or incomplete sweep, or one whose steps no lane group ran."""
    import yaml

    wall, trials = sweep_in_child(args, folder, name, epochs, CHILD + COMMAND, "SWEEP_TIMELINE_OUT")
    command, trainer = records(folder, name)
    flushes = (trainer or command)["flushes"]
    if not flushes:
        sys.exit("WRONG RESULT: no lane group ran the steps (an MLP sweep with --pack 2 or more has one)")
    config = yaml.safe_load((folder / "runs" / name / Path(trials[0]["run_dir"]).name / "config.yaml").read_text())
    host = [flushes[i][0] - flushes[i - 1][0] for i in range(1, len(flushes))]  # step to step, on the host
    return {"wall_s": wall, **summarise(flushes, int(config["train"]["log_every"])),
            "host_interval_us": 1e6 * statistics.median(host), "flushes_raw": flushes}


def main() -> None:
    parser = sweep_arguments(__doc__, "the sweep's flags (a packed one: --pack K, K >= 2)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sweep-timeline-") as scratch:
        folder = Path(scratch)
        one_sweep(args, folder, "warm", 1)  # the kernels in the cache, as for a user's second sweep
        runs = [one_sweep(args, folder, f"timed-{i}", args.epochs) for i in range(args.repeats)]
    columns = [("wall_s", "wall s", "{:.2f}"), ("first_flush_s", "first step s", "{:.3f}"),
               ("last_flush_s", "last step s", "{:.3f}"), ("gpu_span_ms", "GPU span ms", "{:.1f}"),
               ("steps_ms", "steps ms", "{:.1f}"), ("median_step_us", "step µs", "{:.1f}"),
               ("gaps_epoch_ends_ms", "gaps at epoch ends ms", "{:.1f}"), ("gaps_reads_ms", "at reads ms", "{:.1f}"),
               ("gaps_other_ms", "elsewhere ms", "{:.1f}"), ("host_stalls", "host stalls > 20 ms", "{:d}"),
               ("host_stall_s", "their s", "{:.3f}"), ("host_interval_us", "host µs a step (median)", "{:.1f}")]
    print(f"{args.trials} trials x {args.epochs} epochs, `mlptrain sweep {args.flags}` {' '.join(args.set)}: "
          f"{runs[0]['flushes']} steps in {runs[0]['epochs']} epochs")
    print("| sweep | " + " | ".join(title for _, title, _ in columns) + " |")
    print("| --- " * (len(columns) + 1) + "|")
    for i, run in enumerate(runs):
        print(f"| {i + 1} | " + " | ".join(form.format(run[key]) if key in run else "-" for key, _, form in columns)
              + " |")
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
