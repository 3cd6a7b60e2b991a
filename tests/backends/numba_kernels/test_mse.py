"""CUDA fused MSE against the float64 reference of `tests.reference_pool` (the
cases both backends run live there). Shapes stay tiny: on the simulator every
thread is a Python thread."""


import numpy as np
import pytest

from mlptrain.backends.numba_kernels import current, loss
from tests import kernel_cases
from tests import reference_pool as ref

pytestmark = pytest.mark.gpu

BACKEND = kernel_cases.numba_backend()
FORMATS = pytest.mark.parametrize("dtype", ref.STORAGE, ids=ref.STORAGE_IDS)


@FORMATS
@pytest.mark.parametrize("rows, width", [(1, 1), (2, 7), (2, 33), (1, 100)])
def test_mse(rng, rows, width, dtype):
    ref.mse_case(BACKEND, rng, rows, width, dtype, grad_scale=1.0 / (2 * rows))


@FORMATS
def test_loss_scale_and_grad_scale_multiply_the_gradient(rng, dtype):
    """fp16's dynamic loss scale times 1 / samples in the window; the loss itself is unscaled."""
    ref.mse_case(BACKEND, rng, 2, 10, dtype, grad_scale=0.125, loss_scale=2.0**16)


def test_zero_grad_scale_evaluates_only(rng):
    doutput = ref.mse_case(BACKEND, rng, 2, 10, np.float32, grad_scale=0.0, loss_scale=2.0**16)
    assert (doutput == 0).all()


def test_rows_that_do_not_fit_are_rejected(rng):
    ref.mse_rejects_rows_that_do_not_fit(BACKEND, rng)


@FORMATS
def test_gradient_matches_the_numpy_twin_and_repeats_bit_for_bit(rng, dtype):
    """Both backends round 2 / D * grad_scale on the host and multiply in the same order;
    the loss's tree sum is fixed by the block size, so a second run repeats it exactly."""
    output, _ = ref.stored(rng.standard_normal((2, 20)), dtype)
    target, _ = ref.stored(rng.standard_normal((2, 20)), dtype)
    first, second = (ref.mse_run(BACKEND, output, target, 1, 2, 0.25, 4.0) for _ in range(2))
    twin = ref.mse_run(kernel_cases.numpy_backend(), output, target, 1, 2, 0.25, 4.0)
    np.testing.assert_array_equal(ref.bits(first[0]), ref.bits(twin[0]))
    for a, b in zip(first, second):
        np.testing.assert_array_equal(ref.bits(a), ref.bits(b))


def test_launcher_rejects_bad_arguments():
    def device(shape, dtype=np.float32):
        return current.to_device(np.zeros(shape, dtype))

    output, row_loss, scale = device((4, 3)), device(4), current.to_device(np.ones(1))
    with pytest.raises(ValueError, match="target must be float32"):
        loss.mse(output, device((4, 3), np.float16), output, row_loss, 0, 1.0, scale)
    with pytest.raises(ValueError, match="doutput has shape"):
        loss.mse(output, output, device((4, 2)), row_loss, 0, 1.0, scale)
    with pytest.raises(ValueError, match="row_loss must be float32"):
        loss.mse(output, output, output, device(4, np.float64), 0, 1.0, scale)
    with pytest.raises(ValueError, match="loss_scale must be float64"):
        loss.mse(output, output, output, row_loss, 0, 1.0, row_loss[:1])
    with pytest.raises(ValueError, match="at least one column"):
        loss.mse(device((4, 0)), device((4, 0)), device((4, 0)), row_loss, 0, 1.0, scale)
    with pytest.raises(ValueError, match="must be a device array"):
        loss.mse(np.zeros((4, 3), np.float32), output, output, row_loss, 0, 1.0, scale)


@pytest.mark.real_gpu
@FORMATS
def test_autoencoder_batch_on_the_gpu(rng, dtype):
    """The reconstruction loss of a CIFAR batch: 256 rows of 32 * 32 * 3."""
    ref.mse_case(BACKEND, rng, 256, 3072, dtype, grad_scale=1.0 / 256, loss_scale=2.0**10, offset=512)
