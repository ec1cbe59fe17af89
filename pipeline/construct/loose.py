"""Loose questions (a precise question with its distinguishing modifier removed) and the entity-collision
family: `hn_generalized_in_dialog`, `ad_generalized_unpinned`, `ad_stitched` (loose), `hn_documents_resolve`,
`adoc_entity_collision`, `clear_specific_docs`, and `hn_turn_resolves` (the loose question's own words
pick one sense: `checks.SenseJudge`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from clariedge.construct.core import (
    _Ctx,
    _cut_dialog,
    _docs,
    _Emitter,
    _pick_host,
    _retrieved_docs,
    _shown_docs,
    _want,
    stitch,
)
from clariedge.construct.entities import Entity, class_noun, generalize, text_entities, to_class
from clariedge.construct.senses import QUESTION_WORDS, SenseVerdict, broken_name, named_in_full, still_named
from clariedge.construct.text import _DETERMINERS, Anchor, find_anchor, stem, terms
from clariedge.construct.wording import clarify_dialog, clarify_documents, display_head, plain_label
from clariedge.schema import Document, Message, SeedTurn
from clariedge.text import words


def _resolved_in_dialog(
    em: _Emitter, seed: SeedTurn, history: Sequence[Message], turn: str, question: str, template: str, **kw: Any
) -> None:
    """`hn_generalized_in_dialog`: the loose `turn` after a dialog that names the one thing it means."""
    shown = _shown_docs(em.ctx, seed, turn, seed.documents)
    em.both("hn_generalized_in_dialog", history, turn, shown, resolution=question, template=template, **kw)


def _seed_entities(seed: SeedTurn, ctx: _Ctx) -> list[tuple[Entity, str]]:
    """Entities the seed's standalone question (the turn, or its rewrite) names precisely."""
    question = seed.rewrite if seed.rewrite else seed.last_turn
    if seed.rewrite is None and seed.turn > 1 and find_anchor(seed.last_turn, None) is not None:
        return []
    found: list[tuple[Entity, str]] = []
    for _, group in sorted(ctx.groups.items()):
        for _, e in sorted(group.items()):
            if e.mentioned_in(question):
                found.append((e, question))
    for e in text_entities(question):
        if all(e.key != f.key for f, _ in found):
            found.append((e, question))
    return found


def _generalized_rows(em: _Emitter, seed: SeedTurn, hosts: list[SeedTurn]) -> None:
    """Loose questions (modifier removed): hn in the naming dialog, ad unpinned/stitched, adoc, hn by docs."""
    ctx = em.ctx
    cands = _seed_entities(seed, ctx)
    # title entities (with documents) first, then the text's own; a few per seed, drawn
    titled = [c for c in cands if c[0].title]
    plain = [c for c in cands if not c[0].title]
    ctx.rng.shuffle(titled)
    ctx.rng.shuffle(plain)
    for entity, question in [*titled, *plain][: ctx.cfg.entities_per_seed]:
        _generalized_entity_rows(em, seed, hosts, entity, question)


def _as_typed(head: str, turn: str) -> str:
    """`head` with its last word in the number the turn uses ("those lakes" -> "lakes", not "lake"), so that the
    clarification asks about what the user wrote."""
    *rest, last = head.split()
    typed = next((w for w in words(turn) if stem(w) == stem(last) and w != last.lower() and w.endswith("s")), None)
    return " ".join([*rest, typed]) if typed else head


