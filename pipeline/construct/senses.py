"""Same-name senses: does a loose question about a shared name ("Mercury") pick one of its senses?

- `SenseJudge.judge`: a loose question shown with (or asked about) several entities sharing a name
  ("Mercury (planet)", "Mercury (element)"). The turn's *other* words often settle which one it means
  ("is mercury still used in thermometers?"). Two signals, both over the senses' own passages:
  lexical cues (content terms of the turn that only one sense's passages or name use) and a MiniLM
  similarity margin between the senses. Verdict `answer` (the turn picks one sense: a hard negative),
  `ask` (nothing in the turn prefers a sense, and every word it uses fits several), or `unclear`
  (neither is certain: the row is not made).
- `broken_name`: the deletion left part of a name behind ("the St. Cardinals", "a 5/6 mortgage").
- `still_named`: the loose reference is named right after all ("that region (ca-central-1)").
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import numpy as np

from clariedge.construct.text import sentences, stem, terms
from clariedge.schema import Document

Verdict = Literal["ask", "answer", "unclear"]
EmbedFn = Callable[[Sequence[str]], np.ndarray]

# Words a question uses whatever it is about: never a cue, never a sign of an unsupported reading.
QUESTION_WORDS = frozenset(
    stem(w)
    for w in [
        "actually",
        "exactly",
        "currently",
        "nowadays",
        "today",
        "still",
        "ever",
        "anymore",
        "right",
        "now",
        "usually",
        "generally",
        "basically",
        "difference",
        "different",
        "work",
        "works",
        "working",
        "cost",
        "costs",
        "price",
        "pay",
        "paid",
        "take",
        "takes",
        "time",
        "times",
        "year",
        "years",
        "month",
        "months",
        "day",
        "days",
        "week",
        "weeks",
        "need",
        "needs",
        "happen",
        "happens",
        "mean",
        "means",
        "good",
        "better",
        "best",
        "new",
        "old",
        "first",
        "last",
        "main",
        "big",
        "small",
        "much",
        "many",
        "number",
        "type",
        "types",
        "kind",
        "option",
        "options",
        "start",
        "end",
        "get",
        "happen",
        "whole",
        "part",
        # the words of the lead-ins (wording.LEAD_INS) any turn may open with
        "question",
        "different",
        "unrelated",
        "changing",
        "subject",
        "something",
        "else",
        "quick",
        "another",
        "hmm",
        "got",
        "thanks",
        "okay",
        "right",
        "way",
    ]
)


# the judge's reason for a turn with words that none of the senses' passages use (it says nothing of which)
WORDS_NO_SENSE_USES = "words no sense's passages use"


@dataclass(frozen=True)
class SenseVerdict:
    label: Verdict
    sense: str | None  # the sense (title) the turn picks, for `answer`
    reason: str
    cues: tuple[str, ...] = ()
    margin: float = 0.0


def _minilm(texts: Sequence[str]) -> np.ndarray:
    from clariedge.embed import embed

    return embed(list(texts))


class SenseJudge:
    """Judges loose questions against the senses of a name, from the senses' passages (`docs_by_title`)."""

    def __init__(
        self,
        docs_by_title: Mapping[str, Sequence[Document]],
        *,
        ask_max_margin: float,
        answer_min_margin: float,
        cue_min_margin: float,
        embed_fn: EmbedFn | None = None,
    ) -> None:
        self.docs_by_title = docs_by_title
        self.ask_max_margin = ask_max_margin
        self.answer_min_margin = answer_min_margin
        self.cue_min_margin = cue_min_margin
        self._embed_fn = embed_fn or _minilm
        self._vec = lru_cache(maxsize=None)(self._embed_one)
        self._vocab = lru_cache(maxsize=None)(self._vocab_of)

    def _embed_one(self, text: str) -> np.ndarray:
        return self._embed_fn([text])[0]  # one text a call: the same vector whatever else is embedded

    def sense_text(self, title: str) -> str:
        return " ".join([title, *(d.text for d in self.docs_by_title.get(title, []))])

    def _vocab_of(self, title: str) -> frozenset[str]:
        return frozenset(terms(self.sense_text(title)))

    def judge(self, turn: str, senses: Sequence[str], name_terms: set[str], retrieved: bool = False) -> SenseVerdict:
        """`turn` asks about a name shared by `senses` (titles); `name_terms` are the shared name's terms;
        `retrieved`: the senses' passages are shown with the turn (then one answer for all needs no question)."""
        senses = [s for s in senses if s in self.docs_by_title]
        if len(senses) < 2:
            return SenseVerdict("unclear", None, "fewer than two senses with passages")
        content = terms(turn) - name_terms - QUESTION_WORDS
        # a sense's own disambiguating word in the turn ("named after the snake?") settles or contrasts it
        own = [s for s in senses if _disambiguator_terms(s) and _disambiguator_terms(s) <= content]
        if len(own) == 1:
            return SenseVerdict(
                "answer", own[0], "the turn uses one sense's own word", tuple(_disambiguator_terms(own[0]) & content)
            )
        if own:
            return SenseVerdict("unclear", None, "the turn uses several senses' words")
        vocab = {s: self._vocab(s) for s in senses}
        cues = {
            s: sorted(t for t in content if t in vocab[s] and sum(t in v for v in vocab.values()) == 1) for s in senses
        }
        cued = [s for s in senses if cues[s]]
        unsupported = sorted(t for t in content if not any(t in v for v in vocab.values()))
        q = self._vec(turn)
        sims = sorted(((float(self._vec(self.sense_text(s)) @ q), s) for s in senses), reverse=True)
        margin = round(sims[0][0] - sims[1][0], 4)
        top = sims[0][1]
        if not content:
            # nothing but the shared name and question words ("what is mercury?", "tell me about python"): the
            # senses' passages may sit nearer or farther from such a question, but it says nothing of its own
            return SenseVerdict("ask", None, "no word beyond the name", (), margin)
        if len(cued) > 1:
            all_cues = tuple(sorted(set().union(*map(set, cues.values()))))
            return SenseVerdict("unclear", None, "cues for several senses", all_cues, margin)
        if len(cued) == 1:
            s = cued[0]
            if len(cues[s]) < 2 and margin < self.answer_min_margin:
                # one word that happens to occur in one sense's passages ("review") is chance, not a reading
                return SenseVerdict("unclear", None, f"one cue word for {s}", tuple(cues[s]), margin)
            if top != s or margin < self.cue_min_margin:
                return SenseVerdict("unclear", None, f"cues for {s}, similarity does not agree", tuple(cues[s]), margin)
            return SenseVerdict("answer", s, "the turn's own words pick one sense", tuple(cues[s]), margin)
        if margin >= self.answer_min_margin:
            return SenseVerdict("answer", top, "the turn is far closer to one sense", tuple(unsupported), margin)
        if unsupported:
            return SenseVerdict("unclear", None, WORDS_NO_SENSE_USES, tuple(unsupported), margin)
        if margin > self.ask_max_margin:
            return SenseVerdict("unclear", None, "leans to one sense", (), margin)
        shared = self._same_answer(turn, senses) if retrieved else []
        if shared:
            return SenseVerdict("answer", None, "every sense gives the same answer", tuple(shared), margin)
        return SenseVerdict("ask", None, "every word fits several senses", (), margin)

    def _same_answer(self, turn: str, senses: Sequence[str]) -> list[str]:
        """Figures that the passage sentence nearest the turn states alike for every sense ("$0.0225 per hour"
        for both load balancers): the question has one answer whichever sense is meant."""
        q = self._vec(turn)
        found: list[set[str]] = []
        for s in senses:
            said = [x for d in self.docs_by_title.get(s, []) for x in sentences(d.text)]
            if not said:
                return []
            best = max(said, key=lambda x: float(self._vec(x) @ q))
            found.append(set(_FIGURE.findall(best)))
        return sorted(set.intersection(*found)) if found else []


