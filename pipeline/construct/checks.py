"""Meaning checks: would a careful reader give a constructed row the label its method claims?

Each construction rule is a guess about meaning ("removing the modifier leaves the question open");
these checks read the row the way an annotator would and say when the guess fails:

- `SenseJudge.judge`, `broken_name`, `still_named` (senses.py): does a loose question about a shared name
  ("Mercury") pick one of its senses; did the deletion leave part of a name behind ("the St. Cardinals")?
- `names_own_topic`, `open_definite`, `needs_its_dialog` (reading.py): does the turn name its own topic,
  leave a definite reference open ("this plan"), or point outside itself when read alone?
- `verify` (here): the label a careful reader gives a row, from those readings.

Thresholds live in params (`synthesize.construct.checks`) and are calibrated on the hand-labelled
gold set in `tests/data/gold_labels.jsonl` (tests/test_gold_labels.py reports the precision).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from clariedge.construct.reading import (
    OPEN_HEADS,
    _mostly_capitalised,
    asks_something,
    names_own_topic,
    needs_its_dialog,
    open_definite,
    topic_terms,
)
from clariedge.construct.senses import (
    EmbedFn,
    SenseJudge,
    SenseVerdict,
    check_loose,
    default_reading,
    named_in_full,
    year_twins,
)
from clariedge.construct.text import stem, terms
from clariedge.construct.wording import display_head
from clariedge.schema import Document


@dataclass(frozen=True)
class RowChecker:
    """What `verify` needs besides the row: the sense judge, the corpus's names, and thresholds."""

    judge: SenseJudge
    names: frozenset[str]  # distinctive names of the corpus (`topic_terms` minus the generic ones)
    generic: frozenset[str]
    rare: frozenset[str]  # content terms only one conversation of the corpus uses
    common: frozenset[str]  # content terms more than `topic_max_share` of the conversations use ("plan", "option")
    heads: frozenset[str]  # nouns of a kind ("plan", "city", "permit") whose bare definite use is open (OPEN_HEADS)
    dialog_max_similarity: float  # an open turn this close to the shown dialog may be resolved by it
    rewrite_max_similarity: float  # a turn this close to its human rewrite stands alone ("the cotton gin")
    passage_max_similarity: float  # a shown passage this close to an open turn may resolve it
    sense_dialog_max_similarity: float  # a dialog this close to one sense's passages settles a shared name

    def similarity(self, a: str, b: str) -> float:
        return float(self.judge._vec(a) @ self.judge._vec(b))


def _mentioned(senses: Sequence[str], text: str, loose: bool = False) -> list[str]:
    """The senses `text` names precisely ("the St. Louis Cardinals"); with `loose`, also by a word of their
    disambiguator alone ("the roth one", "St. Louis")."""
    from clariedge.construct.entities import entity_of_title

    have = terms(text)
    out = []
    for s in senses:
        e = entity_of_title(s)
        if e is not None and (e.mentioned_in(text) or (loose and e.modifier_terms() & have)):
            out.append(s)
    return out


_OWN_THING = re.compile(r"\b(?:the|my|our)\s+[a-z][a-z-]+", re.I)


def _introduced(turn: str) -> str | None:
    """The thing a statement before the question describes ("The lease is for 12 months. Can they put the rent
    up?" -> "The lease"): the user speaks of their own situation, and a general answer fits; asking "which lease?"
    or "which rent?" misses the point. Any definite noun there counts, not only the one the check finds open: the
    open one ("the rent") depends on corpus statistics that move when conversations are added (2026-12-06)."""
    sentences = re.split(r"(?<=[.!])\s+", turn.strip())
    if len(sentences) < 2:  # the first ends on "." or "!": a statement
        return None
    m = _OWN_THING.search(sentences[0])
    return m.group(0) if m else None


