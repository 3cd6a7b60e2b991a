"""Dense layers as tiled GEMMs with fused epilogues (CUDA backend).

Layout: x (M, K) row-major activations, w (K, N) weights, b (N,), y (M, N),
all C-contiguous. Activations and weights share one storage format (float32,
or float16 / bf16-in-uint16 for mixed precision); weight gradients are always
float32. Elements are converted to float32 as they are loaded, every product
is summed in float32, and outputs are rounded to the storage format once. The three products of a dense layer differ only
in which operand is read transposed:

    forward          y  = act(x @ w + b)       A = x  (M,K)      B = w   (K,N)
    backward input   dx = (dy @ w.T) * act'(h)  A = dy (M,N)      B = w.T (w is N-major)
    backward weight  dw = beta * dw + x.T @ dy  A = x.T (x is M-major) B = dy

Each is one tile product of an engine (gemm_engines.py: the CUDA cores' tiles, tf32x3 on tensor cores, or
the narrow kernels): the forward and the input gradient are one kernel factory that differs in how w is
read and in the epilogue; the weight gradient writes its sums itself. With a workspace, a run's own pass of
few tiles sums its K, or its long batch, in chunks by more blocks, added in chunk order (gemm_split.py).
No atomics: a fixed summation order, bitwise-reproducible results.

Packed trials (several models of one architecture trained at once) pass every operand with a leading
trial axis: one launch, block z computing trial z's tile of its own operands; the tile is chosen for all
the trials' blocks together, so a small layer gets the large tiles a big one would.
"""

import functools

import numpy as np

from mlptrain.backends.kernel_cache import kernels as kernel_cache
from mlptrain.backends.kernel_cache.numba_names import config, cuda, float32
from mlptrain.backends.numba_kernels import current, gemm_engines, gemm_narrow, gemm_split, reduce, streams, tensor_core
from mlptrain.backends.numba_kernels.checks import (
    check_cross_entropy, checked_cursor, require, require_lanes, require_one_of)
from mlptrain.backends.numba_kernels.chunks import add_chunks
from mlptrain.backends.numba_kernels.codecs import STORAGE_DTYPES, codec
from mlptrain.backends.numba_kernels.gemm_weight import (
    lanes_weight_bias_plan, make_linear_backward_weight, make_linear_backward_weight_bias, weight_bias_plan)
from mlptrain.backends.numba_kernels.grid_order import after_previous_grid
from mlptrain.backends.numba_kernels.tiles import check_activation, dense_operand, make_epilogues, pick_tile

NARROW_MOST = gemm_narrow.NARROW_MOST
TF32_TILE = gemm_engines.TF32_TILE  # for packing.lane_step, which reaches the kernels through its backend
# A run's own float32 layers (not a packed group's, whose engine packing.lane_step chooses) sum their wide passes
# on "tf32x3", their K split into chunks where their tiles are few (layer_engines; benchmarks/NOTES.md, issue 31
# step 1c); off, on "fma". Off on the simulator, which emulates each mma through shared memory: a tiny MLP's
# gradient took 30-40 s there against 0.6 on "fma" (the tf32x3 kernels are tested there on a small tile)
RUN_TF32X3 = not config.ENABLE_CUDASIM
# ... and its 16-bit layers too, one exact tf32 product a fragment (their values fit a tf32), where RUN_TF32X3 is on
# and RUN_MMA16 off. Off: 2-3 µs a step slower than "fma" (benchmarks/NOTES.md, issue 31 step 2)
RUN_TF32X3_16 = False
# A run's own 16-bit layers sum their wide passes on "mma16" (m16n8k16 on tensor cores, cp.async slices), where on;
# off on the simulator, as RUN_TF32X3 is
RUN_MMA16 = not config.ENABLE_CUDASIM


def _with_trial_axis(lead, *arrays):
    """`arrays` as they are where they carry a trial axis, else each as one trial's (a leading axis of 1)."""
    return arrays if lead else tuple(array.reshape(1, *tuple(array.shape)) for array in arrays)


# --- forward y = act(x @ w + b) and backward input dx = (dy @ w.T) * act'(h) --------

