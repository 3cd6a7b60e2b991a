"""The step state's rules compiled as device functions (CUDA backend), for the kernels that apply them:
`step_rules`' and the update that takes its rules from its own copy of the state (`optim.adam_update`'s
`prepare`). Each is `mlptrain.optim.step_state`'s function, or made of them, so every kernel and the NumPy
backend follow one set of rules in one order."""

from mlptrain.backends.kernel_cache import kernels as kernel_cache
from mlptrain.backends.kernel_cache.numba_names import cuda
from mlptrain.optim import step_state
from mlptrain.optim.step_state import CHAINS, SIZE

chain_sum = cuda.jit(device=True)(step_state.chain_sum)
record_sums = cuda.jit(device=True)(step_state.record_sums)
apply_rules = cuda.jit(device=True)(step_state.apply_rules)
is_norm_later = cuda.jit(device=True)(step_state.norm_later)


@kernel_cache.device
def sum_chains(partials, staged, sums):
    """step_state.record_norm's eight running sums into the shared float64 array `sums`: the partials (at most
    the block's threads) copied into the shared float32 array `staged`, a value a thread at once, then thread
    c < CHAINS adds chain c there (`step_state.chain_sum`), each after a barrier. One thread adding all of them
    waited on each global load in turn (~20-35 us of a step), then on each of 256 adds (4.3 us with the loads
    staged; ncu, H200). Every thread of the block calls it together."""
    t = cuda.threadIdx.x
    if t < partials.shape[0]:
        staged[t] = partials[t]
    cuda.syncthreads()
    if t < CHAINS:
        sums[t] = chain_sum(staged[:partials.shape[0]], t)
    cuda.syncthreads()


@kernel_cache.device
def record(sums, state, grad_norms):
    """step_state.record_sums on the chains' sums (`sum_chains`): the norm, recorded; returns it."""
    return record_sums(sums[0], sums[1], sums[2], sums[3], sums[4], sums[5], sums[6], sums[7], state, grad_norms)


@kernel_cache.device
def prepare_rules(state, lr_schedule, beta1, beta2):
    """step_state.prepare_step, on the compiled rules."""
    apply_rules(0.0, state, lr_schedule, 0.0, beta1, beta2, False, 1.0, 1.0, 1.0)


@kernel_cache.device
def prepared_state(state, lr_schedule, beta1, beta2, prepare, out):
    """`out` (a shared float64 array of step_state.SIZE) = the step state, with `prepare_step`'s writes where
    `prepare`: an update's own copy of this step's rules, the state itself untouched (`record_norm` writes them
    after the update). Thread 0 copies and prepares; every thread of the block calls it together (a barrier)."""
    if cuda.threadIdx.x == 0:
        for i in range(SIZE):
            out[i] = state[i]
        if prepare:
            prepare_rules(out, lr_schedule, beta1, beta2)
    cuda.syncthreads()
