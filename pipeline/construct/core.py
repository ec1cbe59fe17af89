"""The construction's shared machinery: the per-run context, surface variation, the emitter that validates
and counts every row, and the label-contradiction safety net."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence, Set
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from clariedge.construct.checks import RowChecker, verify
from clariedge.construct.config import GENERATOR, METHODS, WRITTEN, ConstructConfig
from clariedge.construct.entities import Entity
from clariedge.construct.reading import drop_openers
from clariedge.construct.senses import SenseJudge
from clariedge.construct.text import Anchor, mentions_any, passage_terms, referent_terms, terms
from clariedge.construct.wording import LEAD_INS, clarify_dialog, pick
from clariedge.io import Rejects, describe_validation_error
from clariedge.schema import Document, Example, Message, Provenance, SeedTurn, Setting


@dataclass
class _Ctx:
    seeds: list[SeedTurn]
    cfg: ConstructConfig
    rng: random.Random
    by_conv: dict[str, list[SeedTurn]]
    groups: dict[str, dict[str, Entity]]  # entity key -> modifier(lower) -> entity (from titles)
    docs_by_title: dict[str, list[Document]]
    doc_hosts: list[SeedTurn] = field(default_factory=list)
    passages: list[Passage] = field(default_factory=list)  # the corpus `retrieve` searches
    rejects: Rejects = field(default_factory=Rejects)
    counts: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)
    checker: RowChecker | None = None  # the meaning checks over this corpus (set by `build.construct`)

    @property
    def judge(self) -> SenseJudge:
        assert self.checker is not None
        return self.checker.judge


TOPIC_SWITCHES = frozenset({"Different question: ", "Unrelated, but ", "Changing the subject, ", "Something else: "})
# rows whose label rests on the turn going on with the dialog's topic (it resolves the turn, or names two candidates):
# an explicit topic switch ("Unrelated, but") would cut that link
_CONTINUES_DIALOG = frozenset(
    {"hn_dialog_resolves", "hn_generalized_in_dialog", "ad_two_candidates", "clear_one_of_two", "ad_as_written"}
)


def _surface(text: str, ctx: _Ctx, switch_ok: bool = True, after_dialog: bool = True) -> tuple[str, list[str]]:
    """Surface form of a turn, drawn alike for every category, whatever the source's own form: a lead-in (only
    after a dialog), the first letter's case, the whole turn lower-cased, the final '?' kept or not.

    Human rewrites are capitalised complete questions while typed follow-ups are lower-case fragments; drawing
    case and end punctuation anew for every row keeps them from telling the label. Topic-switch lead-ins
    ("Unrelated, but") go on every category except rows whose label says the dialog resolves the turn."""
    rng, cfg, tags = ctx.rng, ctx.cfg, []
    text = text.strip()
    if rng.random() < cfg.lead_in_prob and after_dialog:
        allowed = [j for j, lead in enumerate(LEAD_INS) if switch_ok or lead not in TOPIC_SWITCHES]
        i = allowed[pick(rng, len(allowed))]
        first = text[:1]
        rest = text if (text[:2].isupper() or text.startswith("I ")) else first.lower() + text[1:]
        if drop_openers(text) == text:  # one opener is enough: not "ok so ok and is the hall ...?"
            text, _ = LEAD_INS[i] + rest, tags.append(f"lead{i}")
    keep = text[:2].isupper() or text.startswith("I ")  # an acronym or "I" keeps its capital
    if rng.random() < cfg.lowercase_prob:
        text, _ = (text if keep else text[:1].lower() + text[1:]), tags.append("lc")
    else:
        text = text[:1].upper() + text[1:]
    if rng.random() < cfg.all_lower_prob:
        text, _ = text.lower(), tags.append("lower")
    if rng.random() < cfg.drop_qmark_prob:
        text, _ = text.rstrip("?"), tags.append("noq")
    elif not text.endswith(("?", ".", "!")):
        text += "?"
    return text, tags


def _docs(docs: Sequence[Document], ctx: _Ctx) -> list[Document]:
    return list(docs[: ctx.cfg.max_documents])


def _cut_dialog(messages: Sequence[Message], avoid: set[str], extra: Sequence[Entity] = ()) -> list[Message]:
    """The dialog before the first message mentioning any `avoid` term or entity, ending on an assistant turn."""
    cut = len(messages)
    for i, m in enumerate(messages):
        if (avoid and mentions_any(m.content, avoid)) or any(e.mentioned_in(m.content) for e in extra):
            cut = i
            break
    while cut > 0 and messages[cut - 1].role == "user":
        cut -= 1
    return list(messages[:cut])


def contradiction(ex: Example, seed: SeedTurn) -> str | None:
    """Why a constructed row's context contradicts its label, or None (a safety net on the heuristics).

    ambiguous_dialog: what the turn leaves out (the referent the rewrite adds, or the modifier the
    precise question had) must occur in neither the dialog nor the documents; hard negatives (but those
    resolved by documents or by the turn itself) must find it in the dialog."""
    prior = set().union(*(terms(m.content) for m in ex.messages[:-1])) if len(ex.messages) > 1 else set()
    method = ex.provenance.method
    if method == "ad_two_candidates":
        return None  # the dialog names what is missing, and another thing of its kind: `checks.verify` reads it
    if method in WRITTEN:
        return None  # a person's label: the dialog may name every candidate, the turn none
    if ex.category == "ambiguous_dialog":
        hidden = referent_terms(seed) if method == "ad_cut_before_referent" else set()
        hidden = hidden or terms(seed.rewrite or seed.last_turn) - terms(ex.last_turn)
        docs = passage_terms(ex.documents)
        if not hidden:
            return "nothing is missing from the turn"
        if hidden & (prior | docs):
            return f"the missing referent {sorted(hidden & (prior | docs))} is in the context"
    elif (
        ex.category == "hard_negative"
        and method not in ("hn_documents_resolve", "hn_turn_resolves")
        and not (terms(ex.resolution or "") - terms(ex.last_turn)) & prior
    ):
        return "the dialog does not supply what the resolution adds"
    return None


class _Emitter:
    """Builds, validates and counts rows for one seed."""

    def __init__(self, ctx: _Ctx, seed: SeedTurn, out: list[Example]):
        self.ctx, self.seed, self.out = ctx, seed, out

    def emit(
        self,
        method: str,
        setting: Setting,
        history: Sequence[Message],
        turn: str,
        *,
        documents: Sequence[Document] = (),
        clarification: str | None = None,
        interpretations: Sequence[str] = (),
        resolution: str | None = None,
        template: str = "",
        surface: bool = True,
        senses: Sequence[str] = (),
        reference: str | None = None,
    ) -> Example | None:
        """Build, validate and check one row; `senses`: titles of the same-name entities the turn is about."""
        if setting not in self.ctx.cfg.settings:
            return None
        tags: list[str] = []
        if not history:  # a conversation's first turn: no "ok and", "going back to energy -" (a blind audit's cue)
            turn = drop_openers(turn)
        if surface:
            turn, tags = _surface(turn, self.ctx, switch_ok=method not in _CONTINUES_DIALOG, after_dialog=bool(history))
        tmpl = ".".join(t for t in (template, *tags) if t) or "as_is"
        category = METHODS[method]
        try:
            ex = Example(
                conversation_id=self.seed.conversation_id,
                domain=self.seed.domain,
                setting=setting,
                category=category,  # type: ignore[arg-type]
                messages=[*history, Message(role="user", content=turn)],
                documents=list(documents) if setting == "post_retrieval" else [],
                needs_clarification=category in ("ambiguous_dialog", "ambiguous_documents"),
                clarification=clarification,
                interpretations=list(interpretations),
                resolution=resolution,
                provenance=Provenance(generator=GENERATOR, method=method, seed_id=self.seed.id, template=tmpl),
            )
        except ValidationError as err:
            self.ctx.rejects.add("invalid_row", self.seed.id, f"{method}: {describe_validation_error(err)}")
            return None
        problem = contradiction(ex, self.seed)
        if problem:
            self.ctx.rejects.add("contradicts_label", self.seed.id, f"{method}: {problem}", ex.last_turn)
            return None
        # the meaning check: would a careful reader give this row the label its method claims?
        claim = "ask" if ex.needs_clarification else "answer"
        assert self.ctx.checker is not None
        msgs = [(m.role, m.content) for m in ex.messages]
        verdict = None if method in WRITTEN else verify(self.ctx.checker, claim, msgs, ex.documents, senses, reference)
        if verdict is not None and verdict.label != claim:
            reason = "reader_disagrees" if verdict.label in ("ask", "answer") else "reader_unsure"
            self.ctx.rejects.add(reason, self.seed.id, f"{method}: {verdict.reason} {list(verdict.cues)}", ex.last_turn)
            return None
        self.out.append(ex)
        self.ctx.counts[method] += 1
        return ex

    def both(self, method: str, history: Sequence[Message], turn: str, documents: Sequence[Document], **kw: Any) -> int:
        """One row per setting (pre without documents; post only when there are documents)."""
        n = 0
        # the same drawn surface form in both settings keeps the pair comparable
        state = self.ctx.rng.getstate()
        for setting in ("pre_retrieval", "post_retrieval"):
            if setting == "post_retrieval" and not documents:
                continue
            self.ctx.rng.setstate(state)
            docs = documents if setting == "post_retrieval" else ()
            if self.emit(method, setting, history, turn, documents=docs, **kw) is not None:  # type: ignore[arg-type]
                n += 1
        return n


def is_donor(seed: SeedTurn) -> bool:
    """A later turn known without its conversation's assistant answers (e.g. an MTRAG retrieval task: the user
    turns, and a human standalone rewrite). Its own dialog is never shown (a transcript of user turns alone looks
    like no real chat); its turn is placed first or after another conversation's dialog."""
    return seed.turn > 1 and not any(m.role == "assistant" for m in seed.messages[:-1])