def _generalized_entity_rows(
    em: _Emitter, seed: SeedTurn, hosts: list[SeedTurn], entity: Entity, question: str
) -> None:
    ctx = em.ctx
    # a name keeps its article ("the Cardinals"); a demonstrative ("these Cardinals") would say it was named before
    det = "the" if entity.kind == "paren" else _DETERMINERS[ctx.rng.randrange(len(_DETERMINERS))]
    loose = generalize(question, entity, det)
    if loose is None or len(words(loose)) < 3:
        ctx.skipped["generalize:failed"] += 1
        return
    problem = broken_name(loose, entity.head) or still_named(loose, entity.head)
    if problem:
        ctx.rejects.add("broken_or_named", seed.id, problem, loose)
        return
    group = ctx.groups.get(entity.key, {})
    siblings = [e for k, e in sorted(group.items()) if k != entity.modifier.lower()]
    family = [entity, *siblings]
    senses = [e.title for e in family if e.title] if siblings else []  # what the row's meaning check reads
    history = seed.messages[:-1]
    noun_anchor = Anchor("noun", _as_typed(display_head(entity, ctx.docs_by_title), loose))
    gen = f"gen.{entity.kind}.{det}"
    # what the loose question's own words say about the senses of its name (None: no competing senses)
    verdict = judge_senses(ctx, loose, family) if siblings else None
    if verdict is not None and verdict.label == "unclear":
        ctx.rejects.add(
            "sense_unclear", seed.id, f"{verdict.reason} {list(verdict.cues)} margin={verdict.margin}", loose
        )
    if verdict is not None and verdict.label == "answer" and verdict.sense != entity.title:
        ctx.rejects.add("sense_conflict", seed.id, f"the turn picks {verdict.sense}, not {entity.title}", loose)
        return

    # hard negative: the dialog named this entity and no sibling, so the loose question is resolved
    named = [e for e in family if any(e.mentioned_in(m.content) for m in history)]
    others = {t.modifier.lower() for m in history for t in text_entities(m.content) if t.key == entity.key}
    if _want(ctx, "hn_generalized_in_dialog") and named == [entity] and others <= {entity.modifier.lower()}:
        _resolved_in_dialog(em, seed, history, loose, question, gen, senses=senses)
    # ambiguous in the dialog: nothing before the loose question names any entity of the family
    hidden = set().union(*(e.modifier_terms() for e in family))
    unpinned = _cut_dialog(history, hidden, family)
    lq = _Loose(entity, question, loose, siblings, senses, gen, hidden, unpinned, verdict, noun_anchor)
    if _want(ctx, "hn_turn_resolves") and verdict is not None and verdict.label == "answer":
        # looks open (the name alone), but the turn's own words pick the sense: before retrieval and with
        # documents about several senses alike, a reader answers
        docs = _mixed_docs(ctx, entity, siblings, seed)[0]
        em.both("hn_turn_resolves", unpinned, loose, docs, resolution=question, template=f"{gen}.cue", senses=senses)
    if lq.ambiguous:
        _open_rows(em, seed, hosts, lq)
    _class_rows(em, seed, hosts, entity, question, family, unpinned)
    _document_rows(em, seed, hosts, lq)


@dataclass(frozen=True)
class _Loose:
    """A loose question and what its rows share: the entity it was made from, the precise question, the
    same-name siblings, the senses its meaning check reads, the template tag, the words that would pin it,
    the dialog cut before them, the turn's own sense verdict (None: no competing senses), and the shared noun as
    the turn writes it."""

    entity: Entity
    question: str
    loose: str
    siblings: list[Entity]
    senses: list[str]
    gen: str
    hidden: set[str]
    unpinned: list[Message]
    verdict: SenseVerdict | None
    anchor: Anchor

    @property
    def ambiguous(self) -> bool:
        return self.verdict is None or self.verdict.label == "ask"


