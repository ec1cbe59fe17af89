"""Meaning checks: would a careful reader give a constructed row the label its method claims?

Each construction rule is a guess about meaning ("removing the modifier leaves the question open");
these checks read the row the way an annotator would and say when the guess fails:

- `SenseJudge.judge`: a loose question shown with (or asked about) several entities sharing a name
  ("Mercury (planet)", "Mercury (element)"). The turn's *other* words often settle which one it means
  ("is mercury still used in thermometers?"). Two signals, both over the senses' own passages:
  lexical cues (content terms of the turn that only one sense's passages or name use) and a MiniLM
  similarity margin between the senses. Verdict `answer` (the turn picks one sense: a hard negative),
  `ask` (nothing in the turn prefers a sense, and every word it uses fits several), or `unclear`
  (neither is certain: the row is not made).
- `broken_name`: the deletion left part of a name behind ("the St. Cardinals", "a 5/6 mortgage").
- `still_named`: the loose reference is named right after all ("that region (ca-central-1)").
- `names_own_topic`: a turn put where its referent is missing still names its topic with a word of
  its own ("when did they bring out the e-type?" needs no "Jaguar").

Thresholds live in params (`synthesize.construct.checks`) and are calibrated on the hand-labelled
gold set in `tests/data/gold_labels.jsonl` (tests/test_gold_labels.py reports the precision).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import numpy as np

from clariedge.construct.text import STOP, stem, terms, words
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

    def _sense_text(self, title: str) -> str:
        return " ".join([title, *(d.text for d in self.docs_by_title.get(title, []))])

    def _vocab_of(self, title: str) -> frozenset[str]:
        return frozenset(terms(self._sense_text(title)))

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
        sims = sorted(((float(self._vec(self._sense_text(s)) @ q), s) for s in senses), reverse=True)
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
            return SenseVerdict("unclear", None, "words no sense's passages use", tuple(unsupported), margin)
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
            sentences = [x for d in self.docs_by_title.get(s, []) for x in re.split(r"(?<=[.!?])\s+", d.text) if x]
            if not sentences:
                return []
            best = max(sentences, key=lambda x: float(self._vec(x) @ q))
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


_COMPOUND = re.compile(r"[A-Za-z0-9]+(?:-[A-Za-z0-9]+)+|[A-Za-z]*\d[A-Za-z0-9]*[A-Za-z][A-Za-z0-9]*")
_AMOUNT = re.compile(r"\d+(?:k|m|bn|s|st|nd|rd|th)", re.I)  # "170k", "1990s", "20th": amounts, not names
_NAME = re.compile(r"(?<![.?!:]\s)(?<!^)\b[A-Z][A-Za-z0-9'’-]*")


def topic_terms(text: str) -> set[str]:
    """The names a text uses (lower-cased): words capitalised inside a sentence ("Montreal", "Roth", "E-Type")
    and codes or compounds ("ca-central-1", "e-type", "p-plate", "401k")."""
    found = {w.lower() for w in _NAME.findall(text) if w.lower() not in STOP and len(w) > 2}
    found |= {c.lower() for c in _COMPOUND.findall(text) if len(c) > 2 and not _AMOUNT.fullmatch(c)}
    return {stem(w) for w in found}


def _mostly_capitalised(texts: Iterable[str], min_share: float = 0.5) -> set[str]:
    """Terms written capitalised inside a sentence in at least `min_share` of their uses across `texts`, and codes
    or compounds ("ca-central-1"): names ("Montreal", "Roth"), not words a heading or a title happens to
    capitalise ("Save", "Keep")."""
    from collections import Counter

    capital: Counter[str] = Counter()
    total: Counter[str] = Counter()
    compounds: set[str] = set()
    for text in texts:
        capital.update(stem(w.lower()) for w in _NAME.findall(text) if w.lower() not in STOP and len(w) > 2)
        total.update(stem(w) for w in words(text))
        compounds |= {stem(c.lower()) for c in _COMPOUND.findall(text) if len(c) > 2 and not _AMOUNT.fullmatch(c)}
    return {t for t, k in capital.items() if k >= min_share * total[t]} | compounds


def names_own_topic(
    turn: str, topic: frozenset[str] | set[str], generic: frozenset[str] | set[str], rare: frozenset[str] = frozenset()
) -> str | None:
    """Why a turn without its referent still names its topic, or None.

    `topic`: the names the seed's own conversation uses (its dialog and passages, `topic_terms`); `generic`:
    names common across conversations. A name of the turn in the first and not in the second ("e-type" in a
    chat about Jaguar cars, "roth" in one about IRAs) lets a reader find the topic without the dialog; so do two
    words of `rare` (content terms only one conversation uses)."""
    turn_terms = terms(turn) | {stem(c.lower()) for c in _COMPOUND.findall(turn) if not _AMOUNT.fullmatch(c)}
    own = {t for t in turn_terms if t not in generic and t not in QUESTION_WORDS} & topic
    if own:
        return f"the turn names its topic: {sorted(own)}"
    # or two words only one conversation of the corpus uses ("statement", "score": a credit card)
    telling = (terms(turn) - QUESTION_WORDS) & rare
    if len(telling) >= 2:
        return f"the turn's words tell its topic: {sorted(telling)}"
    return None


# =============================================================================================
# One check per row, whatever built it: the construction runs it on every row it makes, and
# tests/test_gold_labels.py scores it on the hand-labelled gold set
# =============================================================================================
_DEFINITE = re.compile(r"\b(the|this|that|these|those|our|my|your)\s+([A-Za-z-]+)(?:\s+([A-Za-z-]+))?", re.I)
_POSSESSIVE_DETS = frozenset({"our", "my", "your"})
# nouns whose bare definite use ("the deposit", "this plan") points at one thing of a kind without naming it
OPEN_HEADS = frozenset(
    stem(w)
    for w in [
        "plan",
        "plans",
        "city",
        "region",
        "zone",
        "account",
        "card",
        "permit",
        "application",
        "appeal",
        "deposit",
        "fee",
        "form",
        "test",
        "product",
        "service",
        "team",
        "company",
        "country",
        "state",
        "capital",
        "program",
        "tier",
        "policy",
        "contract",
        "loan",
        "device",
        "building",
        "office",
        "provider",
        "bank",
        "agency",
        "court",
        "river",
        "lake",
        "island",
        "park",
        "event",
        "game",
        "match",
        "show",
        "series",
        "book",
        "movie",
        "film",
        "song",
        "album",
        "season",
        "episode",
        "version",
        "update",
        "release",
        "course",
        "class",
        "exam",
        "school",
        "hospital",
        "store",
        "restaurant",
        "hotel",
        "flight",
        "trip",
        "order",
        "project",
        "meeting",
        "job",
        "position",
    ]
)


@dataclass(frozen=True)
class RowChecker:
    """What `verify` needs besides the row: the sense judge, the corpus's names, and thresholds."""

    judge: SenseJudge
    names: frozenset[str]  # distinctive names of the corpus (`topic_terms` minus the generic ones)
    generic: frozenset[str]
    rare: frozenset[str]  # content terms only one conversation of the corpus uses
    heads: frozenset[str]  # nouns of a kind ("plan", "city", "permit") whose bare definite use is open (OPEN_HEADS)
    dialog_max_similarity: float  # an open turn this close to the shown dialog may be resolved by it
    rewrite_max_similarity: float  # a turn this close to its human rewrite stands alone ("the cotton gin")
    passage_max_similarity: float  # a shown passage this close to an open turn may resolve it

    def similarity(self, a: str, b: str) -> float:
        return float(self.judge._vec(a) @ self.judge._vec(b))