def check_loose(
    judge: SenseJudge, loose: str, head: str, senses: Sequence[str], retrieved: bool = False
) -> SenseVerdict:
    """Every check on a loose question about the shared name `head` of `senses`: a garbled or still-named
    reference is `unclear` (the row is not made); else the sense verdict."""
    problem = broken_name(loose, head) or still_named(loose, head)
    if problem:
        return SenseVerdict("unclear", None, problem)
    return judge.judge(loose, senses, terms(head), retrieved)


def _disambiguator_terms(title: str) -> set[str]:
    from clariedge.construct.entities import entity_of_title

    e = entity_of_title(title)
    return e.modifier_terms() if e is not None else set()


_FIGURE = re.compile(r"[$£€]?\d[\d,.]*\d%?|[$£€]\d")


_ABBREV = re.compile(r"^[A-Z][a-z]{0,2}\.$")


def broken_name(loose: str, head: str) -> str | None:
    """Why the loose question reads as a garbled name, or None: the word before the shared name is a left-over
    part of another name ("St. Cardinals", "Mt. river"), a number or code ("5/6 mortgage"), or a
    capitalised word inside the sentence ("Nimbus Support plan" is fine when "Nimbus" names the maker, so
    only abbreviations, digits and slashes count)."""
    first = re.escape(head.split()[0])
    m = re.search(rf"(\S+)\s+{first}", loose, re.I)
    if not m:
        return None
    prev = m.group(1)
    if _ABBREV.match(prev) and prev.lower() not in ("mr.", "ms.", "dr."):
        return f"left-over abbreviation {prev!r} before {head!r}"
    if any(c.isdigit() for c in prev) or "/" in prev:
        return f"left-over number {prev!r} before {head!r}"
    return None