@functools.cache
def make_linear_rows(tile, dtype, backward, trials=False, engine="fma", staging=(False, False, 0), **jit_options):
    """The kernel (a, w, other, out, activation) of a pass whose output rows are the batch's:
    forward (backward False): out = act(a @ w + other), a = x (M, K), other = b;
    backward input: out = (a @ w.T) * act'(other), a = dy (M, N), other = h, w read N-major.
    With `trials`, every argument has a leading trial axis and block z computes trial z's, unless `active[z]`
    (a further argument, (T,) int32) is 0. `staging` as gemm_engines.engine_staging gives it."""
    BM, BN = tile[:2]
    load, store = codec(dtype)
    make_product, layout = gemm_engines.engine_parts(engine, tile, dtype, staging)
    TM, TN = layout.TM, layout.TN
    tile_product = make_product(dense_operand(load, True), dense_operand(load, backward))
    bias_activation, activation_grad = make_epilogues(layout, load, store)
    epilogue = activation_grad if backward else bias_activation

    # Block (by, bx) owns out[by*BM:+BM, bx*BN:+BN]: its K-split groups sum
    # their shares of a's columns, group 0 adds them in order and each of its
    # threads writes its own TM x TN outputs through the epilogue. No atomics.
    @kernel_cache.device
    def rows_tile(a, w, other, out, activation):
        M, summed = a.shape
        N = out.shape[1]
        m0, n0 = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
        acc = cuda.local.array((TM, TN), float32)
        if tile_product(a, w, acc, m0, n0, M, N, 0, summed):
            epilogue(acc, other, out, m0, n0, M, N, activation)

    if trials:
        @kernel_cache.jit(**jit_options)
        def trial_rows_kernel(a, w, other, out, activation, active):
            after_previous_grid()
            z = cuda.blockIdx.z
            if active[z] != 0:  # the whole block, uniformly: none of its barriers is left waiting
                rows_tile(a[z], w[z], other[z], out[z], activation)

        return trial_rows_kernel

    @kernel_cache.jit(**jit_options)
    def linear_rows_kernel(a, w, other, out, activation):
        after_previous_grid()
        rows_tile(a, w, other, out, activation)

    return linear_rows_kernel


def _trial_axis(array):
    """(T,) for an array with a leading trial axis (3-D where a layer's operand is 2-D), else ().
    Shapes are read as tuples: the simulator's own shape object takes no negative index."""
    return tuple(array.shape[:1]) if len(array.shape) == 3 else ()


def _checks(lead):
    """A trial-axis operand may be a lane view (mlptrain.backends.lanes): each trial's block C-contiguous, the
    trials apart by any stride (a layer's weights among each trial's flat parameters)."""
    return require_lanes if lead else require


def linear_forward(x, w, b, y, activation, engine="fma", tiles_for=None, active=None, workspace=None):
    """y = act(x @ w + b), all four in one storage format, summed by `engine` (ENGINES). With a float32
    `workspace` of `linear_rows_workspace(...)` elements, a pass of few tiles ("fma" or "tf32x3") sums its K in
    chunks by more blocks (gemm_split.py; a run's own launches, no trial axis). With a leading
    trial axis (x (T, M, K), w (T, K, N), b (T, N), y (T, M, N)) one launch computes the T trials' layers,
    each from its own operands in the order a launch of its own would use with the same tile: the tile chosen
    for `tiles_for` trials (default T; a group of K lanes launching its first T passes K, so that a lane's sums
    are the same however many lanes step with it). `active` (T,) int32: trials whose entry is 0 are not
    computed (their outputs are left as they are); default all."""
    lead = _trial_axis(x)
    require_one_of("x", x, STORAGE_DTYPES, (*lead, None, None))
    M, K = tuple(x.shape)[-2:]
    _checks(lead)("w", w, x.dtype, (*lead, K, None))
    N = tuple(w.shape)[-1]
    _checks(lead)("b", b, x.dtype, (*lead, N))
    _checks(lead)("y", y, x.dtype, (*lead, M, N))
    check_activation(activation)
    gemm_engines.check_engine(engine, x.dtype, N)
    if engine == "narrow":
        if M and N and (not lead or lead[0]):
            grid, threads, split = gemm_narrow.forward_grid(M, K, lead[0] if lead else 1)
            gemm_narrow.make_narrow_forward(N, x.dtype, split)[grid, threads, streams.current()](
                *_with_trial_axis(lead, x, w, b, y), activation, *_trial_mask(lead or (1,), active))
        return
    _rows_pass(x, w, b, y, activation, M, N, lead, False, engine, tiles_for, active, workspace)