def verify(
    checker: RowChecker,
    claim: Literal["ask", "answer"],
    messages: Sequence[tuple[str, str]],
    documents: Sequence[Document],
    senses: Sequence[str] = (),
    reference: str | None = None,
) -> SenseVerdict:
    """A careful reader's label for a row whose method claims `claim`: `ask`, `answer`, or `unclear` (the check
    cannot confirm either: the row is not made). `messages` are (role, content) pairs ending in the user turn;
    `senses` the titles of the same-name entities the turn is about (empty when there are none); `reference`
    a noun the construction believes the turn leaves open ("the adjudicator"): read like the nouns of a kind
    in `heads`, i.e. open only when a determiner introduces it and neither the dialog nor the passages name it."""
    turn = messages[-1][1]
    history = [c for _, c in messages[:-1]]
    dialog, passages = " ".join(history), " ".join(d.title + " " + d.text for d in documents)
    senses = [s for s in senses if s in checker.judge.docs_by_title]
    if claim == "ask" and not asks_something(turn):
        return SenseVerdict("unclear", None, "a statement, not a question: a reader replies, not asks")
    if claim == "answer":
        opening = open_definite(turn, dialog, documents, checker.heads, checker.names)
        # "our queries are slowing down the app. would a replica help?": the user describes their own app
        if opening and not _introduced(turn):
            return SenseVerdict("unclear", None, f"an open reference: {opening!r}")
        alone = None if history else needs_its_dialog(turn, passages)
        if alone:
            return SenseVerdict("unclear", None, f"shown alone: {alone}")
    if len(senses) >= 2:
        return _verify_senses(checker, claim, turn, history, documents, senses)
    if claim == "answer":
        return SenseVerdict("answer", None, "no open reference")
    return _verify_open(checker, turn, history, documents, reference)


def _verify_senses(
    checker: RowChecker,
    claim: Literal["ask", "answer"],
    turn: str,
    history: Sequence[str],
    documents: Sequence[Document],
    senses: Sequence[str],
) -> SenseVerdict:
    """`verify` for a turn about a name several entities share: which sense the turn, the dialog or the shown
    passages settle, if any."""
    from clariedge.construct.entities import entity_of_title

    entity = entity_of_title(senses[0])
    head = entity.head if entity is not None else senses[0]
    named = _mentioned(senses, turn)
    if len(named) == 1:
        return SenseVerdict("answer", named[0], "the turn names one sense")
    # the senses the dialog names, precisely or by a word of their own ("the roth one"): two are two candidates
    in_dialog = set(_mentioned(senses, " ".join(history), loose=True)) if history else set()
    if len(in_dialog) == 1 and not named:
        return SenseVerdict("answer", next(iter(in_dialog)), "the dialog names one sense")
    if len(in_dialog) > 1:
        # "is it still used in thermometers?" after the planet and the element: the turn's words pick one of them
        if claim == "ask" and (lean := checker.judge.judge(turn, sorted(in_dialog), terms(head))).label == "answer":
            return SenseVerdict(
                "unclear", None, f"the dialog names several senses; the turn's words pick {lean.sense!r}"
            )
        return SenseVerdict("ask" if claim == "ask" else "unclear", None, "the dialog names several senses")
    twins = year_twins(senses)
    if claim == "ask" and twins:
        # "what was Titanic about?" with the 1953 and the 1997 film: three blind readers in three builds took the
        # 1997 film and answered. Which twin is best known is not in the data, so the row is not made
        return SenseVerdict("unclear", None, f"senses that differ only by a year: {twins}")
    default = default_reading(senses, turn)
    if claim == "ask" and default:
        return SenseVerdict("unclear", None, f"a reader takes {default!r} unless the turn says otherwise")
    shown = sorted({d.title for d in documents} & set(senses))
    if claim == "ask" and entity is not None and named_in_full(turn, display_head(entity, checker.judge.docs_by_title)):
        # with the variants' passages shown a reader answers with each variant's figure (two blind readings of
        # "how much does the Continental Rail Pass cost for a 26-year-old?", 2026-12-04/05): not an ask row
        if len(shown) >= 2:
            return SenseVerdict("unclear", None, f"{head!r} reads as a full name; the shown variants answer it")
        return SenseVerdict("answer", None, f"{head!r} reads as a full name, and no variant is shown")
    verdict = check_loose(checker.judge, turn, head, shown if len(shown) >= 2 else senses, retrieved=len(shown) >= 2)
    if verdict.label == "ask" and claim == "ask" and history:
        # the dialog's own topic may pick the sense without naming it ("teams in football" after MLS)
        lean = checker.judge.judge(" ".join(history[-2:]) + " " + turn, senses, terms(head))
        if lean.label == "answer":
            return SenseVerdict("unclear", None, f"the dialog leans to {lean.sense!r}")
        # or its subject, with no cue word at all: "how many teams are there in football?" after a chat about
        # the Premier League's relegation and points records was published as ask, offering American and women's
        # football (2026-12-06). The whole dialog against each sense's passages
        dialog = " ".join(history)
        near, sense = max((checker.similarity(dialog, checker.judge.sense_text(s)), s) for s in senses)
        if near >= checker.sense_dialog_max_similarity:
            return SenseVerdict("unclear", None, f"the dialog is about {sense!r} (similarity {near:.2f})", margin=near)
    return verdict


