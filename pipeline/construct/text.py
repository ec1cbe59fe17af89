"""Content terms and anchors (what in a turn points outside it): the text layer of the construction.

The tokeniser (`words`) and the stop words (`STOP`) come from `clariedge.text`."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from clariedge.schema import Document, SeedTurn
from clariedge.text import STOP, cased_words, words

PRONOUNS: dict[str, str] = {
    "it": "thing",
    "its": "thing",
    "this": "thing",
    "that": "thing",
    "one": "thing",
    "he": "person",
    "him": "person",
    "his": "person",
    "she": "person",
    "her": "person",
    "they": "group",
    "them": "group",
    "their": "group",
    "these": "group",
    "those": "group",
    "there": "place",
}
ELLIPSIS_START = re.compile(r"^\s*(what about|how about|and|also|same|any|but|so|or|what if)\b", re.I)
_DETERMINERS = ("the", "this", "that")
_POSSESSIVES = frozenset(
    ["a", "an", "my", "your", "our", "their", "his", "her", "its", "any", "every", "each", "some", "no"]
)
_NOT_NOUNS = frozenset(
    [
        "is",
        "are",
        "was",
        "were",
        "be",
        "been",
        "mean",
        "means",
        "meant",
        "work",
        "works",
        "cost",
        "costs",
        "apply",
        "applies",
        "happen",
        "happens",
        "help",
        "helps",
        "calculated",
        "required",
        "needed",
        "done",
        "used",
        "called",
        "made",
        "given",
        "taken",
        # adjectives and quantifiers a definite article takes: "what is the next after The Office"
        "next",
        "last",
        "first",
        "same",
        "other",
        "rest",
        "best",
        "latest",
    ]
)


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def sentences(text: str) -> list[str]:
    """The sentences of a passage: split after ".", "!" or "?" and the space that follows."""
    return [s for s in _SENTENCE_END.split(text) if s]


def stem(word: str) -> str:
    w = word.lower().replace("’", "'")
    if w.endswith("'s"):
        w = w[:-2]
    if len(w) > 4 and w.endswith("ies"):
        return w[:-3] + "y"
    if len(w) > 4 and w.endswith(("ches", "shes", "sses", "xes")):
        return w[:-2]
    if len(w) > 3 and w.endswith("s") and not w.endswith(("ss", "us", "is")):
        return w[:-1]
    return w


def terms(text: str) -> set[str]:
    """Content terms: lower-cased, crudely singularised, stop words and short words removed."""
    return {stem(w) for w in words(text) if w not in STOP and len(w) > 2}


def passage_terms(documents: Iterable[Document]) -> set[str]:
    """Content terms of the passages as a reader sees them (title + text)."""
    return set().union(*(terms(f"{d.title} {d.text}") for d in documents))


def mentions_any(text: str, needles: Iterable[str]) -> bool:
    have = terms(text)
    return any(n in have for n in needles)


def referent_terms(seed: SeedTurn) -> set[str]:
    """Terms the human rewrite adds to the turn: what the turn leans on the dialog for."""
    if seed.rewrite is None or seed.is_standalone:
        return set()
    return terms(seed.rewrite) - terms(seed.last_turn)


def anchored_referent(seed: SeedTurn) -> set[str]:
    """The referent terms that the dialog before the turn supplies (the evidence it resolves the turn)."""
    ref = referent_terms(seed)
    prior = set().union(*(terms(m.content) for m in seed.messages[:-1])) if len(seed.messages) > 1 else set()
    return ref & prior


@dataclass(frozen=True)
class Anchor:
    """What in a turn points outside it: a pronoun, a definite noun, or an elliptical fragment."""

    kind: Literal["thing", "person", "group", "place", "noun", "ellipsis"]
    text: str
    context: str = ""  # the turn's own words around the anchor, for clarifications that quote them
    # a definite noun whose owner is what is missing ("the faster option" of which service?): the noun phrase as
    # typed ("faster option"), else ""
    owner: str = ""


def _context(turn: str, limit: int = 10) -> str:
    """The whole turn (without its final punctuation) when it is short enough to quote, else "".

    A clarification quotes the user's words only whole: a slice ("when did they bring out the") reads as a
    truncated quote."""
    text = turn.strip().rstrip("?.!").strip()
    return text if 0 < len(text.split()) <= limit else ""


_EXISTENTIAL_THERE = re.compile(
    r"\b(?:there\s+(?:is|are|was|were|be|been|'s|will|would|should|could|might|must|seems?|has|have|had)\b"
    r"|(?:is|are|was|were|will|would|could|should|can|does|do|has|have)\s+there\b)",
    re.I,
)
DUMMY_IT = re.compile(
    r"\b(?:is|was|isn't|wasn't|would|will)\s+it\s+(?:true|possible|worth|ok|okay|better|worse|safe|legal|normal|"
    r"necessary|required|too late|too early|a good idea|smart|wise|common|likely|hard|easy)\b"
    r"|\bit(?:'s|\s+is)\s+\w+\s+to\b|\bhow long (?:does|will|would) it take\b",
    re.I,
)
_DEICTIC_HERE = re.compile(
    r"\b(?:this|next|last)\s+(?:year|month|week|time|morning|evening|spring|summer|fall|winter)\b|\b\w+ing here\b", re.I
)


def find_anchor(turn: str, rewrite: str | None, context: str = "") -> Anchor | None:
    """What in `turn` points outside it. `context` is what the conversation itself says besides the turn (its
    dialog and passages): it tells a compound noun ("the soft play") from a noun and a verb ("the shop take")."""
    toks = words(turn)
    if not toks:
        return None
    rw = words(rewrite or "")
    if toks[-1] in ("it", "them") and rw and toks[-1] not in rw:
        # the turn ends on an object pronoun the rewrite replaces ("when did the americans manage it?" -> "... go
        # into space?"): what "it" is matters more than a noun the rewrite also specifies
        return Anchor("thing" if toks[-1] == "it" else "group", toks[-1], _context(turn))
    added = terms(rewrite or "") - terms(turn)
    cased = cased_words(turn)  # `toks` as typed (same tokens, case kept)
    # a definite noun the rewrite specifies with a word it adds: "the plan" -> "the Lite plan"
    for i, w in enumerate(toks[:-1]):
        nxt = toks[i + 1]
        after = toks[i + 2] if i + 2 < len(toks) else ""
        if (
            w in ("the", "this", "that", "these", "those")
            and nxt not in STOP
            and nxt not in _NOT_NOUNS
            and len(nxt) > 2
            and nxt.isalpha()
            and not nxt.endswith(("ed", "ing", "ly"))
            # not a name ("the USA", "the Cardinals") nor the modifier of "one" ("the montreal one"): the word a
            # clarification would ask about is another
            and not (cased[i + 1][:1].isupper() and not turn.isupper())
            and after != "one"
            # "how long does that take": the demonstrative is the subject and the word a verb ("does this plan renew")
            and not (w in ("this", "that") and i > 0 and toks[i - 1] in _AUXILIARIES and nxt in _VERBS)
        ):
            noun = nxt
            for j, r in enumerate(rw[1:], start=1):
                if stem(r) == stem(noun) and stem(rw[j - 1]) in added:
                    return _noun_anchor(turn, rewrite, noun, context)
    for w in toks:
        if w in PRONOUNS:
            if w == "that" and not re.search(r"\bthat\b\s*(\?|$|is|was|mean|one|work|apply|cost)", turn, re.I):
                continue
            if w == "one" and not re.search(r"\b(the|this|that|which|other) one\b", turn, re.I):
                continue
            if w == "there" and _EXISTENTIAL_THERE.search(turn):
                continue  # "is there a fee?" points nowhere
            if w in ("it", "its") and DUMMY_IT.search(turn) and sum(t in ("it", "its") for t in toks) == 1:
                continue  # "is it true that ...", "is it worth ...": no referent
            if w == "this" and _DEICTIC_HERE.search(turn):
                continue  # "first time investing here", "this year": the speaker's own situation
            # "and the faster option, what's that cost?": the pronoun points at a definite noun of the turn
            # itself, and that noun is what is unresolved
            m = re.search(rf"\bthe\s+(?:[a-z-]+\s+)?([a-z]{{3,}})\s*,[^.?!]*?\b{re.escape(w)}\b", turn, re.I)
            if m and w in ("it", "that", "this") and m.group(1).lower() not in STOP:
                return _noun_anchor(turn, rewrite, m.group(1).lower(), context)
            return Anchor(PRONOUNS[w], w, _context(turn))  # type: ignore[arg-type]
    if ELLIPSIS_START.match(turn) or len(toks) <= 4:
        return Anchor("ellipsis", _fragment(turn), _fragment(turn))
    return None


def _noun_anchor(turn: str, rewrite: str | None, noun: str, context: str) -> Anchor:
    noun = _compound(noun, turn, context)
    owner = ""
    if owner_left_out(rewrite, noun.split()[0]):
        m = re.search(rf"\b(?:the|this|that|these|those)\s+((?:[a-z-]+\s+){{0,2}}?{re.escape(noun)})\b", turn, re.I)
        owner = m.group(1).lower() if m else noun
    return Anchor("noun", noun, _context(turn), owner)


def _compound(noun: str, turn: str, context: str) -> str:
    """`noun` with up to two words that follow it in the turn, where the conversation itself (`context`: its dialog
    and passages) says them together: "the soft play" -> "soft play" where the dialog named "the Jungle Den soft
    play", "the park and ride" -> "park and ride", but "does the shop take cards" keeps "shop". The rewrite cannot tell: it copies the words of the turn that follow the noun."""
    t, said = words(turn), f" {' '.join(words(context))} "
    if noun not in t:
        return noun
    i = t.index(noun) + 1
    phrase = [noun]
    while i < len(t) and len(phrase) < 3:
        w = t[i : i + 2] if t[i] in _CONNECTORS else t[i : i + 1]  # "the park and ride": a connector inside a name
        if w[-1] in STOP or w[-1] in _VERBS or w[-1] in _NOT_NOUNS or not w[-1].isalpha():
            break
        if f" {' '.join([phrase[-1], *w])} " not in said:
            break
        phrase += w
        i += len(w)
    return " ".join(phrase)