def _open_rows(em: _Emitter, seed: SeedTurn, hosts: list[SeedTurn], lq: _Loose) -> None:
    """A loose question that nothing pins: alone (`ad_generalized_unpinned`), and half the time after another
    conversation's dialog (`ad_stitched`). Not after its own dialog cut before the name: that dialog can name
    another thing of the kind ("does the company put on shows for families?" after a chat about Kelbridge Opera's
    season was answered by a blind reader, 2026-12-06), as `ad_cut_before_referent` showed for pronouns."""
    ctx, entity, siblings = em.ctx, lq.entity, lq.siblings
    family = [entity, *siblings]
    if siblings and named_in_full(lq.loose, display_head(entity, ctx.docs_by_title)):
        # with nothing showing its variants, a reader answers "the Continental Rail Pass" rather than asks which one
        ctx.skipped["ad_generalized_unpinned:full_product_name"] += 1
        return
    if _want(ctx, "ad_generalized_unpinned"):
        if siblings and entity.kind == "paren":  # a closed set of senses: name them ("the adult or the child ...?")
            shown = family[: ctx.cfg.max_interpretations]
            ctx.rng.shuffle(shown)
            labels = [e.label for e in shown]  # the titles' readings; the question names them in plain words
            clar, tmpl = _ask_which(ctx, shown, lq.anchor, retrieved=False)
        else:
            labels, (clar, tmpl) = [], clarify_dialog(lq.anchor, ctx.rng)
        em.both(
            "ad_generalized_unpinned",
            [],
            lq.loose,
            _retrieved_docs(seed, lq.loose, lq.hidden | terms(entity.head), ctx),
            clarification=clar,
            interpretations=labels,
            senses=lq.senses,
            template=f"{lq.gen}.{tmpl}",
        )
    if _want(ctx, "ad_stitched") and ctx.rng.random() < 0.5:
        stitch(
            em,
            seed,
            hosts,
            lq.loose,
            lq.anchor,
            avoid_terms=entity.modifier_terms(),
            hidden=lq.hidden,
            family=family,
            template=lq.gen,
            senses=lq.senses,
        )


def _document_rows(em: _Emitter, seed: SeedTurn, hosts: list[SeedTurn], lq: _Loose) -> None:
    """Post-retrieval: one entity's documents resolve the loose question (`hn_documents_resolve`); several make
    it ambiguous (`adoc_entity_collision`) unless the turn prefers one; the precise question with them is clear
    (`clear_specific_docs`). It follows the seed's own cut dialog, or another conversation's (a topic switch),
    so that the row's position in a dialog says nothing about its label."""
    ctx, entity, siblings = em.ctx, lq.entity, lq.siblings
    own_docs = [d for d in seed.documents if d.title == entity.title] if entity.title else []
    mine = (own_docs or ctx.docs_by_title.get(entity.title, []))[:2] if entity.title else []
    if not siblings or not mine:
        return
    placed = lq.unpinned
    if ctx.rng.random() < ctx.cfg.switch_prob:
        host = _pick_host(seed, lq.hidden, Anchor("noun", entity.head), hosts, ctx, avoid=[entity, *siblings])
        placed = host.messages[:-1] if host is not None else lq.unpinned
    if _want(ctx, "hn_documents_resolve"):
        em.emit(
            "hn_documents_resolve",
            "post_retrieval",
            placed,
            lq.loose,
            documents=_docs(mine, ctx),
            resolution=lq.question,
            senses=lq.senses,
            template=lq.gen,
        )
    for i in range(max(_want(ctx, "adoc_entity_collision"), _want(ctx, "clear_specific_docs"))):
        docs, covered = _mixed_docs(ctx, entity, siblings, seed)
        if len(covered) < 2:
            ctx.skipped["adoc:sibling_without_documents"] += 1
            continue
        # the senses shown: the turn may prefer one of them even where the whole family left it open
        shown = judge_senses(ctx, lq.loose, covered) if lq.ambiguous and lq.verdict is not None else lq.verdict
        if i < _want(ctx, "adoc_entity_collision") and shown is not None and shown.label == "ask":
            ctx.rng.shuffle(covered)
            labels = [e.label for e in covered]
            clar, tmpl = _ask_which(ctx, covered, lq.anchor, retrieved=True)
            em.emit(
                "adoc_entity_collision",
                "post_retrieval",
                placed,
                lq.loose,
                documents=docs,
                clarification=clar,
                interpretations=labels,
                senses=lq.senses,
                template=f"{lq.gen}.{tmpl}",
            )
        if i < _want(ctx, "clear_specific_docs"):
            em.emit(
                "clear_specific_docs",
                "post_retrieval",
                placed,
                lq.question,
                documents=docs,
                senses=lq.senses,
                template=f"specific.{entity.kind}",
            )


