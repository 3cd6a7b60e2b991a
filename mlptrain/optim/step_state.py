"""Slots of the step state: one small float64 device array that the kernels of
an optimizer step read and write, so that loss scaling, skipping, clipping and
the schedule are all decided on the device without a host round-trip.

The host reads it only where it synchronises anyway (every `train.log_every`
steps, at evaluations and checkpoints). float64 keeps the counters exact.
"""

import math

STEP = 0  # optimizer steps applied so far
WINDOWS = 1  # accumulation windows finished (applied + skipped): the index of the next grad-norm record
SKIPPED = 2  # windows skipped because their gradients held an inf or NaN (fp16 dynamic loss scaling)
GOOD_STEPS = 3  # consecutive finite windows since the loss scale last changed (GradScaler's growth tracker)
LOSS_SCALE = 4  # multiplies the loss's gradient; 1 without dynamic scaling
GRAD_NORM = 5  # global L2 norm of this window's unscaled gradient, before clipping
APPLY = 6  # 1 when this window's update is applied, 0 when it is skipped
GRAD_MULTIPLIER = 7  # unscale x clip: what the update multiplies each summed gradient by
LR = 8  # this step's learning rate
LR_FACTOR = 9  # multiplies the schedule (reduce-on-plateau writes it at evaluations)
BIAS_CORRECTION1 = 10  # 1 - beta1^t (Adam)
BIAS_CORRECTION2 = 11  # sqrt(1 - beta2^t) (Adam)
SIZE = 12

# The rules finish_step takes, in the order of a packed trial's row of hyperparameters (the kernels'
# finish_step_lanes: hypers[lane] is one such row of float64)
LANE_HYPERS = ("max_norm", "beta1", "beta2", "dynamic_scaling", "growth_factor", "backoff_factor", "growth_interval")


def finish_step(partials, state, lr_schedule, grad_norms, max_norm, beta1, beta2,
                dynamic_scaling, growth_factor, backoff_factor, growth_interval):
    """Everything decided once per accumulation window, between the gradient's
    sum of squares (`partials`, summed here in float64) and the fused update.

    Written once, in the subset of Python that Numba compiles: the NumPy backend
    calls it as it is, the CUDA backend as a one-thread kernel, so both follow
    the same rules: `record_norm`, then `apply_rules` on its norm.
    """
    norm = record_norm(partials, state, grad_norms)
    apply_rules(norm, state, lr_schedule, max_norm, beta1, beta2, dynamic_scaling, growth_factor, backoff_factor,
                growth_interval)


CHAINS = 8  # the running sums record_norm adds the partials into: a thread each on the device


def record_norm(partials, state, grad_norms):
    """norm = ||g|| / loss_scale, the pre-clip global norm of the unscaled
    gradient from its sum of squares' partials, recorded in grad_norms[window]
    and the state's GRAD_NORM; the window is counted. Returns the norm.

    The partials are added in float64 in a fixed order: eight running sums
    (`chain_sum`), then the eight pairwise (`record_sums`). The kernels sum
    the eight chains on eight threads, the NumPy backend one after another:
    the same additions in the same order, so the same bits."""
    return record_sums(chain_sum(partials, 0), chain_sum(partials, 1), chain_sum(partials, 2),
                       chain_sum(partials, 3), chain_sum(partials, 4), chain_sum(partials, 5),
                       chain_sum(partials, 6), chain_sum(partials, 7), state, grad_norms)


def chain_sum(partials, chain):
    """Running sum `chain` (0 to CHAINS - 1) of record_norm's: partial b for every b = chain mod 8 among the
    whole eights, in order, in float64; then, into chain 0 only, the rest in turn."""
    n = partials.shape[0]
    whole = n - n % CHAINS
    total = 0.0
    for b in range(chain, whole, CHAINS):
        total += float(partials[b])
    if chain == 0:
        for b in range(whole, n):
            total += float(partials[b])
    return total


def record_sums(s0, s1, s2, s3, s4, s5, s6, s7, state, grad_norms):
    """record_norm's last part, from its eight running sums (`chain_sum`): the norm, recorded; returns it."""
    norm = math.sqrt(((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))) / state[LOSS_SCALE]
    window = int(state[WINDOWS])
    if window < grad_norms.shape[0]:
        grad_norms[window] = norm
    state[WINDOWS] = window + 1
    state[GRAD_NORM] = norm
    return norm


def norm_later(max_norm, dynamic_scaling):
    """Whether a window's update does not read its gradient's norm (no clipping, no loss scaling): then
    `prepare_step` may run before the update and `record_norm` after it, on partials the update summed as it
    read the gradient (one pass over it fewer). The same state and record as `finish_step`."""
    return max_norm <= 0.0 and not dynamic_scaling


def prepare_step(state, lr_schedule, beta1, beta2):
    """`apply_rules` of a window under `norm_later`: they never read its norm."""
    apply_rules(0.0, state, lr_schedule, 0.0, beta1, beta2, False, 1.0, 1.0, 1.0)


def apply_rules(norm, state, lr_schedule, max_norm, beta1, beta2, dynamic_scaling, growth_factor, backoff_factor,
                growth_interval):
    """The window's decisions from its gradient's norm (`record_norm`):

    - fp16 (dynamic_scaling): a non-finite norm skips the update (APPLY = 0,
      the step count and so the schedule do not advance), multiplies the scale
      by backoff_factor and resets the growth tracker; growth_interval finite
      windows in a row multiply it by growth_factor (PyTorch's GradScaler);
    - clipping as torch.nn.utils.clip_grad_norm_: coefficient
      min(1, max_norm / (norm + 1e-6)), off when max_norm <= 0;
    - lr = lr_schedule[step] * LR_FACTOR (the schedule tabulated per optimizer
      step, its last entry held beyond its end), and Adam's bias corrections
      for step t = step + 1.
    """
    scale = state[LOSS_SCALE]
    if dynamic_scaling:
        if math.isfinite(norm):
            good = state[GOOD_STEPS] + 1
            if good >= growth_interval:
                state[LOSS_SCALE] = scale * growth_factor
                good = 0.0
            state[GOOD_STEPS] = good
        else:
            state[LOSS_SCALE] = scale * backoff_factor
            state[GOOD_STEPS] = 0.0
            state[SKIPPED] += 1.0
            state[APPLY] = 0.0
            return
    step = int(state[STEP])
    state[LR] = lr_schedule[min(step, lr_schedule.shape[0] - 1)] * state[LR_FACTOR]
    clip = 1.0
    if max_norm > 0.0:
        clip = min(1.0, max_norm / (norm + 1e-6))
    state[GRAD_MULTIPLIER] = clip / scale
    state[STEP] = step + 1
    state[BIAS_CORRECTION1] = 1.0 - beta1 ** (step + 1)
    state[BIAS_CORRECTION2] = math.sqrt(1.0 - beta2 ** (step + 1))
    state[APPLY] = 1.0