_DESCRIBED = re.compile(r"(?:est|first|last|next|same|other|main|whole|entire|only)$")


def open_definite(
    turn: str, dialog: str, documents: str, heads: frozenset[str] = OPEN_HEADS, names: frozenset[str] = frozenset()
) -> str | None:
    """A definite or possessive reference to a thing of a kind ("this plan", "the capital city", "our region")
    that nothing names, or None: "the"/"this" need the dialog or the passages to name it, "our"/"my" the dialog
    (passages cannot know which region is the user's). A name or an "of" phrase right after the noun names it
    ("the planet Mercury", "the country of Georgia"); so does a modifier that is one of `names` or a superlative."""
    said, shown = terms(dialog), terms(dialog + " " + documents)
    for m in _DEFINITE.finditer(turn):
        det, first, second = (g.lower() if g else g for g in m.groups())
        have = said if det in _POSSESSIVE_DETS else shown
        for noun, mod, end in ((first, None, m.end(2)), (second, first, m.end(3))):
            if not noun or stem(noun) not in heads or stem(noun) in have or (mod is not None and stem(mod) in have):
                continue
            if mod is not None and (stem(mod) in names or _DESCRIBED.search(mod)):
                continue  # "the penobscot river" (a name), "the longest river" (a description that picks one)
            nxt = turn[end:].split()[:1]
            if nxt and (nxt[0][:1].isupper() or nxt[0].lower() == "of" or nxt[0][:1].isdigit()):
                continue  # "the planet Mercury", "the country of Georgia", "the plan 2"
            return f"{det} {mod + ' ' if mod else ''}{noun}"
    return None


