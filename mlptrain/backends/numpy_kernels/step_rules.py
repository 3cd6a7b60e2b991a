"""The step state's rules (NumPy backend): the very functions the CUDA kernels compile, from
`mlptrain.optim.step_state`, called as they are."""

import numpy as np

from mlptrain.optim import step_state


def finish_step(partials, state, lr_schedule, grad_norms, max_norm, beta1, beta2,
                dynamic_scaling, growth_factor, backoff_factor, growth_interval, cursor=None, advance=0):
    """See `mlptrain.optim.step_state.finish_step`; then cursor[0] += advance (a window's data cursor)."""
    step_state.finish_step(partials, state, lr_schedule, grad_norms, float(max_norm), float(beta1), float(beta2),
                           bool(dynamic_scaling), float(growth_factor), float(backoff_factor),
                           float(growth_interval))
    _advance(cursor, advance)


def prepare_step(state, lr_schedule, beta1, beta2):
    """See `mlptrain.optim.step_state.prepare_step`."""
    step_state.prepare_step(state, lr_schedule, float(beta1), float(beta2))


def record_norm(partials, state, grad_norms, cursor=None, advance=0, prepare=None):
    """See `mlptrain.optim.step_state.record_norm`; with `prepare` (lr_schedule, beta1, beta2), `prepare_step`
    first (the update before took its rules from its own copy); then cursor[0] += advance, as `finish_step`."""
    if prepare is not None:
        prepare_step(state, *prepare)
    step_state.record_norm(partials, state, grad_norms)
    _advance(cursor, advance)


def _advance(cursor, advance):
    if cursor is None:
        if advance != 0:
            raise ValueError("advance needs a cursor")
        return
    cursor[0] += advance


def _norm_later(rules) -> bool:
    return step_state.norm_later(float(rules[0]), rules[3] != 0)


def finish_step_lanes(partials, state, lr_schedule, grad_norms, hypers, active, norm_later=False, cursor=None,
                      advance=0):
    """`finish_step` for every active lane z (active[z] != 0) on lane z's rows; hypers[z] holds lane z's
    rules in `step_state.LANE_HYPERS` order: [max_norm, beta1, beta2, dynamic_scaling (0 or 1),
    growth_factor, backoff_factor, growth_interval]. With `norm_later`, a lane under `step_state.norm_later`
    gets `prepare_step` instead (`record_norm_lanes` records its norm after the update). Then cursor[z, 0] +=
    advance for every active lane."""
    _check_lane_advance(cursor, advance)
    for z in np.flatnonzero(active):
        if norm_later and _norm_later(hypers[z]):
            prepare_step(state[z], lr_schedule[z], hypers[z][1], hypers[z][2])
        else:
            finish_step(partials[z], state[z], lr_schedule[z], grad_norms[z], *hypers[z])
        if cursor is not None:
            cursor[z, 0] += advance


def record_norm_lanes(partials, state, grad_norms, hypers, active, cursor=None, advance=0):
    """`record_norm` for every active lane z whose rules are under `step_state.norm_later`; then
    cursor[z, 0] += advance for every active lane."""
    _check_lane_advance(cursor, advance)
    for z in np.flatnonzero(active):
        if _norm_later(hypers[z]):
            record_norm(partials[z], state[z], grad_norms[z])
        if cursor is not None:
            cursor[z, 0] += advance


def _check_lane_advance(cursor, advance):
    if cursor is None and advance != 0:
        raise ValueError("advance needs a cursor")
