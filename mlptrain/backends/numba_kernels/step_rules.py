"""The step state's rules on the device (CUDA backend): what an optimizer step decides once per window.

`mlptrain.optim.step_state` writes them once, in the Python that Numba compiles; here each is a small kernel
of one block (a block a lane for the packed trials'), so nothing waits for the host:

- `finish_step`: the norm from the gradient's sum of squares (`reduce.sum_of_squares`), then the decisions
  (loss scaling, skip, clipping, the schedule's lr, bias corrections), before the update;
- under `step_state.norm_later` (no clipping, no loss scaling), `prepare_step` before the update and
  `record_norm` after it, on the partials the update summed as it read the gradient (`optim.adam_update`'s
  `partials`): the same state and record, one pass over the gradient fewer.

`finish_step` and `record_norm` also move a training window's data cursor (`data.gather_batch`) on to the
next window when given one: a graph's step then ends in its last rule, not in a launch of its own.
"""

from mlptrain.backends.kernel_cache import kernels as kernel_cache
from mlptrain.backends.kernel_cache.numba_names import cuda, float32, int64
from mlptrain.backends.numba_kernels import streams
from mlptrain.backends.numba_kernels.checks import checked_cursor, require, require_lanes
from mlptrain.backends.numba_kernels.grid_order import after_previous_grid
from mlptrain.backends.numba_kernels.reduce import PARTIALS
from mlptrain.optim import step_state

STAGED = PARTIALS  # the partials a launch stages in shared memory: sum_of_squares writes as many

_record_norm = cuda.jit(device=True)(step_state.record_norm)
_apply_rules = cuda.jit(device=True)(step_state.apply_rules)
_norm_later = cuda.jit(device=True)(step_state.norm_later)


@kernel_cache.device
def _finish_step(partials, state, lr_schedule, grad_norms, max_norm, beta1, beta2, dynamic_scaling, growth_factor,
                 backoff_factor, growth_interval):
    """step_state.finish_step, on the compiled rules (a device function calls device functions only)."""
    norm = _record_norm(partials, state, grad_norms)
    _apply_rules(norm, state, lr_schedule, max_norm, beta1, beta2, dynamic_scaling, growth_factor, backoff_factor,
                 growth_interval)


@kernel_cache.device
def _stage(partials, staged):
    """partials (at most STAGED) copied into the shared array `staged`, a value a thread at once, then a barrier:
    one thread's serial sum of them read global memory one by one, each load waiting on the last (~20-35 us of a
    step, ncu). Every thread of the block calls it together."""
    t = cuda.threadIdx.x
    if t < partials.shape[0]:
        staged[t] = partials[t]
    cuda.syncthreads()


@kernel_cache.device
def _prepare_step(state, lr_schedule, beta1, beta2):
    """step_state.prepare_step, on the compiled rules."""
    _apply_rules(0.0, state, lr_schedule, 0.0, beta1, beta2, False, 1.0, 1.0, 1.0)


# One block: its threads stage the partials (_stage), then one thread sums them there in order and takes the
# decisions (a handful of scalars; a launch is cheaper than a round-trip).
@kernel_cache.jit
def finish_step_kernel(partials, state, lr_schedule, grad_norms, max_norm, beta1, beta2,
                       dynamic_scaling, growth_factor, backoff_factor, growth_interval, cursor, advance):
    after_previous_grid()
    staged = cuda.shared.array(STAGED, float32)
    _stage(partials, staged)
    if cuda.threadIdx.x == 0:
        _finish_step(staged[:partials.shape[0]], state, lr_schedule, grad_norms, max_norm, beta1, beta2,
                     dynamic_scaling, growth_factor, backoff_factor, growth_interval)
        if advance != 0:
            cursor[0] += advance


def finish_step(partials, state, lr_schedule, grad_norms, max_norm, beta1, beta2,
                dynamic_scaling, growth_factor, backoff_factor, growth_interval, cursor=None, advance=0):
    """See `mlptrain.optim.step_state.finish_step`; partials float32 (at most STAGED), the rest float64 device
    arrays. Then cursor[0] += advance (`cursor` a window's 1-element int64 data cursor, None with advance 0)."""
    _check_record(partials, state, grad_norms, None)
    _check_schedule(lr_schedule, None)
    finish_step_kernel[1, STAGED, streams.current()](
        partials, state, lr_schedule, grad_norms, float(max_norm), float(beta1), float(beta2),
        bool(dynamic_scaling), float(growth_factor), float(backoff_factor), float(growth_interval),
        *_advanced(cursor, advance))


@kernel_cache.jit
def prepare_step_kernel(state, lr_schedule, beta1, beta2):
    after_previous_grid()
    if cuda.threadIdx.x == 0:
        _prepare_step(state, lr_schedule, beta1, beta2)


def prepare_step(state, lr_schedule, beta1, beta2):
    """See `mlptrain.optim.step_state.prepare_step`: state (step_state.SIZE,) and lr_schedule float64."""
    require("state", state, "float64", (step_state.SIZE,))
    _check_schedule(lr_schedule, None)
    prepare_step_kernel[1, 1, streams.current()](state, lr_schedule, float(beta1), float(beta2))


