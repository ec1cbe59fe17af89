"""`clear_as_is` and `clear_rewrite`: standalone turns, and human standalone rewrites placed as the turn."""

from __future__ import annotations

from clariedge.construct.core import _cut_dialog, _docs, _Emitter, _want
from clariedge.construct.text import find_anchor, referent_terms
from clariedge.schema import SeedTurn


def _clear_rows(em: _Emitter, seed: SeedTurn) -> None:
    ctx = em.ctx
    history = seed.messages[:-1]
    # standalone by a human rewrite equal to the turn, or a first turn, or a turn with nothing pointing outside it
    judged = seed.rewrite is not None or seed.turn == 1 or find_anchor(seed.last_turn, None) is None
    if _want(ctx, "clear_as_is") and seed.is_standalone:
        if judged:
            em.both("clear_as_is", history, seed.last_turn, _docs(seed.documents, ctx))
        else:
            ctx.skipped["clear_as_is:unjudged_reference"] += 1
    if _want(ctx, "clear_rewrite") and seed.rewrite and not seed.is_standalone:
        # a standalone rewrite needs no context: place it in the full dialog or where the context is missing
        cut = _cut_dialog(history, referent_terms(seed)) if ctx.rng.random() < 0.5 else list(history)
        em.both("clear_rewrite", cut, seed.rewrite, _docs(seed.documents, ctx))