def linear_forward_cross_entropy(x, w, b, logits, labels, dlogits, row_loss, row_correct, offset, grad_scale,
                                 loss_scale, cursor=None, input_gradient=None):
    """A classifier's output layer and its loss in one launch: `linear_forward(x, w, b, logits, NONE,
    "narrow")`, then `loss.softmax_cross_entropy(logits, labels, dlogits, row_loss, row_correct, offset,
    grad_scale, loss_scale, cursor)` on the logits as stored, with their bits (gemm_narrow.py). One run's
    operands (no trial axis); at most NARROW_MOST classes. Given `input_gradient` (h, dx, activation): then
    `linear_backward_input(dlogits, w, h, dx, activation, "narrow")`, with its bits, in the same launch where
    gemm_narrow.FUSE_INPUT_GRADIENT is on, else in a launch of its own right after."""
    require_one_of("x", x, STORAGE_DTYPES, (None, None))
    M, K = tuple(x.shape)
    require("w", w, x.dtype, (K, None))
    N = tuple(w.shape)[1]
    require("b", b, x.dtype, (N,))
    require("logits", logits, x.dtype, (M, N))
    gemm_engines.check_engine("narrow", x.dtype, N)
    check_cross_entropy(logits, labels, dlogits, row_loss, row_correct, offset, loss_scale)
    fused = input_gradient is not None and gemm_narrow.FUSE_INPUT_GRADIENT
    if input_gradient is not None:
        h, dx, activation = input_gradient
        require("h", h, x.dtype, (M, K))
        require("dx", dx, x.dtype, (M, K))
        check_activation(activation)
    if M == 0:
        return
    grid, threads, split = gemm_narrow.forward_grid(M, K, 1)
    args = (x, w, b, logits, labels, dlogits, row_loss, row_correct, checked_cursor(cursor), offset,
            float32(grad_scale), loss_scale)
    kernel = gemm_narrow.make_narrow_cross_entropy(N, x.dtype, split, fused)
    if fused:
        kernel[grid[0], threads, streams.current()](*args, h, dx, activation)
        return
    kernel[grid[0], threads, streams.current()](*args)
    if input_gradient is not None:
        linear_backward_input(dlogits, w, h, dx, activation, "narrow")


def linear_backward_input(dy, w, h, dx, activation, engine="fma", tiles_for=None, active=None, workspace=None):
    """dx = (dy @ w.T) * act'(h), where h = act(z) is this layer's input.

    All four share one storage format. With activation NONE, h is not read
    (pass dx or any (M, K) array of that format). A leading trial axis on all
    four, `tiles_for`, `active` and `workspace`, as in linear_forward.
    """
    lead = _trial_axis(dy)
    require_one_of("dy", dy, STORAGE_DTYPES, (*lead, None, None))
    M, N = tuple(dy.shape)[-2:]
    _checks(lead)("w", w, dy.dtype, (*lead, None, N))
    K = tuple(w.shape)[-2]
    _checks(lead)("h", h, dy.dtype, (*lead, M, K))
    _checks(lead)("dx", dx, dy.dtype, (*lead, M, K))
    check_activation(activation)
    gemm_engines.check_engine(engine, dy.dtype, N)
    if engine == "narrow":
        if M and K and (not lead or lead[0]):
            grid, threads, rows = gemm_narrow.input_grid(M, K, lead[0] if lead else 1)
            gemm_narrow.make_narrow_backward_input(N, dy.dtype)[grid, threads, streams.current()](
                *_with_trial_axis(lead, dy, w, h, dx), activation, *_trial_mask(lead or (1,), active), rows)
        return
    _rows_pass(dy, w, h, dx, activation, M, K, lead, True, engine, tiles_for, active, workspace)