@dataclass(frozen=True)
class Passage:
    """A corpus passage as the retriever indexes it: its conversation, the passage, its text as the checks read it
    (title + text) and that text's content terms."""

    conversation_id: str
    document: Document
    text: str
    terms: frozenset[str]


def corpus_passages(seeds: Sequence[SeedTurn]) -> list[Passage]:
    """Every passage the seeds retrieved, once (by id, in id order): the corpus `retrieve` searches."""
    seen: dict[str, Passage] = {}
    for s in seeds:
        for d in s.documents:
            if d.doc_id not in seen:
                text = f"{d.title} {d.text}"
                seen[d.doc_id] = Passage(s.conversation_id, d, text, frozenset(terms(text)))
    return [seen[k] for k in sorted(seen)]


def retrieve(
    turn: str, ctx: _Ctx, want: int, *, skip_conversation: str, hidden: Set[str] = frozenset(), capped: bool = False
) -> list[Document]:
    """What a hybrid retriever returns for `turn`: the corpus passages with the best sum of closeness in meaning
    (MiniLM cosine) and keyword match (the share of the turn's content words they contain), from conversations
    other than `skip_conversation`, none mentioning `hidden`, and with `capped`, none so close to the turn that it
    may settle it (`passage_max_similarity`).

    Real retrievers fetch passages on the turn's words and topic whether or not it says which thing it means: in
    three human-labelled sets of real RAG turns, the best passage's MiniLM similarity to the turn and the share of
    the turn's words the passages contain tell turns that need a question from the others at ROC AUC 0.39-0.61.
    Passages drawn from another domain taught "unrelated passages -> ask" (ROC AUC 0.93 on the train split,
    2026-12-06); ranked by meaning alone they shared few of an open turn's words (0.86, 2026-12-06, late)."""
    checker = ctx.checker
    assert checker is not None
    query = terms(turn) - hidden
    ranked = []
    for p in ctx.passages:
        if p.conversation_id == skip_conversation or hidden & p.terms:
            continue
        sim = checker.similarity(turn, p.text)
        if not capped or sim < checker.passage_max_similarity:
            ranked.append((-sim - len(query & p.terms) / max(1, len(query)), p.document.doc_id, p.document))
    return [d for *_, d in sorted(ranked)[:want]]


