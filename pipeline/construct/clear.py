"""`clear_as_is` and `clear_rewrite`: standalone turns, and human standalone rewrites placed as the turn."""

from __future__ import annotations

import re

from clariedge.construct.core import (
    _Ctx,
    _cut_dialog,
    _docs,
    _Emitter,
    _pick_host,
    _shown_docs,
    _want,
    is_donor,
    retrieve,
)
from clariedge.construct.reading import names_own_topic, needs_its_dialog
from clariedge.construct.text import find_anchor, referent_terms
from clariedge.schema import SeedTurn

# a turn that points at what the assistant said ("what you mean by 'transportation layer'") stands alone only in
# its own conversation
_REFERS_TO_DIALOG = re.compile(
    r"\byou\s+(?:mean|meant|said|say|mentioned|described|listed|suggested|wrote)\b|\bmentioned\b"
    r"|\bin (?:this|that) (?:context|case)\b|\b(?:the )?(?:above|previous(?:ly)?|aforementioned)\b"
    # "have there been others ... for similar purposes?": a comparison with something the dialog said
    r"|\bothers\b|\bsimilar (?:purposes?|reasons?|ones?|things?|cases?|ways?)\b|\bthe other ones?\b|\bthe rest\b",
    re.I,
)


def _alone(ctx: _Ctx, method: str, turn: str) -> bool:
    """True when `turn`, shown after a dialog not its own (another conversation's, or its own with the
    referent cut away), still stands alone for a reader. (Shown first, `checks.verify` reads it so.)"""
    if needs_its_dialog(turn) is None:
        return True
    ctx.skipped[f"{method}:needs_its_dialog"] += 1
    return False


def _names_topic(ctx: _Ctx, turn: str) -> bool:
    assert ctx.checker is not None
    return names_own_topic(turn, ctx.checker.names, ctx.checker.generic, ctx.checker.rare) is not None


def _clear_rows(em: _Emitter, seed: SeedTurn, hosts: list[SeedTurn]) -> None:
    ctx = em.ctx
    history = seed.messages[:-1]
    documents = seed.documents
    if is_donor(seed) and _REFERS_TO_DIALOG.search(seed.rewrite or seed.last_turn):
        ctx.skipped["clear:donor_refers_to_dialog"] += 1
        return
    if is_donor(seed) and ctx.rng.random() < ctx.cfg.switch_prob:
        # a turn without its own dialog opens a conversation or follows another one (a topic switch), as its
        # stitched ambiguous rows do: where a turn stands says nothing about its label
        host = _pick_host(seed, set(), None, hosts, ctx)
        if host is not None:
            history = host.messages[:-1]
            if not documents and host.documents:
                # a turn retrieved nothing of its own (an MTRAG turn without passages): what a retriever finds for
                # it, not the host conversation's passages, which are about something else and taught
                # "unrelated passages -> answer"
                want = min(len(host.documents), ctx.cfg.max_documents)
                documents = retrieve(seed.rewrite or seed.last_turn, ctx, want, skip_conversation=seed.conversation_id)
    documents = _shown_docs(ctx, seed, seed.rewrite or seed.last_turn, documents)
    # a turn shown after another conversation is read alone: a rewrite standalone only in its own conversation
    # ("what about pollution?", "this soccer event") is not clear there
    foreign = bool(history) and is_donor(seed)
    # standalone by a human rewrite equal to the turn, or a first turn, or a turn with nothing pointing outside it
    judged = seed.rewrite is not None or seed.turn == 1 or find_anchor(seed.last_turn, None) is None
    if foreign and not _names_topic(ctx, seed.rewrite or seed.last_turn):
        # after another conversation a reader attaches a turn that names no topic to that conversation ("what is
        # the limit on attachment file size?" after an egg-donation chat)
        ctx.skipped["clear:foreign_unnamed_topic"] += 1
        return
    if _want(ctx, "clear_as_is") and seed.is_standalone:
        if not judged:
            ctx.skipped["clear_as_is:unjudged_reference"] += 1
        elif not foreign or _alone(ctx, "clear_as_is", seed.last_turn):
            em.both("clear_as_is", history, seed.last_turn, _docs(documents, ctx))
    if _want(ctx, "clear_rewrite") and seed.rewrite and not seed.is_standalone:
        # a standalone rewrite needs no context: place it in the full dialog or where the context is missing
        cut = _cut_dialog(history, referent_terms(seed)) if ctx.rng.random() < 0.5 else list(history)
        if not cut or (not foreign and cut == list(history)) or _alone(ctx, "clear_rewrite", seed.rewrite):
            em.both("clear_rewrite", cut, seed.rewrite, _docs(documents, ctx))