_CONNECTORS = frozenset({"for", "of", "de", "and"})
# "how long does that take?": "that" is the subject there, not a determiner ("does this plan renew?" keeps "plan")
_AUXILIARIES = frozenset({"do", "does", "did", "will", "would", "can", "could", "should", "may", "might", "is", "was"})
_VERBS = frozenset(
    {"take", "cost", "mean", "work", "apply", "include", "count", "cover", "matter", "help", "happen", "change"}
    | {"affect", "need", "require", "last", "run", "start", "end", "pay", "make", "get", "go", "leave", "open"}
)


def owner_left_out(rewrite: str | None, noun: str) -> bool:
    """Whether the human rewrite pins the turn's definite noun by naming what it belongs to rather than which one
    it is: "the faster option" -> "an Expedited restore on the Nimbus Archive plan" (the noun is gone), "the
    margin" -> "the Corvane Energy segment's operating margin" (a name apart from the noun's own name). Then
    "which option?" asks about the wrong word: what is missing is the thing the noun belongs to. "the plan" ->
    "the Nimbus Lite plan" names the plan itself, and so does "the Juniper spa" beside another name ("Silverpine
    Rewards points ... at the Juniper spa": "What do you mean by the spa?" read as weak, 2026-12-06)."""
    toks = cased_words(rewrite or "")
    if not toks:
        return False
    at = [j for j, w in enumerate(toks) if stem(w) == stem(noun)]
    if not at:
        return True
    i = at[0] - 1  # back over the noun's own name ("Nimbus Enterprise support plan", "Nimbus DB for Postgres"), up
    # to a stop word or a possessive ("the Energy segment's margin": the segment owns the margin)
    while i >= 0 and not toks[i].endswith("'s"):
        w = toks[i].lower()
        inside = w in _CONNECTORS and i > 0 and toks[i - 1][:1].isupper()
        if w in STOP and not inside:
            break
        i -= 1
    end = at[0] + 1  # and on over a name the noun's own name continues with ("the Penmoor Museum of Childhood")
    while end + 1 < len(toks) and toks[end].lower() in _CONNECTORS and toks[end + 1][:1].isupper():
        end += 2
        while end < len(toks) and toks[end][:1].isupper():
            end += 1
    own = range(i + 1, end)
    if any(toks[k][:1].isupper() for k in own):
        return False  # the noun has a name of its own ("the Juniper spa at ..."): "which spa?" is answered by it
    return any(w[:1].isupper() and k > 0 and k not in own and not _placed(toks, k) for k, w in enumerate(toks))


_WHEN_OR_WHERE = frozenset({"at", "in", "to", "near"})
_CALENDAR = re.compile(
    r"(?:mon|tues|wednes|thurs|fri|satur|sun)days?|january|february|march|april|may|june|july|"
    r"august|september|october|november|december",
    re.I,
)


def _placed(toks: Sequence[str], k: int) -> bool:
    """Whether the capitalised word `toks[k]` says where or when, not whose: "I", a day or month, or a name after
    "at", "in", "to" ("the Ashby Hall residence at Ellingham University": the rewrite names the residence, and a
    clarification asks "which residence?", not "the residence of what?")."""
    if toks[k] == "I" or _CALENDAR.fullmatch(toks[k]):
        return True
    j = k - 1
    while j >= 0 and (toks[j][:1].isupper() or toks[j].lower() in ("the", "of")):
        j -= 1
    return j >= 0 and toks[j].lower() in _WHEN_OR_WHERE


def _fragment(turn: str, limit: int = 8) -> str:
    ws = turn.strip().rstrip("?.!").split()
    return " ".join(ws[:limit]) + (" ..." if len(ws) > limit else "")
