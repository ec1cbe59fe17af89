"""Rows from a non-standalone turn (the human rewrite adds its referent): `hn_dialog_resolves` (in its full
dialog), `ad_cut_before_referent` (dialog cut before the referent), `ad_stitched` (onto another conversation)."""

from __future__ import annotations

from clariedge.construct.compare import two_candidate_rows
from clariedge.construct.core import (
    _Ctx,
    _cut_dialog,
    _docs,
    _Emitter,
    _retrieved_docs,
    _shown_docs,
    _want,
    is_donor,
    stitch,
)
from clariedge.construct.text import Anchor, anchored_referent, find_anchor, mentions_any, referent_terms, terms
from clariedge.construct.wording import clarify_dialog
from clariedge.schema import Document, SeedTurn


def _dialog_rows(em: _Emitter, seed: SeedTurn, hosts: list[SeedTurn]) -> None:
    """hn_dialog_resolves / ad_cut_before_referent / ad_stitched from a non-standalone turn."""
    ctx = em.ctx
    if seed.is_standalone or not seed.rewrite:
        return
    donor = is_donor(seed)  # no dialog of its own: only the rows that place the turn elsewhere
    anchored = anchored_referent(seed)
    ref = referent_terms(seed)
    said = [m.content for m in seed.messages[:-1]] + [d.text for d in seed.documents]
    anchor = find_anchor(seed.last_turn, seed.rewrite, " ".join(said))
    if not anchored and not donor:
        ctx.skipped["dialog:referent_not_in_dialog"] += 1
        return
    if anchor is None:
        ctx.skipped["dialog:no_anchor_in_turn"] += 1
        return
    history = seed.messages[:-1]
    assert ctx.checker is not None
    # the rewrite only polishes a turn that already stands alone ("by how much did the cotton gin increase
    # production?"): without its dialog a reader still answers it, so it is never made an open reference
    alone = ctx.checker.similarity(seed.last_turn, seed.rewrite) >= ctx.checker.rewrite_max_similarity
    if alone:
        ctx.skipped["dialog:turn_stands_alone"] += 1
    if _want(ctx, "hn_dialog_resolves") and not donor:
        em.both(
            "hn_dialog_resolves",
            history,
            seed.last_turn,
            _shown_docs(ctx, seed, seed.last_turn, seed.documents),
            resolution=seed.rewrite,
            template=f"anchor.{anchor.kind}",
        )
    reference = anchor.text if anchor.kind == "noun" else None
    if alone:
        return
    if anchor.kind == "thing" and (_want(ctx, "ad_two_candidates") or _want(ctx, "clear_one_of_two")):
        _compared(em, seed, anchor)  # (off by default: nothing searched, no random draw)
    if _want(ctx, "ad_generalized_unpinned") and reference:
        # the same complete question with a definite reference ("what did the adjudicator say?") as the first
        # turn of a conversation: nothing before it can pin the reference down
        clar, tmpl = clarify_dialog(anchor, ctx.rng)
        em.both(
            "ad_generalized_unpinned",
            [],
            seed.last_turn,
            _retrieved_docs(seed, seed.last_turn, ref | terms(reference), ctx),
            clarification=clar,
            template=f"open.{tmpl}",
            reference=reference,
        )
    if _want(ctx, "ad_cut_before_referent") and not donor:
        cut = _cut_dialog(history, ref)
        docs = _referent_free_docs(seed, ref, len(cut), ctx)
        clar, tmpl = clarify_dialog(anchor, ctx.rng)
        em.both(
            "ad_cut_before_referent", cut, seed.last_turn, docs, clarification=clar, template=tmpl, reference=reference
        )
    if anchor.kind == "ellipsis":
        return  # "what about bicycles?" after another topic is a new question, not a missing referent
    if anchor.kind != "noun":
        # after another conversation a reader attaches "it", "those" to that dialog's topic (3 of 8 such rows read
        # "answer" in two blind readings, 2026-12-04; `checks.verify` refuses them), and nobody opens a topic with "it"
        ctx.skipped["ad_stitched:pronoun_anchor"] += 1
        return
    stitch(em, seed, hosts, seed.last_turn, anchor, avoid_terms=ref, hidden=ref, reference=reference)


def _compared(em: _Emitter, seed: SeedTurn, anchor: Anchor) -> None:
    """`ad_two_candidates` / `clear_one_of_two` for a turn whose "it" stands for the one thing of a kind its rewrite
    names ("how much does it cost?" -> "... the Roth IRA ..."): after a dialog that compared it with another."""
    assert seed.rewrite is not None
    for _, group in sorted(em.ctx.groups.items()):
        members = [e for _, e in sorted(group.items())]
        named = [e for e in members if e.mentioned_in(seed.rewrite) and not e.mentioned_in(seed.last_turn)]
        if len(named) == 1:
            entity = named[0]
            before = _cut_dialog(seed.messages[:-1], set(), members)
            siblings = [e for e in members if e is not entity]
            two_candidate_rows(
                em, seed, seed.last_turn, seed.rewrite, entity, siblings, before, f"anchor.{anchor.kind}"
            )
            return


def _referent_free_docs(seed: SeedTurn, ref: set[str], cut_len: int, ctx: _Ctx) -> list[Document]:
    """Documents of an earlier turn of the same conversation that do not mention the referent."""
    earlier = [
        s
        for s in ctx.by_conv[seed.conversation_id]
        if s.turn < seed.turn and s.documents and len(s.messages) <= cut_len + 1
    ]
    for s in reversed(earlier):
        if not any(mentions_any(d.title + " " + d.text, ref) for d in s.documents):
            return _docs(s.documents, ctx)
    return []


def written_rows(em: _Emitter, seed: SeedTurn) -> None:
    """`ad_as_written`: a sample writer's open variant of a turn (`SeedTurn.clarification`), after its own dialog,
    with the writer's clarifying question. The label is the writer's: nothing in the construction to check."""
    if _want(em.ctx, "ad_as_written"):
        assert seed.clarification is not None
        em.both(
            "ad_as_written",
            seed.messages[:-1],
            seed.last_turn,
            seed.documents,
            clarification=seed.clarification,
            template="written",
        )
