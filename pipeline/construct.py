"""Offline `construct` backend: correct-by-construction examples from the dialogs' structure (no LLM).

Inputs:  seed turns (`SeedTurn`).
Outputs: examples (`Example`) of the four categories in both settings, rejects, stats.
Params:  `synthesize.construct.*` (see `ConstructConfig`), the top-level `seed` via the caller's rng.
"""

from __future__ import annotations

import random
from typing import Any

from clariedge.config import StageConfig
from clariedge.io import Rejects
from clariedge.schema import Example, Provenance, SeedTurn


class ConstructConfig(StageConfig):
    """Knobs of the construct backend (params.yaml: `synthesize.construct`)."""

    per_seed: int = 1


def construct(seeds: list[SeedTurn], cfg: ConstructConfig, *, rng: random.Random) -> tuple[list[Example], Rejects, dict[str, Any]]:
    """Minimal placeholder: clear rows from standalone turns (the full version follows)."""
    rejects = Rejects()
    out: list[Example] = []
    for seed in seeds:
        if not seed.is_standalone:
            continue
        prov = Provenance(generator="construct", method="clear_as_is", seed_id=seed.id, template="as_is")
        out.append(Example(conversation_id=seed.conversation_id, domain=seed.domain, setting="pre_retrieval",
                           category="clear", messages=seed.messages, needs_clarification=False, provenance=prov))
    return out, rejects, {"rows": len(out)}