_NAMING_TAIL = re.compile(r"^\s*(\([^)]*\)|[A-Z0-9][\w-]*\d[\w-]*|\"[^\"]+\")")


def still_named(loose: str, head: str) -> str | None:
    """Why the loose reference is named after all, or None: a parenthesis, a code or a quoted name right after
    the head ("that region (ca-central-1)", "the plan "Vault"")."""
    last = re.escape(head.split()[-1])
    for m in re.finditer(rf"\b{last}s?\b", loose, re.I):
        tail = _NAMING_TAIL.match(loose[m.end() :])
        if tail:
            return f"{head!r} is named right after: {tail.group(1)!r}"
    return None


_YEAR = re.compile(r"\b(?:1[5-9]|20)\d\d\b")


def year_twins(titles: Sequence[str]) -> list[str]:
    """The titles that differ from another only by a year ("Titanic (1953 film)", "Titanic (1997 film)"): a
    reader takes the bare name for the best-known of them."""
    groups: dict[str, list[str]] = {}
    for title in titles:
        if _YEAR.search(title):
            groups.setdefault(" ".join(_YEAR.sub(" ", title).split()).lower(), []).append(title)
    return sorted(t for group in groups.values() if len(group) > 1 for t in group)


_ADULT = re.compile(r"\(adults?\)$", re.I)
_NOT_ONLY_SELF = re.compile(
    r"\b(?:child|children|kids?|son|daughter|baby|babies|minor|teen\w*|\d+[- ]?(?:year|yr)[- ]?olds?|we|our|us|family)\b",
    re.I,
)


def default_reading(senses: Sequence[str], turn: str) -> str | None:
    """The sense a reader takes when the turn does not say: the adult one of an adult / child pair, unless the
    turn speaks of a child or of several people ("how much does passport renewal cost online?": four blind
    readers in two builds answered with the adult price, or both, 2026-12-05)."""
    adult = next((s for s in senses if _ADULT.search(s)), None)
    return adult if adult and len(senses) > 1 and not _NOT_ONLY_SELF.search(turn) else None


def named_in_full(turn: str, shown_head: str) -> bool:
    """Whether the turn names a shared name that reads as a product's full name ("the Continental Rail Pass",
    "Lumen Fibre"): a reader takes the turn as named and answers with each variant's figure rather than asks
    which variant (two blind readers did). A bare name ("Cardinals"), a common noun ("passport renewal") or a
    demonstrative ("that Barrier Reef": one the dialog should have named) does not."""
    parts = shown_head.split()
    if len(parts) < 2 or not all(w[:1].isupper() for w in parts):
        return False
    return not re.search(rf"\b(?:this|that|these|those)\s+{re.escape(shown_head)}\b", turn, re.I)
