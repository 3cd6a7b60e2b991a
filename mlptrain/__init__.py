"""mlptrain: small-model training on hand-written Numba CUDA kernels."""

import time

__version__ = "0.1.0"
# The earliest moment the package sees: summary.json's startup_s and first_step_s count from here.
STARTED = time.time()