def _verify_open(
    checker: RowChecker, turn: str, history: Sequence[str], documents: Sequence[Document], reference: str | None
) -> SenseVerdict:
    """`verify` for an "ask" claim with no shared name: an open reference that neither the turn's other words, the
    dialog nor the passages resolve."""
    from clariedge.construct.text import find_anchor

    dialog = " ".join(history)
    anchor = find_anchor(turn, None)
    heads = checker.heads | {stem(reference)} if reference else checker.heads
    definite = open_definite(turn, dialog, documents, heads, checker.names)
    if anchor is None and definite is None:
        return SenseVerdict("unclear", None, "nothing in the turn points outside it")
    if definite is None and history:
        # only a pronoun points outside, after a dialog: a reader attaches it to that dialog's topic or reads
        # the turn's other words ("does paying it off before the statement help my score too"), not asks
        return SenseVerdict("unclear", None, f"a pronoun after a dialog: {anchor.text!r}")
    if described := _introduced(turn):
        return SenseVerdict("unclear", None, f"the user describes {described!r} first: it is theirs")
    # the turn's other words (not the open reference's own) must not name its topic
    rest = re.sub(rf"\b{re.escape(definite)}\b", " ", turn, flags=re.I) if definite else turn
    named = names_own_topic(rest, checker.names, checker.generic, checker.rare)
    if named:
        return SenseVerdict("unclear", None, named)
    if history and definite and stem(definite.split()[-1]) in checker.common:
        # a thing most topics have ("the application", "the faster option"): a reader finds it in the dialog's
        # topic by bridging, no word shared ("what do i need to send with the application?" after a mortgage chat,
        # "and the faster option, what's that cost?" after express and stopping trains: blind readings, 2026-12-06)
        return SenseVerdict("unclear", None, f"{definite!r} is a thing most topics have: the dialog's may own it")
    if history:
        near = checker.similarity(turn, " ".join(history[-2:]))
        if near >= checker.dialog_max_similarity:
            return SenseVerdict("unclear", None, f"the dialog may resolve it (similarity {near:.2f})", margin=near)
    close = max((checker.similarity(turn, f"{d.title} {d.text}") for d in documents), default=-1.0)
    if close >= checker.passage_max_similarity:
        return SenseVerdict("unclear", None, f"a passage may resolve it (similarity {close:.2f})", margin=close)
    return SenseVerdict("ask", None, "an open reference nothing resolves")