def _retrieved_docs(seed: SeedTurn, turn: str, hidden: set[str], ctx: _Ctx) -> list[Document]:
    """The passages a retriever returns for an open turn, as many as the seed's own turn retrieved: from other
    conversations, none mentioning `hidden` (the open reference's noun or what it left out) nor so close that it
    may settle the turn (a billing passage settles "when do the invoices come out?").

    (Passages that name the open noun for several things of its kind, "the office" with passages about two
    offices, were tried and removed: Abg-CoQA balanced accuracy 0.66 -> 0.56, docs/training.md, 2026-12-07.)"""
    want = min(len(seed.documents), ctx.cfg.max_documents) or ctx.cfg.max_documents
    return retrieve(turn, ctx, want, skip_conversation=seed.conversation_id, hidden=hidden, capped=True)


def _shown_docs(ctx: _Ctx, seed: SeedTurn, turn: str, documents: Sequence[Document]) -> list[Document]:
    """The passages shown with a turn whose label does not rest on them (a clear turn, one its dialog resolves):
    its own, or with chance `missed_passages_prob` what a retriever found for it about something else. Retrieval
    often misses, and the turn is no less clear (the assistant says what it found). Such passages are found as an
    open turn's are: on the turn's words that most topics have ("price", "hours"), none naming what it is about,
    none close enough to settle it. With its own passages only, how close the best passage was to the turn told
    the label (ROC AUC 0.76-0.86 on the published rows with passages, 2026-12-06)."""
    if not documents or ctx.rng.random() >= ctx.cfg.missed_passages_prob:
        return _docs(documents, ctx)
    assert ctx.checker is not None
    hidden = terms(turn) - ctx.checker.common
    want = min(len(documents), ctx.cfg.max_documents)
    return retrieve(turn, ctx, want, skip_conversation=seed.conversation_id, hidden=hidden, capped=True)