_ALL_ACTIVE = {}  # (GPU, trials) -> a device array of ones, made once: nothing writes it


def _trial_mask(lead, active):
    """The launch's trailing arguments: `active` (checked) or all ones with a trial axis, none without. The ones
    are made once per GPU and trial count, so that a launch without a mask allocates and copies nothing after
    its first (a CUDA graph's capture would refuse the copy)."""
    if not lead:
        return ()
    if active is None:
        key = (current.device(), lead[0])
        if key not in _ALL_ACTIVE:
            _ALL_ACTIVE[key] = current.to_device(np.ones(lead[0], np.int32))
        return (_ALL_ACTIVE[key],)
    require("active", active, "int32", lead)
    return (active,)


def _rows_pass(a, w, other, out, activation, M, N, lead, backward, engine, tiles_for, active, workspace):
    trials = lead[0] if lead else 1
    if M == 0 or N == 0 or trials == 0:
        return
    if workspace is not None and not lead:
        require("workspace", workspace, "float32", (None,))
        plan = gemm_split.rows_split(engine, M, tuple(a.shape)[1], N)
        if plan[4] > 1:
            gemm_split.split_rows_pass(engine, a, w, other, out, activation, backward, workspace,
                                       gemm_engines.engine_staging(engine, a, w), plan)
            return
    tile, grid, threads = gemm_engines.engine_launch(engine, M, N, trials, lead, tiles_for)
    make_linear_rows(tile, a.dtype, backward, bool(lead), engine, gemm_engines.engine_staging(engine, a, w))[
        grid, threads, streams.current()](
        a, w, other, out, activation, *_trial_mask(lead, active))


# --- backward weight: dw = beta * dw + x.T @ dy (the kernels: gemm_weight.py) --------------------------

def linear_backward_weight_bias(x, dy, dw, db, beta, workspace=None, engine="fma", tiles_for=None, active=None):
    """linear_backward_weight(x, dy, dw, beta, workspace, engine), then reduce.bias_backward(dy, db, beta,
    workspace): in one launch where weight_bias_plan gives one (a step's launch fewer a layer), with the bits of
    the two. With a leading trial axis (packed lanes: db (T, N)), linear_backward_weight's trial-axis launch
    (`tiles_for`, `active`) and reduce.bias_backward_lanes for the active trials, in one launch where
    lanes_weight_bias_plan gives one."""
    B, K = tuple(x.shape)[-2:]
    N = tuple(dy.shape)[-1]
    lead = _trial_axis(x)
    if lead:
        plan = lanes_weight_bias_plan(engine, B, K, N, lead[0], tiles_for)
    else:
        plan = weight_bias_plan(engine, B, K, N, workspace is not None)
    if plan is None:
        linear_backward_weight(x, dy, dw, beta, workspace, engine, tiles_for, active)
        if lead:
            reduce.bias_backward_lanes(dy, db, beta)
        else:
            reduce.bias_backward(dy, db, beta, workspace)
        return
    _check_weight_gradient(x, dy, dw, beta, engine)
    _checks(lead)("db", db, "float32", (*lead, N))
    tile, grid, threads, width, weight_rows = plan
    kernel = make_linear_backward_weight_bias(tile, x.dtype, engine, gemm_engines.engine_staging(engine, x, dy),
                                              width, threads, bool(lead))
    if lead:
        kernel[grid, threads, streams.current()](x, dy, dw, db, float32(beta), weight_rows,
                                                 *_trial_mask(lead, active))
        return
    kernel[grid, threads, streams.current()](x, dy, dw, db.reshape(1, N), float32(beta), weight_rows)


def _check_weight_gradient(x, dy, dw, beta, engine):
    """(trial axis, B, K, N) of a weight gradient's operands, after checking them (linear_backward_weight's)."""
    lead = _trial_axis(x)
    require_one_of("x", x, STORAGE_DTYPES, (*lead, None, None))
    B, K = tuple(x.shape)[-2:]
    _checks(lead)("dy", dy, x.dtype, (*lead, B, None))
    N = tuple(dy.shape)[-1]
    _checks(lead)("dw", dw, "float32", (*lead, K, N))
    if beta not in (0.0, 1.0):
        raise ValueError(f"beta must be 0.0 (overwrite) or 1.0 (accumulate), got {beta!r}")
    gemm_engines.check_engine(engine, x.dtype, N)
    return lead, B, K, N


