"""clariedge: build a query-clarification dataset from grounded dialogs and train a model on it.

OpenMP threads wait passively in every stage unless the caller chose otherwise (it must be set before torch
loads): on a machine shared with other jobs, spinning worker threads waste most of the CPU. Measured on 2
cores: one LoRA step took 70-120 s with the default policy and 20 s with PASSIVE under the same load; the
synthesize stage (MiniLM) beside an `external` run spent 13 CPU-minutes without finishing with the default,
and finished in about 3 minutes with PASSIVE beside the same run (2026-12-06).
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
