"""The step state's rules on the device (CUDA backend): what an optimizer step decides once per window.

`mlptrain.optim.step_state` writes them once, in the Python that Numba compiles; here each is a small kernel
of one block (a block a lane for the packed trials'), so nothing waits for the host:

- `finish_step`: the norm from the gradient's sum of squares (`reduce.sum_of_squares`), then the decisions
  (loss scaling, skip, clipping, the schedule's lr, bias corrections), before the update;
- under `step_state.norm_later` (no clipping, no loss scaling), `record_norm` after the update, on the partials
  the update summed as it read the gradient (`optim.adam_update`'s `partials`), with `prepare_step`'s writes in
  the same launch: the update took them from its own copy of the state (`compiled_rules.prepared_state`,
  `adam_update`'s `prepare`). The same state and record as `finish_step`, one pass over the gradient and one
  launch fewer.

`finish_step` and `record_norm` also move a training window's data cursor (`data.gather_batch`) on to the
next window when given one: a graph's step then ends in its last rule, not in a launch of its own.
"""

from mlptrain.backends.kernel_cache import kernels as kernel_cache
from mlptrain.backends.kernel_cache.numba_names import cuda, float32, float64, int64
from mlptrain.backends.numba_kernels import streams
from mlptrain.backends.numba_kernels.checks import checked_cursor, checked_lane_cursors, require, require_lanes
from mlptrain.backends.numba_kernels.compiled_rules import apply_rules, is_norm_later, prepare_rules, record, sum_chains
from mlptrain.backends.numba_kernels.grid_order import after_previous_grid
from mlptrain.backends.numba_kernels.reduce import PARTIALS
from mlptrain.optim import step_state
from mlptrain.optim.step_state import CHAINS, SIZE

STAGED = PARTIALS  # the partials a launch stages in shared memory: sum_of_squares writes as many
# A rules block's threads: one a partial to stage them, at least one a chain, and on the GPU a warp besides the
# chains' for the rules record_norm also applies (its last thread)
THREADS = max(STAGED, CHAINS + 1)


# One block: its threads sum the partials' chains (compiled_rules.sum_chains), then one thread takes the decisions (a
# handful of scalars; a launch is cheaper than a round-trip).
@kernel_cache.jit
def finish_step_kernel(partials, state, lr_schedule, grad_norms, max_norm, beta1, beta2,
                       dynamic_scaling, growth_factor, backoff_factor, growth_interval, cursor, advance):
    after_previous_grid()
    staged = cuda.shared.array(STAGED, float32)
    sums = cuda.shared.array(CHAINS, float64)  # a line of its own: the simulator tells shared arrays by line
    sum_chains(partials, staged, sums)
    if cuda.threadIdx.x == 0:
        norm = record(sums, state, grad_norms)
        apply_rules(norm, state, lr_schedule, max_norm, beta1, beta2, dynamic_scaling, growth_factor,
                    backoff_factor, growth_interval)
        if advance != 0:
            cursor[0] += advance


def finish_step(partials, state, lr_schedule, grad_norms, max_norm, beta1, beta2,
                dynamic_scaling, growth_factor, backoff_factor, growth_interval, cursor=None, advance=0):
    """See `mlptrain.optim.step_state.finish_step`; partials float32 (at most STAGED), the rest float64 device
    arrays. Then cursor[0] += advance (`cursor` a window's 1-element int64 data cursor, None with advance 0)."""
    _check_record(partials, state, grad_norms, None)
    _check_schedule(lr_schedule, None)
    finish_step_kernel[1, THREADS, streams.current()](
        partials, state, lr_schedule, grad_norms, float(max_norm), float(beta1), float(beta2),
        bool(dynamic_scaling), float(growth_factor), float(backoff_factor), float(growth_interval),
        *_advanced(cursor, advance))


@kernel_cache.jit
def prepare_step_kernel(state, lr_schedule, beta1, beta2):
    after_previous_grid()
    if cuda.threadIdx.x == 0:
        prepare_rules(state, lr_schedule, beta1, beta2)