_ASKS = re.compile(
    r"^\W*(?:who|whom|whose|what|which|when|where|why|how|is|are|was|were|do|does|did|can|could|should|would|will"
    r"|has|have|had|may|might|must|shall|am|tell|explain|describe|list|give|show|define|compare|name)\b",
    re.I,
)


_CONFIRMS = re.compile(r"\byou(?:'re| are) asking\b|,\s*(?:correct|right)\s*\?$", re.I)


_PERSONAL = frozenset(
    ["it", "its", "he", "him", "his", "she", "her", "they", "them", "their", "this", "that", "these", "those"]
)
_DEMONSTRATIVE_DETS = frozenset(["this", "these", "those"])
# "it" that stands for nothing: "is it advisable to ...", "is it more challenging for ...", "where does it snow"
_EMPTY_IT = re.compile(r"\bis it (?:\w+ ){0,2}(?:to|for)\b|\bit (?:snows?|rains?)\b", re.I)
_DEICTIC_NOUNS = frozenset(
    ["year", "month", "week", "time", "morning", "evening", "weekend", "summer", "winter", "spring", "fall"]
)


def _pointing_outside(text: str) -> str | None:
    """The first word of `text` that points outside it: "this"/"these"/"those" before a noun ("this soccer
    event"), or a pronoun with no content word before it in the turn that it could stand for ("how is it
    created?"; not "is herpes lethal and how is it transmitted", nor "is it worth ...")."""
    from clariedge.construct.text import DUMMY_IT

    toks = words(text)
    cased = [w for w in text.split() if any(c.isalnum() for c in w)]
    empty_it = DUMMY_IT.search(text) or _EMPTY_IT.search(text)
    for i, w in enumerate(toks):
        nxt = toks[i + 1] if i + 1 < len(toks) else ""
        if w in _DEMONSTRATIVE_DETS and nxt.isalpha() and nxt not in STOP:
            named = len(cased) == len(toks) and cased[i + 1].istitle()  # "this Deep Impact mission", not "this SDK"
            if nxt not in _DEICTIC_NOUNS and not named:
                return f"{w} {nxt}"
            continue
        if w not in _PERSONAL or (w in ("it", "its") and empty_it) or (w == "that" and nxt):
            continue
        if not any(t not in STOP and stem(t) not in QUESTION_WORDS and not t.isdigit() for t in toks[:i]):
            return w
    return None


