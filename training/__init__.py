"""The model: base model stage, LoRA training, inference (`Clarifier`, `predict`), evaluation and ablation.

OpenMP threads wait passively here unless the caller chose otherwise: on a machine shared with other
jobs, spinning worker threads waste most of the CPU (measured: one LoRA step on 2 cores took 70-120 s
with the default policy and 20 s with PASSIVE under the same load). It must be set before torch loads.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