def prepare_step(state, lr_schedule, beta1, beta2):
    """See `mlptrain.optim.step_state.prepare_step`: state (step_state.SIZE,) and lr_schedule float64."""
    require("state", state, "float64", (SIZE,))
    _check_schedule(lr_schedule, None)
    prepare_step_kernel[1, 1, streams.current()](state, lr_schedule, float(beta1), float(beta2))


# As finish_step_kernel; the block's last thread (a warp of its own on the GPU) applies prepare_step's rules
# meanwhile: they write slots the norm's record neither reads nor writes.
@kernel_cache.jit
def record_norm_kernel(partials, state, grad_norms, cursor, advance, lr_schedule, beta1, beta2, prepare):
    after_previous_grid()
    staged = cuda.shared.array(STAGED, float32)
    sums = cuda.shared.array(CHAINS, float64)  # a line of its own: the simulator tells shared arrays by line
    if prepare and cuda.threadIdx.x == cuda.blockDim.x - 1:
        prepare_rules(state, lr_schedule, beta1, beta2)
    sum_chains(partials, staged, sums)
    if cuda.threadIdx.x == 0:
        record(sums, state, grad_norms)
        if advance != 0:
            cursor[0] += advance


def record_norm(partials, state, grad_norms, cursor=None, advance=0, prepare=None):
    """See `mlptrain.optim.step_state.record_norm`; partials float32 (at most STAGED), state and grad_norms
    float64. With `prepare` (lr_schedule, beta1, beta2), also `prepare_step`'s writes, in the same launch: the
    update before it took them from its own copy (`optim.adam_update`'s `prepare`). Then cursor[0] += advance,
    as `finish_step`."""
    _check_record(partials, state, grad_norms, None)
    schedule, beta1, beta2 = (state, 0.0, 0.0) if prepare is None else prepare
    if prepare is not None:
        _check_schedule(schedule, None)
    record_norm_kernel[1, THREADS, streams.current()](partials, state, grad_norms, *_advanced(cursor, advance),
                                                      schedule, float(beta1), float(beta2), prepare is not None)


def _advanced(cursor, advance):
    """(cursor, advance) as the rules' kernels take them: a window's cursor (None: a shared zero, left alone)."""
    if cursor is None and advance != 0:
        raise ValueError("advance needs a cursor")
    return checked_cursor(cursor), int64(advance)


def _check_record(partials, state, grad_norms, lanes):
    """The operands a norm is recorded from and into: one run's (lanes None) or `lanes` lanes'."""
    if lanes is None:
        require("partials", partials, "float32", (None,))
        require("state", state, "float64", (SIZE,))
        require("grad_norms", grad_norms, "float64", (None,))
        count = partials.shape[0]
    else:
        require_lanes("partials", partials, "float32", (lanes, None))
        require_lanes("state", state, "float64", (lanes, SIZE))
        require_lanes("grad_norms", grad_norms, "float64", (lanes, None))
        count = partials.shape[1]
    if count > STAGED:
        raise ValueError(f"partials hold {count} values; the rules take at most {STAGED} (sum_of_squares's)")


def _check_schedule(lr_schedule, lanes):
    require("lr_schedule", lr_schedule, "float64", (None,) if lanes is None else (lanes, None))
    if lr_schedule.shape[0 if lanes is None else 1] == 0:  # (the simulator's shapes take no negative index)
        raise ValueError("lr_schedule must hold at least one step")


def _check_lanes(active, hypers):
    """The lane count K, after checking `active` and the lanes' rules `hypers`."""
    require("active", active, "int32", (None,))
    lanes = active.shape[0]
    require_lanes("hypers", hypers, "float64", (lanes, len(step_state.LANE_HYPERS)))
    return lanes