def linear_backward_weight_workspace(batch, inputs, outputs, trials=None, engine="fma"):
    """float32 elements of workspace linear_backward_weight on `engine` can use for x (batch, inputs) and dy
    (batch, outputs): 0 where one block per output tile already fills the GPU, and for a trial-axis
    launch (`trials` given), whose trials' blocks fill it instead. Never smaller for a smaller batch,
    so one workspace sized for the largest batch serves all."""
    if trials is not None or engine == "narrow":
        return 0
    most = gemm_split.weight_chunks(engine, batch, inputs, outputs)[5]
    return most * inputs * outputs if most > 1 else 0


def tensor_cores():
    """Whether the current GPU runs the tensor-core engines ("tf32x3", "mma16"): compute capability
    tensor_core.CAPABILITY or later (older GPUs sum every pass on "fma" or "narrow")."""
    return current.kernel_capability() >= tensor_core.CAPABILITY


def layer_engines(outputs, dtype):
    """The engine (ENGINES) of each pass of a dense layer of `outputs` outputs storing `dtype`, in a run of its
    own. "narrow" for the forward and the input gradient of a layer of NARROW_MOST outputs or fewer (a
    classifier's): on the tiles a 128 x 784 -> 512 -> 512 -> 10 step's output layer took 14.3 µs for its forward
    and 8.8 for its input gradient, K = 512 summed by 32 x 32 tiles of 10 useful columns (benchmarks/step_profile.py
    --model mlp, H100; benchmarks/NOTES.md, issue 31 step 1). Its weight gradient stays on "fma", whose chunks
    sum a long batch in many blocks where a narrow thread sums every row itself (on tf32x3's 64 x 64 tiles, 8 of
    them, it took 9.6 µs against 7.5 at batch 128, 18.4 against 13.2 at 2048). A wider layer's passes, where
    `tensor_cores()`: float32 on "tf32x3" where RUN_TF32X3 is on (float32 accuracy on tensor cores),
    16-bit formats on "mma16" where RUN_MMA16 is on (else on "tf32x3", exact there, where RUN_TF32X3_16 is on);
    else "fma"."""
    if str(np.dtype(dtype)) == "float32":
        wanted = "tf32x3" if RUN_TF32X3 else None
    else:
        wanted = "mma16" if RUN_MMA16 else "tf32x3" if RUN_TF32X3 and RUN_TF32X3_16 else None
    tiles = wanted if wanted and tensor_cores() else "fma"
    if outputs <= NARROW_MOST:
        return {"forward": "narrow", "backward_input": "narrow", "backward_weight": "fma"}
    return {"forward": tiles, "backward_input": tiles, "backward_weight": tiles}


def linear_rows_workspace(rows, summed, outputs, engine="fma"):
    """float32 elements of workspace linear_forward (summed = its inputs) or linear_backward_input (summed = the
    layer's outputs, outputs = its inputs) on `engine` can use for batches of up to `rows`: 0 where no such
    batch splits its sum (gemm_split.rows_split)."""
    return gemm_split.workspace_for(rows, outputs, lambda m: gemm_split.rows_split(engine, m, summed, outputs)[4])


