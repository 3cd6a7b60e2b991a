"""The driver path's events (mlptrain.backends.driver.api.Event): an event whose object is gone serves the
context's next one, recorded afresh, so marks made at every read do not each create and destroy one."""

import gc

import numpy as np
import pytest


@pytest.mark.real_gpu
def test_an_events_handle_serves_the_next_event_recorded_afresh():
    from mlptrain.backends.cuda import CudaBackend
    from mlptrain.backends.driver import api

    backend = CudaBackend()
    first = backend.mark()
    if first is None:
        pytest.skip("numba's path (MLPTRAIN_CUDA_LAUNCH=numba) marks nothing")
    first.wait()
    handle = int(first.handle)
    del first
    gc.collect()
    x = backend.to_device(np.arange(1 << 20, dtype=np.float32))
    second = backend.mark()  # recorded after the copy above, on the reused handle
    assert int(second.handle) == handle
    second.wait()
    assert second.done() and np.array_equal(backend.to_host(x), np.arange(1 << 20, dtype=np.float32))
    others = [api.Event().record(backend.stream) for _ in range(3)]  # none spare now: new ones
    assert len({int(event.handle) for event in others} | {handle}) == 4