def build_checker(
    conversations: Mapping[str, Sequence[str]],
    docs_by_title: Mapping[str, Sequence[Document]],
    *,
    ask_max_margin: float,
    answer_min_margin: float,
    cue_min_margin: float,
    topic_max_share: float,
    rare_max_share: float,
    dialog_max_similarity: float,
    rewrite_max_similarity: float,
    passage_max_similarity: float,
    sense_dialog_max_similarity: float,
    embed_fn: EmbedFn | None = None,
) -> RowChecker:
    """The checker for a corpus: `conversations` maps each conversation to its texts (turns and passages)."""
    from collections import Counter

    n = max(1, len(conversations))
    names = Counter(t for texts in conversations.values() for t in set().union(*map(topic_terms, texts)))
    proper = _mostly_capitalised(t for texts in conversations.values() for t in texts)
    names = Counter({t: k for t, k in names.items() if t in proper})
    words_ = Counter(t for texts in conversations.values() for t in set().union(*map(terms, texts)))
    many = max(2, int(topic_max_share * n))  # more conversations than this: no topic's own
    generic = frozenset(t for t, k in names.items() if k > many)
    rare = frozenset(t for t, k in words_.items() if k <= max(1, int(rare_max_share * n)))
    common = frozenset(t for t, k in words_.items() if k > many)
    judge = SenseJudge(
        docs_by_title,
        ask_max_margin=ask_max_margin,
        answer_min_margin=answer_min_margin,
        cue_min_margin=cue_min_margin,
        embed_fn=embed_fn,
    )
    # the classes the corpus's titles name ("Mercury (planet)": "the planet" is a definite reference to one of them)
    from clariedge.construct.entities import class_noun, entity_of_title

    classes = {stem(c.split()[-1]) for e in map(entity_of_title, docs_by_title) if e and (c := class_noun(e))}
    return RowChecker(
        judge,
        frozenset(names) - generic,
        generic,
        rare,
        common,
        OPEN_HEADS | classes,
        dialog_max_similarity,
        rewrite_max_similarity,
        passage_max_similarity,
        sense_dialog_max_similarity,
    )


def verify_gold_row(checker: RowChecker, row: Mapping[str, object], methods: Mapping[str, str]) -> SenseVerdict:
    """`verify` on one hand-labelled row, claiming what its method claims (`methods`: method -> category)."""
    claim = "ask" if methods[str(row["method"])].startswith("ambiguous") else "answer"
    msgs = [(str(m["role"]), str(m["content"])) for m in row["messages"]]  # type: ignore[attr-defined]
    docs = [Document(**d) for d in row["documents"]]  # type: ignore[attr-defined]
    senses = [str(t) for t in row.get("senses") or []]  # type: ignore[attr-defined]
    reference = row.get("reference")
    return verify(checker, claim, msgs, docs, senses, str(reference) if reference else None)


def gold_precision(checker: RowChecker, gold: Sequence[Mapping[str, object]], methods: Mapping[str, str]) -> dict:
    """Score `verify` on hand-labelled rows (tests/data/gold_labels.jsonl): per method, the precision of the
    rows it labels "ask" and of those it labels "answer" (a row the check leaves `unclear` is not made, so it
    counts in neither), against the reader's label. `methods` maps a method to its category."""
    from collections import Counter, defaultdict

    tally: dict[str, Counter[tuple[str, str]]] = defaultdict(Counter)
    for row in gold:
        verdict = verify_gold_row(checker, row, methods)
        said = verdict.label if verdict.label != "unclear" else "not_made"
        tally[str(row["method"])][(said, str(row["label"]))] += 1
    out: dict[str, dict[str, object]] = {}
    for method, c in sorted(tally.items()):
        entry: dict[str, object] = {
            "rows": sum(c.values()),
            "not_made": sum(v for (s, _), v in c.items() if s == "not_made"),
        }
        for label in ("ask", "answer"):
            said = sum(v for (s, _), v in c.items() if s == label)
            entry[f"said_{label}"] = said
            entry[f"precision_{label}"] = round(c[(label, label)] / said, 4) if said else None
        out[method] = entry
    return out