# As finish_step_kernel: the partials staged, one thread sums them in order.
@kernel_cache.jit
def record_norm_kernel(partials, state, grad_norms, cursor, advance):
    after_previous_grid()
    staged = cuda.shared.array(STAGED, float32)
    _stage(partials, staged)
    if cuda.threadIdx.x == 0:
        _record_norm(staged[:partials.shape[0]], state, grad_norms)
        if advance != 0:
            cursor[0] += advance


def record_norm(partials, state, grad_norms, cursor=None, advance=0):
    """See `mlptrain.optim.step_state.record_norm`; partials float32 (at most STAGED), state and grad_norms
    float64. Then cursor[0] += advance, as `finish_step`."""
    _check_record(partials, state, grad_norms, None)
    record_norm_kernel[1, STAGED, streams.current()](partials, state, grad_norms, *_advanced(cursor, advance))


def _advanced(cursor, advance):
    """(cursor, advance) as the rules' kernels take them: a window's cursor (None: a shared zero, left alone)."""
    if cursor is None and advance != 0:
        raise ValueError("advance needs a cursor")
    return checked_cursor(cursor), int64(advance)


def _check_record(partials, state, grad_norms, lanes):
    """The operands a norm is recorded from and into: one run's (lanes None) or `lanes` lanes'."""
    if lanes is None:
        require("partials", partials, "float32", (None,))
        require("state", state, "float64", (step_state.SIZE,))
        require("grad_norms", grad_norms, "float64", (None,))
        count = partials.shape[0]
    else:
        require_lanes("partials", partials, "float32", (lanes, None))
        require_lanes("state", state, "float64", (lanes, step_state.SIZE))
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


# Block z owns lane z's step state and grad-norm record: no atomics. Its threads stage lane z's partials, then
# one thread applies the same device functions the solo kernels run to lane z's rows; hypers[z] is in
# step_state.LANE_HYPERS order. With `norm_later`, a lane under step_state.norm_later only prepares: its norm is
# recorded after the update (record_norm_lanes).
@kernel_cache.jit
def finish_step_lanes_kernel(partials, state, lr_schedule, grad_norms, hypers, active, norm_later):
    after_previous_grid()
    staged = cuda.shared.array(STAGED, float32)
    z, t, n = cuda.blockIdx.x, cuda.threadIdx.x, partials.shape[1]
    if active[z] == 0:
        return
    rules = hypers[z]
    if norm_later and _norm_later(rules[0], rules[3] != 0.0):
        if t == 0:
            _prepare_step(state[z], lr_schedule[z], rules[1], rules[2])
        return
    _stage(partials[z], staged)
    if t == 0:
        _finish_step(staged[:n], state[z], lr_schedule[z], grad_norms[z], rules[0], rules[1], rules[2],
                     rules[3] != 0.0, rules[4], rules[5], rules[6])


def finish_step_lanes(partials, state, lr_schedule, grad_norms, hypers, active, norm_later=False):
    """`finish_step` for every active lane z (active[z] != 0) in one launch, on lane z's rows: partials
    (K, PARTIALS) float32, state (K, step_state.SIZE), lr_schedule (K, T), grad_norms (K, W) and hypers
    (K, 7) float64, active (K,) int32. hypers[z] holds lane z's rules in `step_state.LANE_HYPERS` order:
    [max_norm, beta1, beta2, dynamic_scaling (0 or 1), growth_factor, backoff_factor, growth_interval].
    With `norm_later`, a lane whose rules are under `step_state.norm_later` gets `prepare_step` instead (its
    partials unread): `record_norm_lanes` records its norm after the update. Lane operands may be lane views
    (`mlptrain.backends.lanes.lane_view`); an inactive lane is not touched.
    """
    lanes = _check_lanes(active, hypers)
    _check_record(partials, state, grad_norms, lanes)
    _check_schedule(lr_schedule, lanes)
    if lanes == 0:
        return
    finish_step_lanes_kernel[lanes, STAGED, streams.current()](partials, state, lr_schedule, grad_norms, hypers,
                                                               active, bool(norm_later))


# Block z owns lane z's step state and record, as in finish_step_lanes_kernel.
@kernel_cache.jit
def record_norm_lanes_kernel(partials, state, grad_norms, hypers, active):
    after_previous_grid()
    staged = cuda.shared.array(STAGED, float32)
    z, t, n = cuda.blockIdx.x, cuda.threadIdx.x, partials.shape[1]
    rules = hypers[z]
    if active[z] == 0 or not _norm_later(rules[0], rules[3] != 0.0):
        return
    _stage(partials[z], staged)
    if t == 0:
        _record_norm(staged[:n], state[z], grad_norms[z])


def record_norm_lanes(partials, state, grad_norms, hypers, active):
    """`record_norm` for every active lane z whose rules (hypers[z], as `finish_step_lanes` reads them) are under
    `step_state.norm_later`, in one launch; the other lanes' norms were recorded before their update."""
    lanes = _check_lanes(active, hypers)
    _check_record(partials, state, grad_norms, lanes)
    if lanes == 0:
        return
    record_norm_lanes_kernel[lanes, STAGED, streams.current()](partials, state, grad_norms, hypers, active)