def needs_its_dialog(turn: str, passages: str = "") -> str | None:
    """Why a turn shown without any dialog before it would not stand alone for a reader, or None: a pronoun or
    "this X" that points outside it ("what is it that can be cleaned up", "this soccer event"), an opening
    that continues a dialog ("what about pollution?"), a short turn about "the X" that the `passages` do not
    name ("what is the value?") or a fragment ("major characters"), an exclamation ("What a terrible war!"),
    a statement, a confirmation of what a dialog said ("You're asking about X, correct?")."""
    from clariedge.construct.text import ELLIPSIS_START

    text = turn.strip().lstrip("\"'“ ")
    toks = words(text)
    if text.endswith("!"):
        return "an exclamation, not a question"
    if text.endswith(".") and not _ASKS.match(text):
        return "a statement, not a question"  # "we require the assistance of an interpreter."
    if _CONFIRMS.search(text):
        return "it confirms what the dialog said"
    if ELLIPSIS_START.match(text):
        return "it continues a dialog"  # "what about ...", "and ...", "so ..."
    pointer = _pointing_outside(text)
    if pointer:
        return f"{pointer!r} points outside the turn"
    if len(toks) <= 4:
        definite = [toks[i + 1] for i, w in enumerate(toks[:-1]) if w in ("the", "that")]
        if definite and not terms(" ".join(definite)) <= terms(passages):
            return "a short turn about an unnamed thing"
        if not _ASKS.match(text) and not any(w[:1].isupper() for w in text.split()[1:]):
            return "a fragment"
    return None


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
    if claim == "answer":
        opening = open_definite(turn, dialog, passages, checker.heads, checker.names)
        if opening:
            return SenseVerdict("unclear", None, f"an open reference: {opening!r}")
        alone = None if history else needs_its_dialog(turn, passages)
        if alone:
            return SenseVerdict("unclear", None, f"shown alone: {alone}")
    if len(senses) >= 2:
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
            return SenseVerdict("ask" if claim == "ask" else "unclear", None, "the dialog names several senses")
        shown = sorted({d.title for d in documents} & set(senses))
        verdict = check_loose(
            checker.judge, turn, head, shown if len(shown) >= 2 else senses, retrieved=len(shown) >= 2
        )
        if verdict.label == "ask" and claim == "ask" and history:
            # the dialog's own topic may pick the sense without naming it ("teams in football" after MLS)
            lean = checker.judge.judge(" ".join(history[-2:]) + " " + turn, senses, terms(head))
            if lean.label == "answer":
                return SenseVerdict("unclear", None, f"the dialog leans to {lean.sense!r}")
        return verdict
    if claim == "answer":
        return SenseVerdict("answer", None, "no open reference")
    from clariedge.construct.text import find_anchor

    anchor = find_anchor(turn, None)
    heads = checker.heads | {stem(reference)} if reference else checker.heads
    definite = open_definite(turn, dialog, passages, heads, checker.names)
    if anchor is None and definite is None:
        return SenseVerdict("unclear", None, "nothing in the turn points outside it")
    # the turn's other words (not the open reference's own) must not name its topic
    rest = re.sub(rf"\b{re.escape(definite)}\b", " ", turn, flags=re.I) if definite else turn
    named = names_own_topic(rest, checker.names, checker.generic, checker.rare)
    if named:
        return SenseVerdict("unclear", None, named)
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
    embed_fn: EmbedFn | None = None,
) -> RowChecker:
    """The checker for a corpus: `conversations` maps each conversation to its texts (turns and passages)."""
    from collections import Counter

    n = max(1, len(conversations))
    names = Counter(t for texts in conversations.values() for t in set().union(*map(topic_terms, texts)))
    proper = _mostly_capitalised(t for texts in conversations.values() for t in texts)
    names = Counter({t: k for t, k in names.items() if t in proper})
    words_ = Counter(t for texts in conversations.values() for t in set().union(*map(terms, texts)))
    generic = frozenset(t for t, k in names.items() if k > max(2, int(topic_max_share * n)))
    rare = frozenset(t for t, k in words_.items() if k <= max(1, int(rare_max_share * n)))
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
        OPEN_HEADS | classes,
        dialog_max_similarity,
        rewrite_max_similarity,
        passage_max_similarity,
    )


def gold_precision(checker: RowChecker, gold: Sequence[Mapping[str, object]], methods: Mapping[str, str]) -> dict:
    """Score `verify` on hand-labelled rows (tests/data/gold_labels.jsonl): per method, the precision of the
    rows it labels "ask" and of those it labels "answer" (a row the check leaves `unclear` is not made, so it
    counts in neither), against the reader's label. `methods` maps a method to its category."""
    from collections import Counter, defaultdict

    tally: dict[str, Counter[tuple[str, str]]] = defaultdict(Counter)
    for row in gold:
        method = str(row["method"])
        claim = "ask" if methods[method].startswith("ambiguous") else "answer"
        msgs = [(str(m["role"]), str(m["content"])) for m in row["messages"]]  # type: ignore[attr-defined]
        docs = [Document(**d) for d in row["documents"]]  # type: ignore[attr-defined]
        verdict = verify(checker, claim, msgs, docs, list(row.get("senses") or []))  # type: ignore[call-overload]
        said = verdict.label if verdict.label != "unclear" else "not_made"
        tally[method][(said, str(row["label"]))] += 1
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