# Block z owns lane z's step state, grad-norm record and cursor: no atomics. Its threads sum lane z's partials'
# chains, then one thread applies the same device functions the solo kernels run to lane z's rows; hypers[z] is in
# step_state.LANE_HYPERS order. With `norm_later`, a lane under step_state.norm_later only prepares: its norm is
# recorded after the update (record_norm_lanes).
@kernel_cache.jit
def finish_step_lanes_kernel(partials, state, lr_schedule, grad_norms, hypers, active, norm_later, cursor, advance):
    after_previous_grid()
    staged = cuda.shared.array(STAGED, float32)
    sums = cuda.shared.array(CHAINS, float64)  # a line of its own: the simulator tells shared arrays by line
    z, t = cuda.blockIdx.x, cuda.threadIdx.x
    if active[z] == 0:
        return
    if advance != 0 and t == 0:
        cursor[z, 0] += advance
    rules = hypers[z]
    if norm_later and is_norm_later(rules[0], rules[3] != 0.0):
        if t == 0:
            prepare_rules(state[z], lr_schedule[z], rules[1], rules[2])
        return
    sum_chains(partials[z], staged, sums)
    if t == 0:
        norm = record(sums, state[z], grad_norms[z])
        apply_rules(norm, state[z], lr_schedule[z], rules[0], rules[1], rules[2], rules[3] != 0.0, rules[4],
                    rules[5], rules[6])


def finish_step_lanes(partials, state, lr_schedule, grad_norms, hypers, active, norm_later=False, cursor=None,
                      advance=0):
    """`finish_step` for every active lane z (active[z] != 0) in one launch, on lane z's rows: partials
    (K, PARTIALS) float32, state (K, step_state.SIZE), lr_schedule (K, T), grad_norms (K, W) and hypers
    (K, 7) float64, active (K,) int32. hypers[z] holds lane z's rules in `step_state.LANE_HYPERS` order:
    [max_norm, beta1, beta2, dynamic_scaling (0 or 1), growth_factor, backoff_factor, growth_interval].
    With `norm_later`, a lane whose rules are under `step_state.norm_later` gets `prepare_step` instead (its
    partials unread): `record_norm_lanes` records its norm after the update. Then cursor[z, 0] += advance for every
    active lane (`cursor` the lanes' (K, 1) int64 data cursors, None with advance 0). Lane operands may be lane
    views (`mlptrain.backends.lanes.lane_view`); an inactive lane is not touched.
    """
    lanes = _check_lanes(active, hypers)
    _check_record(partials, state, grad_norms, lanes)
    _check_schedule(lr_schedule, lanes)
    cursor = checked_lane_cursors(cursor, advance, lanes)
    if lanes == 0:
        return
    finish_step_lanes_kernel[lanes, THREADS, streams.current()](partials, state, lr_schedule, grad_norms, hypers,
                                                                active, bool(norm_later), cursor, int64(advance))


# Block z owns lane z's step state, record and cursor, as in finish_step_lanes_kernel.
@kernel_cache.jit
def record_norm_lanes_kernel(partials, state, grad_norms, hypers, active, cursor, advance):
    after_previous_grid()
    staged = cuda.shared.array(STAGED, float32)
    sums = cuda.shared.array(CHAINS, float64)  # a line of its own: the simulator tells shared arrays by line
    z, t = cuda.blockIdx.x, cuda.threadIdx.x
    if active[z] == 0:
        return
    if advance != 0 and t == 0:
        cursor[z, 0] += advance
    rules = hypers[z]
    if not is_norm_later(rules[0], rules[3] != 0.0):  # the whole block: its norm was recorded before the update
        return
    sum_chains(partials[z], staged, sums)
    if t == 0:
        record(sums, state[z], grad_norms[z])


def record_norm_lanes(partials, state, grad_norms, hypers, active, cursor=None, advance=0):
    """`record_norm` for every active lane z whose rules (hypers[z], as `finish_step_lanes` reads them) are under
    `step_state.norm_later`, in one launch; the other lanes' norms were recorded before their update. Then
    cursor[z, 0] += advance for every active lane, as `finish_step_lanes`."""
    lanes = _check_lanes(active, hypers)
    _check_record(partials, state, grad_norms, lanes)
    cursor = checked_lane_cursors(cursor, advance, lanes)
    if lanes == 0:
        return
    record_norm_lanes_kernel[lanes, THREADS, streams.current()](partials, state, grad_norms, hypers, active, cursor,
                                                                int64(advance))