def linear_variants(rows, inputs, outputs, workspace=True, trials=None, dtype="float32"):
    """The kernel each pass of an (inputs -> outputs) dense layer storing `dtype` over `rows` samples runs, for
    the run's record: a run's own passes by `layer_engines`, "narrow", "tf32x3", "mma16" or the CUDA-core tile
    ("tiled/<name>"), with `+split` where the forward or input gradient sums its K in chunks (`+cluster` where
    those chunks are one thread-block cluster, gemm_split.clustered) and `+chunks` where
    the weight gradient sums the batch in chunks, given a workspace, `+bias` where the bias gradient is summed in
    the weight gradient's launch (weight_bias_plan); a trial-axis launch's ("+trials") the tile
    the CUDA cores take for all `trials` (packed groups record their engine themselves)."""
    if trials is not None:
        return {"forward": f"tiled/{pick_tile(rows, outputs, trials)}+trials",
                "backward_input": f"tiled/{pick_tile(rows, inputs, trials)}+trials",
                "backward_weight": f"tiled/{pick_tile(inputs, outputs, trials)}+trials"}
    engines = layer_engines(outputs, dtype)

    def label(name, M, N, chunks):
        engine = engines[name]
        if engine == "narrow":
            return engine
        base = engine if engine in ("tf32x3", "mma16") else f"tiled/{pick_tile(M, N)}"
        suffix = "+chunks" if name == "backward_weight" else "+cluster" if gemm_split.clustered(engine, chunks) \
            else "+split"
        grouped = name == "backward_weight" and weight_bias_plan(engine, rows, inputs, outputs, workspace)
        return base + (suffix if workspace and chunks > 1 else "") + ("+bias" if grouped else "")

    split = gemm_split.rows_split
    return {"forward": label("forward", rows, outputs, split(engines["forward"], rows, inputs, outputs)[4]),
            "backward_input": label("backward_input", rows, inputs,
                                    split(engines["backward_input"], rows, outputs, inputs)[4]),
            "backward_weight": label("backward_weight", inputs, outputs,
                                     gemm_split.weight_chunks(engines["backward_weight"], rows, inputs, outputs)[4])}


def linear_backward_weight(x, dy, dw, beta, workspace=None, engine="fma", tiles_for=None, active=None):
    """dw = beta * dw + x.T @ dy (beta 0 overwrites, 1 accumulates); x and dy in one storage
    format, dw float32 (gradients are accumulated in float32 whatever the precision). With a float32
    workspace of `linear_backward_weight_workspace(...)` elements, a long batch is summed in chunks
    by more blocks (see CHUNK_BLOCKS). With a leading trial axis (x (T, B, K), dy (T, B, N), dw
    (T, K, N)) one launch computes the T trials' gradients, each summed inside its blocks (no workspace),
    as the tf32x3 engine sums every gradient; `tiles_for` and `active` as in linear_forward."""
    lead, B, K, N = _check_weight_gradient(x, dy, dw, beta, engine)
    if K == 0 or N == 0 or (lead and lead[0] == 0):
        return
    if engine == "narrow":
        grid, threads = gemm_narrow.weight_grid(K, N, lead[0] if lead else 1)
        gemm_narrow.make_narrow_backward_weight(x.dtype)[grid, threads, streams.current()](
            *_with_trial_axis(lead, x, dy, dw), float32(beta), *_trial_mask(lead or (1,), active))
        return
    if lead:
        tile, grid, threads = gemm_engines.engine_launch(engine, K, N, lead[0], lead, tiles_for)
        make_linear_backward_weight(tile, x.dtype, True, engine, gemm_engines.engine_staging(engine, x, dy))[
            grid, threads, streams.current()](
            x, dy, dw, float32(beta), *_trial_mask(lead, active))
        return
    tile, grid, threads, chunk, chunks, _ = gemm_split.weight_chunks(engine, B, K, N)
    staging = gemm_engines.engine_staging(engine, x, dy)
    if workspace is not None and chunks > 1:
        require("workspace", workspace, "float32", (None,))
        if workspace.shape[0] < chunks * K * N:  # as conv and reduce do: never a silent slower path
            raise ValueError(f"workspace has {workspace.shape[0]} elements, needs {chunks * K * N} "
                             "(linear_backward_weight_workspace(batch, inputs, outputs))")
        partials = workspace[:chunks * K * N]
        gemm_split.make_chunk_partials(tile, x.dtype, engine, staging, None)[(*grid, chunks), threads, streams.current()](
            x, dy, partials.reshape(chunks, K, N), chunk)
        add_chunks(partials.reshape(chunks, K * N), dw.reshape(K * N), beta)
        return
    make_linear_backward_weight(tile, x.dtype, False, engine, staging)[grid, threads, streams.current()](
        x, dy, dw, float32(beta))
