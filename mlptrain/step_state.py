"""Former home of the step rules, now `mlptrain.optim.step_state`.

Kept only because `mlptrain/numba_kernels/optim.py` (owned by the kernel-cache work, issue 16) still
imports this path; that change moves its two imports to `mlptrain.optim.step_state` and deletes this file.
"""

from mlptrain.optim.step_state import *  # noqa: F401,F403  (re-export, see above)