def _want(ctx: _Ctx, method: str) -> int:
    return ctx.cfg.per_seed.get(method, 0)


def _with_anchor(avoid_terms: set[str], anchor: Anchor | None) -> set[str]:
    """`avoid_terms` and the anchor's noun, if it is one: words that must not name the open reference."""
    return set(avoid_terms) | (terms(anchor.text) if anchor is not None and anchor.kind == "noun" else set())


def _pick_host(
    seed: SeedTurn,
    avoid_terms: set[str],
    anchor: Anchor | None,
    hosts: list[SeedTurn],
    ctx: _Ctx,
    avoid: Sequence[Entity] = (),
) -> SeedTurn | None:
    """Another conversation's dialog (>= 2 messages) that mentions neither the referent nor the anchor noun."""
    avoid_terms = _with_anchor(avoid_terms, anchor)
    other_domain = ctx.cfg.stitch_other_domain
    with_docs = ctx.doc_hosts
    for k in range(ctx.cfg.stitch_tries):
        # half the tries go to dialogs with passages, so that stitched rows also exist post-retrieval
        pool = with_docs if with_docs and k % 2 == 0 else hosts
        h = pool[ctx.rng.randrange(len(pool))]
        if h.conversation_id == seed.conversation_id or len(h.messages) < 2:
            continue
        if other_domain and h.domain == seed.domain:
            continue
        prior = h.messages[:-1]
        if any(mentions_any(m.content, avoid_terms) or any(e.mentioned_in(m.content) for e in avoid) for m in prior):
            continue
        return h
    return None


def stitch(
    em: _Emitter,
    seed: SeedTurn,
    hosts: list[SeedTurn],
    turn: str,
    anchor: Anchor,
    *,
    avoid_terms: set[str],
    hidden: set[str],
    family: Sequence[Entity] = (),
    template: str = "",
    senses: Sequence[str] = (),
    reference: str | None = None,
) -> None:
    """`ad_stitched`: an open reference after other conversations' dialogs (`per_seed.ad_stitched` of them) that
    mention none of `avoid_terms` nor `family` (a topic switch that drops its subject), with the passages a
    retriever returns for it (`_retrieved_docs`)."""
    ctx = em.ctx
    for _ in range(_want(ctx, "ad_stitched")):
        host = _pick_host(seed, avoid_terms, anchor, hosts, ctx, avoid=family)
        if host is None:
            ctx.skipped["ad_stitched:no_host"] += 1
            return
        clar, ctmpl = clarify_dialog(anchor, ctx.rng)
        em.both(
            "ad_stitched",
            host.messages[:-1],
            turn,
            _retrieved_docs(seed, turn, hidden | _with_anchor(avoid_terms, anchor), ctx),
            clarification=clar,
            template=".".join(t for t in (template, ctmpl) if t),
            senses=senses,
            reference=reference,
        )
