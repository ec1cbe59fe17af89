"""`ad_two_candidates` and `clear_one_of_two`: a dialog that compared two things of one kind, then a turn whose "it"
fits either ("how long does it protect for?" after the live and the recombinant shingles vaccine were compared), or
the turn's precise rewrite, which names one of them.

Real users compare, then ask on with "it": a reader cannot tell which of the two they mean. The same dialog followed
by the precise question is clear, so that the dialog's shape says nothing about the label. (Loose questions made by
removing a name, "what's the contribution limit for an IRA?", were tried in this place and read wrong 6 times in 16,
2026-12-07: such a question came from a precise one, and its other words fit one of the two, "deductible" the
traditional IRA, or both alike, the same limit.)"""

from __future__ import annotations

import re
from collections.abc import Sequence

from clariedge.construct.core import _Ctx, _Emitter, _want
from clariedge.construct.entities import Entity
from clariedge.construct.senses import WORDS_NO_SENSE_USES
from clariedge.construct.text import sentences, stem, terms
from clariedge.construct.wording import COMPARE, clarify_documents, pick, plain_label
from clariedge.schema import Document, Message, SeedTurn

# a definite or demonstrative noun phrase: "it" may stand for it ("and that one-day service, can we use it for her?"),
# or it is itself what is open ("what did the adjudicator say about it?"), not which of the two things
_OTHER_THING = re.compile(r"\b(?:the|this|that|these|those)\s+[a-z]", re.I)


def comparable(ctx: _Ctx, entity: Entity, siblings: Sequence[Entity]) -> list[Entity]:
    """The siblings a user would compare with `entity`: variants of one name ("IRA (Roth)", "IRA (Traditional)")
    with passages, of the same kind in plain words ("the Roth IRA" and "the traditional IRA", "the Archive plan"
    and "the Standard plan"; not "the planet" and "the element", which nobody compares). Names that only share a
    head noun ("Greyfell Mountain Weather service", "Passport fast-track service") are different things: a reader
    knew which one "where do I book that?" meant (2026-12-07)."""
    if entity.kind != "paren":
        return []
    kind = stem(plain_label(entity, ctx.docs_by_title).split()[-1])
    return [
        s
        for s in siblings
        if s.kind == "paren"
        and ctx.docs_by_title.get(s.title)
        and stem(plain_label(s, ctx.docs_by_title).split()[-1]) == kind
    ]


def _lead(documents: Sequence[Document], count: int = 2) -> str:
    """What an assistant says of a thing first: the leading sentences of its first passage."""
    return " ".join(sentences(documents[0].text.strip())[:count])


def _open_between(ctx: _Ctx, turn: str, pair: Sequence[Entity]) -> bool:
    """Whether the turn's own words leave both of the compared things possible: the sense judge over the two finds
    no word of one of them and no clear lean (words neither's passages use say nothing of which one)."""
    v = ctx.judge.judge(turn, [e.title for e in pair], terms(pair[0].head))
    undecided = v.label == "unclear" and v.reason == WORDS_NO_SENSE_USES and v.margin <= ctx.judge.ask_max_margin
    return v.label == "ask" or undecided


def two_candidate_rows(
    em: _Emitter,
    seed: SeedTurn,
    turn: str,
    precise: str,
    entity: Entity,
    siblings: Sequence[Entity],
    before: Sequence[Message],
    template: str,
) -> None:
    """After `before` (a dialog that names none of them), the user compares `entity` with a drawn sibling and the
    assistant describes both; then `turn` (open between the two: `ad_two_candidates`) or `precise` (naming
    `entity`: `clear_one_of_two`). Post-retrieval, one passage of each is shown."""
    ctx = em.ctx
    if _OTHER_THING.search(turn):
        ctx.skipped["two_candidates:turn_names_another_thing"] += 1
        return
    others = comparable(ctx, entity, siblings)
    if not others:
        ctx.skipped["two_candidates:no_comparable_sibling"] += 1
        return
    pair = [entity, others[pick(ctx.rng, len(others))]]
    ctx.rng.shuffle(pair)
    if not _open_between(ctx, turn, pair):
        ctx.skipped["two_candidates:turn_picks_one"] += 1
        return
    labels = [plain_label(e, ctx.docs_by_title) for e in pair]
    question = COMPARE[pick(ctx.rng, len(COMPARE))].format(a=labels[0], b=labels[1])
    answer = " ".join(_lead(ctx.docs_by_title[e.title]) for e in pair)
    history = [
        *before,
        Message(role="user", content=question[:1].upper() + question[1:]),
        Message(role="assistant", content=answer),
    ]
    documents = [ctx.docs_by_title[e.title][0] for e in pair]
    senses = [e.title for e in pair]
    if _want(ctx, "ad_two_candidates"):
        clar, tmpl = clarify_documents(labels, ctx.rng, retrieved=False)
        em.both(
            "ad_two_candidates",
            history,
            turn,
            documents,
            clarification=clar,
            interpretations=[e.label for e in pair],  # the titles' readings, as every method records them
            senses=senses,
            template=f"{template}.{tmpl}",
        )
    if _want(ctx, "clear_one_of_two"):
        em.both("clear_one_of_two", history, precise, documents, senses=senses, template=template)