def _ask_which(ctx: _Ctx, shown: Sequence[Entity], anchor: Anchor, retrieved: bool) -> tuple[str, str]:
    """The clarification for a loose question about the entities `shown`: the senses of one name are named in
    plain words ("the planet or the element?"); names that only share a class noun ("the Hudson River", "the
    Amazon River") are asked for by that noun. Four retrieved rivers listed after a chat about bin collection read
    as random picks, and "American football or Women's association football?" as titles pasted (bad, 2026-12-06)."""
    if shown[0].kind == "paren":
        return clarify_documents([plain_label(e, ctx.docs_by_title) for e in shown], ctx.rng, retrieved=retrieved)
    return clarify_dialog(anchor, ctx.rng)


def _mixed_docs(
    ctx: _Ctx, entity: Entity, siblings: Sequence[Entity], seed: SeedTurn
) -> tuple[list[Document], list[Entity]]:
    """Passages about `entity` and 1..max_interpretations-1 drawn siblings (shuffled), and the entities covered."""
    k = ctx.rng.randint(2, min(ctx.cfg.max_interpretations, len(siblings) + 1))
    chosen = [entity, *ctx.rng.sample(list(siblings), k - 1)]
    per = max(1, ctx.cfg.max_documents // k)
    own = [d for d in seed.documents if d.title == entity.title] or ctx.docs_by_title.get(entity.title, [])
    docs: list[Document] = []
    covered: list[Entity] = []
    for e in chosen:
        eds = (own if e is entity else ctx.docs_by_title.get(e.title, []))[:per]
        if eds:
            docs.extend(eds)
            covered.append(e)
    ctx.rng.shuffle(docs)
    return docs, covered


def judge_senses(ctx: _Ctx, loose: str, family: Sequence[Entity]) -> SenseVerdict:
    """The sense check on a loose question, over the titles of `family` (counted in the stats by verdict)."""
    verdict = ctx.judge.judge(loose, [e.title for e in family], terms(family[0].head))
    ctx.skipped[f"sense_check:{verdict.label}"] += 1
    return verdict


def _class_rows(
    em: _Emitter,
    seed: SeedTurn,
    hosts: list[SeedTurn],
    entity: Entity,
    question: str,
    family: Sequence[Entity],
    unpinned: Sequence[Message],
) -> None:
    """The name replaced by its class ("how far is the planet from the sun?"): a member of a class left unnamed.
    Open where nothing names it (before the dialog reached it, or after another conversation); a hard negative
    right after a dialog that named it."""
    ctx = em.ctx
    cls = class_noun(entity)
    general = to_class(question, entity) if cls else None
    if general is None or cls is None:
        return
    history = seed.messages[:-1]
    anchor = Anchor("noun", cls.split()[-1])
    tmpl = "cls"
    # a rare word of the entity's own passages picks the member ("is the element still used in thermometers?")
    own = terms(" ".join(d.text for d in ctx.docs_by_title.get(entity.title, [])))
    assert ctx.checker is not None
    cued = sorted((terms(general) - terms(cls) - QUESTION_WORDS) & own & ctx.checker.rare)
    if _want(ctx, "hn_generalized_in_dialog") and history and any(entity.mentioned_in(m.content) for m in history[-2:]):
        _resolved_in_dialog(em, seed, history, general, question, tmpl)
    if cued:
        ctx.rejects.add("class_member_cued", seed.id, f"the turn's words pick the member: {cued}", general)
        return
    if _want(ctx, "ad_generalized_unpinned"):
        clar, ctmpl = clarify_dialog(anchor, ctx.rng)
        em.both(
            "ad_generalized_unpinned",
            unpinned,
            general,
            _retrieved_docs(seed, general, terms(cls) | set().union(*(terms(e.head) for e in family)), ctx),
            clarification=clar,
            template=f"{tmpl}.{ctmpl}",
        )
    if _want(ctx, "ad_stitched"):
        hidden = set().union(*(e.modifier_terms() | terms(e.head) for e in family))
        stitch(em, seed, hosts, general, anchor, avoid_terms=hidden, hidden=hidden, family=family, template=tmpl)
