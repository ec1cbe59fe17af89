"""Offline `construct` backend: correct-by-construction examples from the dialogs' structure (no LLM).

Every row is built by a deterministic operation on a real seed turn whose effect on the label is
known, and carries the evidence for its label:

- `hard_negative` (resolution = a standalone question the dialog or documents make explicit)
  * `hn_dialog_resolves`: a non-standalone turn (the human rewrite adds words) in its full dialog,
    where the words the rewrite adds occur earlier in the dialog; post-retrieval with its documents.
  * `hn_generalized_in_dialog`: a complete question whose distinguishing modifier was removed
    ("How long is the river?") right after a dialog that named exactly one such entity.
  * `hn_documents_resolve` (post): the generalised question with documents about one entity only.
- `ambiguous_dialog` (no row's dialog or documents contain the missing referent)
  * `ad_cut_before_referent`: the non-standalone turn with the dialog cut before the referent appeared.
  * `ad_stitched`: the turn (or a generalised question) stitched onto another conversation: a topic
    switch that drops its subject.
  * `ad_generalized_unpinned`: a complete, self-contained-looking question with a definite reference
    ("When does the plan renew?") that nothing in the dialog pins down.
- `ambiguous_documents` (post) `adoc_entity_collision`: the generalised question with documents about
  two or more distinct entities sharing a head (titles `Mercury (planet)` / `Mercury (element)`,
  `Penobscot River` / `Hudson River`); interpretations = those entities, the clarification names them.
- `clear`: `clear_as_is` (standalone turns as they are), `clear_rewrite` (a human rewrite placed as
  the turn), `clear_specific_docs` (post: the specific question with the mixed documents).

Wordings of clarifications and optional lead-ins / surface variants are drawn from template banks with
the caller's seeded rng and recorded in `provenance.template`. Surface variants are applied to every
category alike, so they carry no label information.

Inputs:  seed turns (`SeedTurn`).
Outputs: examples (`Example`) of the four categories in both settings, rejects, stats (counts per
         method / category / setting, pairing rate, shallow separability of the last turn).
Params:  `synthesize.construct.*` (see `ConstructConfig`); the rng comes from the caller (top-level `seed`).
"""

from __future__ import annotations

import random
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator

from clariedge.config import StageConfig
from clariedge.io import Rejects, describe_validation_error
from clariedge.schema import CATEGORIES, Document, Example, Message, Provenance, SeedTurn, Setting

GENERATOR = "construct"

METHODS: dict[str, str] = {
    "clear_as_is": "clear",
    "clear_rewrite": "clear",
    "clear_specific_docs": "clear",
    "hn_dialog_resolves": "hard_negative",
    "hn_generalized_in_dialog": "hard_negative",
    "hn_documents_resolve": "hard_negative",
    "ad_cut_before_referent": "ambiguous_dialog",
    "ad_stitched": "ambiguous_dialog",
    "ad_generalized_unpinned": "ambiguous_dialog",
    "adoc_entity_collision": "ambiguous_documents",
}

DEFAULT_PER_SEED: dict[str, int] = {
    "clear_as_is": 1,
    "clear_rewrite": 1,
    "clear_specific_docs": 1,
    "hn_dialog_resolves": 1,
    "hn_generalized_in_dialog": 1,
    "hn_documents_resolve": 1,
    "ad_cut_before_referent": 1,
    "ad_stitched": 1,
    "ad_generalized_unpinned": 1,
    "adoc_entity_collision": 1,
}


class ConstructConfig(StageConfig):
    """Knobs of the construct backend (params.yaml: `synthesize.construct`)."""

    per_seed: dict[str, int] = Field(
        default_factory=lambda: dict(DEFAULT_PER_SEED),
        description="method -> how many instances per seed turn (each gives a row per setting; 0 disables)",
    )
    settings: list[Setting] = Field(default_factory=lambda: ["pre_retrieval", "post_retrieval"])
    max_documents: int = Field(5, ge=1, description="documents per post-retrieval row")
    max_interpretations: int = Field(4, ge=2, description="entities per ambiguous_documents row (2..this)")
    stitch_tries: int = Field(12, ge=1, description="host dialogs tried when stitching a turn elsewhere")
    stitch_other_domain: bool = Field(True, description="stitch pronoun turns only onto another domain's dialog")
    lead_in_prob: float = Field(0.12, ge=0.0, le=1.0, description="chance of a conversational lead-in, any category")
    lowercase_prob: float = Field(0.15, ge=0.0, le=1.0, description="chance of lower-casing a turn, any category")
    drop_qmark_prob: float = Field(0.1, ge=0.0, le=1.0, description="chance of dropping the final '?', any category")
    max_turn_words: int = Field(80, ge=5, description="skip seed turns longer than this")
    switch_prob: float = Field(
        0.5, ge=0.0, le=1.0, description="chance a document-set row follows another conversation (topic switch)"
    )
    entities_per_seed: int = Field(2, ge=0, description="entities generalised per seed turn (loose questions)")
    length_match: bool = Field(True, description="thin out clear rows whose turn length is over-represented")
    length_match_slack: float = Field(
        1.5, ge=0.0, description="keep rate per length bin = min(1, slack * other share / clear share)"
    )
    separability: bool = Field(True, description="compute the shallow-separability report (sklearn)")
    separability_folds: int = Field(5, ge=2)

    @field_validator("per_seed")
    @classmethod
    def _known_methods(cls, v: dict[str, int]) -> dict[str, int]:
        unknown = sorted(set(v) - set(METHODS))
        if unknown:
            raise ValueError(f"unknown construct methods {unknown} (known: {', '.join(sorted(METHODS))})")
        if any(n < 0 for n in v.values()):
            raise ValueError("per_seed counts must be >= 0")
        return {**{m: 0 for m in METHODS}, **v} if v else dict(DEFAULT_PER_SEED)


# =============================================================================================
# Words and terms
# =============================================================================================
def _wordset(text: str) -> frozenset[str]:
    return frozenset(text.split())


_WORD = re.compile(r"[A-Za-z0-9]+(?:['’][A-Za-z]+)?")
STOP = _wordset(
    "a about above after again against all also am an and any are aren't as at be because been before being below "
    "between both but by can can't could couldn't did didn't do does doesn't doing don't down during each few for "
    "from further get gets got had hadn't has hasn't have haven't having he he'd he'll he's her here here's hers "
    "herself him himself his how how's i i'd i'll i'm i've if in into is isn't it it's its itself let's me more "
    "most mustn't my myself no nor not of off on once only or other ought our ours ourselves out over own same "
    "shan't she she'd she'll she's should shouldn't so some such than that that's the their theirs them "
    "themselves then there there's these they they'd they'll they're they've this those through to too under "
    "until up very was wasn't we we'd we'll we're we've were weren't what what's when when's where where's which "
    "while who who's whom why why's will with won't would wouldn't you you'd you'll you're you've your yours "
    "yourself yourselves ok okay please tell know like can could would want need give provide explain describe "
    "mean meant also just really thanks thank yes well much many way ways one ones still even though something "
    "anything thing things kind sort lot lots get got make made use used using regarding regard related relation "
    "respect context specific specifically particular case"
)
PRONOUNS: dict[str, str] = {
    "it": "thing",
    "its": "thing",
    "this": "thing",
    "that": "thing",
    "here": "thing",
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
_ELLIPSIS_START = re.compile(r"^\s*(what about|how about|and|also|same|any|but|so|or|what if)\b", re.I)
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
    ]
)


def words(text: str) -> list[str]:
    return [w.lower().replace("’", "'") for w in _WORD.findall(text)]


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


def _context(turn: str, word: str, span: int = 3) -> str:
    """Up to `span` words either side of the first occurrence of `word` in `turn` (as typed)."""
    clauses = [c for c in re.split(r"(?<=[.?!;])\s+", turn.strip()) if word in words(c)]
    raw = (clauses[0] if clauses else turn).strip().rstrip("?.!").split()
    low = [w.lower().strip(",.;:!?\"'") for w in raw]
    if word not in low:
        return _fragment(turn, 7)
    i = low.index(word)
    return " ".join(raw[max(0, i - span) : i + span + 1]).strip(",;: ")


def find_anchor(turn: str, rewrite: str | None) -> Anchor | None:
    toks = words(turn)
    if not toks:
        return None
    rw = words(rewrite or "")
    added = terms(rewrite or "") - terms(turn)
    # a definite noun the rewrite specifies with a word it adds: "the plan" -> "the Lite plan"
    for i, w in enumerate(toks[:-1]):
        nxt = toks[i + 1]
        if (
            w in ("the", "this", "that", "these", "those")
            and nxt not in STOP
            and nxt not in _NOT_NOUNS
            and len(nxt) > 2
            and nxt.isalpha()
            and not nxt.endswith(("ed", "ing", "ly"))
        ):
            noun = nxt
            for j, r in enumerate(rw[1:], start=1):
                if stem(r) == stem(noun) and stem(rw[j - 1]) in added:
                    return Anchor("noun", noun, _context(turn, noun))
    for w in toks:
        if w in PRONOUNS:
            if w == "that" and not re.search(r"\bthat\b\s*(\?|$|is|was|mean|one|work|apply|cost)", turn, re.I):
                continue
            if w == "one" and not re.search(r"\b(the|this|that|which|other) one\b", turn, re.I):
                continue
            return Anchor(PRONOUNS[w], w, _context(turn, w))  # type: ignore[arg-type]
    if _ELLIPSIS_START.match(turn) or len(toks) <= 4:
        return Anchor("ellipsis", _fragment(turn), _fragment(turn))
    return None


def _fragment(turn: str, limit: int = 8) -> str:
    ws = turn.strip().rstrip("?.!").split()
    return " ".join(ws[:limit]) + (" ..." if len(ws) > limit else "")


# =============================================================================================
# Entities: from document titles (`Head (Disambiguator)`, `Modifier Head`) and from the text itself
# =============================================================================================
GENERIC_HEADS = _wordset(
    "river lake sea ocean mountain island city town county state country province region valley park court courts "
    "order orders plan plans service services account accounts card cards tax taxes credit fund funds bank loan "
    "loans policy program programme act law form war battle party team club league cup season series show film "
    "movie novel album song band book game tier instance cluster database server region zone key keys model "
    "models api sdk library plugin app application tool tools feature account certificate bucket function "
    "functions catalog dashboard console agreement contract insurance pension mortgage bond stock stocks index "
    "rate rates exchange company corporation university college school hospital department agency bureau office "
    "program center centre station bridge dam canal festival award prize church cathedral castle museum airport "
    "railway highway"
)
_TITLE_SPLIT = re.compile(r"\s+[|–—-]\s+|:\s+")
_PAREN = re.compile(r"^(?P<name>.+?)\s*\((?P<dis>[^()]+)\)$")
_BAD_TITLE_START = re.compile(r"^(list|lists|comparison|history|timeline|outline|index|glossary) of\b", re.I)
_CAP = r"(?:[A-Z][\w'’&.-]*|\d[\w.]*)"
_GENERIC_STEMS = frozenset(stem(h) for h in GENERIC_HEADS)
_LEX_MENTION = re.compile(
    rf"\b(?P<mod>{_CAP}(?:\s+{_CAP})*)\s+(?P<head>(?i:{'|'.join(sorted(GENERIC_HEADS, key=len, reverse=True))})s?)\b"
)


@dataclass(frozen=True)
class Entity:
    """A thing a question can name precisely or loosely: `modifier` distinguishes it within `head`."""

    key: str  # group key: the shared head (lower-case)
    head: str  # how the loose question names it ("river", "Mercury")
    modifier: str  # what the precise question adds ("Penobscot", "planet")
    label: str  # how a clarification names it ("the Penobscot River", "Mercury (planet)")
    kind: Literal["paren", "suffix"]
    title: str = ""  # the document title it came from ("" for text-derived entities)

    def patterns(self) -> list[re.Pattern[str]]:
        """Patterns matching the precise mention in a question; group `n` is the loose name."""
        return _patterns(self.kind, self.head, self.modifier)

    def mentioned_in(self, text: str) -> bool:
        return any(p.search(text) for p in self.patterns())

    def modifier_terms(self) -> set[str]:
        return terms(self.modifier) - terms(self.head)


_PATTERN_CACHE: dict[tuple[str, str, str], list[re.Pattern[str]]] = {}


def _alt(options: Iterable[str]) -> str:
    opts = sorted({o for o in options if o}, key=len, reverse=True)
    return "(?:" + "|".join(r"[\s-]+".join(re.escape(w) for w in o.split()) for o in opts) + ")"


def _patterns(kind: str, head: str, modifier: str) -> list[re.Pattern[str]]:
    key = (kind, head, modifier)
    if key in _PATTERN_CACHE:
        return _PATTERN_CACHE[key]
    if kind == "suffix":
        m, h = _alt([modifier]), _alt([head])
        pats = [rf"\b(?P<the>the\s+)?{m}[\s-]+(?P<n>{h}(?:e?s)?)\b"]
    else:
        names = [head]
        first, _, rest = head.partition(" ")
        if rest and any(c.isdigit() for c in rest):
            names.append(rest)  # "Form 1099" is also just "1099"
        dis = [modifier, *(p.strip() for p in modifier.split(","))]
        dis += [w for w in modifier.replace(",", " ").split() if len(w) > 3 and w.lower() not in STOP]
        n, d = _alt(names), _alt(dis)
        pats = [
            rf"\b(?P<the>the\s+)?{d}[\s-]+(?P<n>{n}s?)\b",
            rf"\b(?P<the>the\s+)?(?P<n>{n}s?)[\s-]+{d}\b",
            rf"\b(?P<n>{n}),?\s+the\s+{d}\b",
            rf"\b(?P<n>{n})\s*\({d}\)",
            rf"\b(?P<the>the\s+)?{d}\s+of\s+(?P<n>{n})\b",
            rf"\b(?P<the>the\s+)?(?P<n>{n}s?)\s+(?:for|on|of)\s+(?:the\s+|a\s+|an\s+)?{d}\b",
        ]
    out = [re.compile(p, re.I) for p in pats]
    _PATTERN_CACHE[key] = out
    return out


def entity_of_title(title: str) -> Entity | None:
    """The entity a document title names (`Head (Disambiguator)` or `Modifier Head`), else None.

    Only titles that share a head with another title form a collision group (see `_build_entities`)."""
    main = _TITLE_SPLIT.split(title.strip())[0].strip() if title else ""
    if not main or _BAD_TITLE_START.match(main):
        return None
    m = _PAREN.match(main)
    if m:
        name, dis = m["name"].strip(), m["dis"].strip()
        if not terms(dis) and not re.search(r"\w", dis):
            return None
        return Entity(key=name.lower(), head=name, modifier=dis, label=f"{name} ({dis})", kind="paren", title=title)
    ws = main.split()
    head = ws[-1].lower()
    if len(ws) < 2 or not head.isalpha() or len(head) < 3 or head in STOP:
        return None
    # a name-like modifier ("Penobscot", "Women's association"), not a phrase ("Running a", "Estimating your")
    mod_words = [w.lower() for w in ws[:-1]]
    if any(w in STOP for w in mod_words) or mod_words[0].endswith("ing"):
        return None
    return Entity(
        key=stem(ws[-1].lower()),
        head=ws[-1].lower(),
        modifier=" ".join(ws[:-1]),
        label=f"the {main}" if ws[-1][:1].isupper() else main,
        kind="suffix",
        title=title,
    )


def _common_suffix(entities: Sequence[Entity]) -> list[Entity]:
    """Widen each title's head to the longest word suffix it shares with another title of its group
    ("restraining order"), regroup by it, and drop titles with nothing left to distinguish them."""
    split = [(e, [stem(w.lower()) for w in _TITLE_SPLIT.split(e.title.strip())[0].split()]) for e in entities]
    out = []
    for e, ws in split:
        n = 1
        for _, other in split:
            if other is ws:
                continue
            k = 0
            while k < min(len(ws), len(other)) and ws[-k - 1] == other[-k - 1]:
                k += 1
            n = max(n, k)
        words_ = _TITLE_SPLIT.split(e.title.strip())[0].split()
        modifier = " ".join(words_[:-n])
        if modifier and terms(modifier):
            head = " ".join(ws[-n:])
            out.append(Entity(key=head, head=head, modifier=modifier, label=e.label, kind="suffix", title=e.title))
    return out


def text_entities(text: str) -> list[Entity]:
    """`Capitalised Modifier + generic head` mentions in running text ("the Lite plan", "Penobscot River")."""
    out = []
    for m in _LEX_MENTION.finditer(text):
        before, after = text[: m.start()], text[m.end() :]
        if re.search(r"[A-Z][\w'’-]*\s+(?:of|for|and|de|on)\s+(?:the\s+)?$", before) or re.match(r"\s+[A-Z0-9]", after):
            continue  # part of a longer name: "Defense of Marriage Act", "Cloud Functions SDK"
        if before and not before[-1].isspace() and before[-1] not in "(\"'“‘":
            continue  # inside a token: the "000 credit" of "$5,000 credit limit"
        mod = m["mod"].strip().split()
        while mod and (mod[0].lower() in STOP or mod[0].lower() in _DETERMINERS):
            mod = mod[1:]  # a sentence-initial question word is not a modifier
        if not mod or not terms(" ".join(mod)):
            continue
        head = stem(m["head"].lower())
        label = f"the {' '.join(mod)} {m['head'] if m['head'][0].isupper() else head}"
        out.append(Entity(key=head, head=head, modifier=" ".join(mod), label=label, kind="suffix"))
    return out


def _inside_name(before: str) -> bool:
    """Whether the text before a match ends in a capitalised word that is not a sentence's first word."""
    ws = before.split()
    if ws and re.fullmatch(r"[A-Z][a-z]{0,2}\.", ws[-1]):
        return True  # an abbreviation that starts a name: "St.", "Mt.", "Ft."
    if len(ws) < 2 or not ws[-1][:1].isupper() or ws[-1] == "I":
        return False
    return not ws[-2].endswith((".", "?", "!", ":"))


def generalize(question: str, entity: Entity, determiner: str) -> str | None:
    """Remove the distinguishing modifier: "How long is the Penobscot River?" -> "How long is the river?"."""
    for pat in entity.patterns():
        m = pat.search(question)
        if not m:
            continue
        name = m["n"]
        if _inside_name(question[: m.start()]):
            return None  # the match is the tail of a longer name: "St. Louis Cardinals" -> "St. Cardinals"
        if entity.kind == "suffix":
            if name.lower().endswith("s") and not entity.head.endswith("s") and determiner in ("this", "that"):
                determiner = "these" if determiner == "this" else "those"
            before = words(question[: m.start()])[-1:]
            has_the = bool(m.groupdict().get("the"))
            if not has_the and before and before[0] in _POSSESSIVES:
                determiner = ""  # "an IBM Cloud account" -> "an account", "my Roth IRA" -> "my IRA"
            elif not has_the and not name[:1].isupper():
                determiner = ""  # "about American football" -> "about football"
            repl = f"{determiner} {name.lower()}".strip()
        else:
            proper = entity.head[:1].isupper() and " " not in entity.head and not entity.head.endswith("s")
            has_article = bool(m.groupdict().get("the"))
            if name.endswith("s") and determiner in ("this", "that"):
                determiner = "these" if determiner == "this" else "those"
            art = f"{determiner} " if has_article and not proper else ""
            repl = f"{art}{name}"
        out = question[: m.start()] + repl + question[m.end() :]
        out = re.sub(r"\s+", " ", out).strip()
        out = re.sub(r"\b([Aa]) (?=[aeiouAEIOU])", r"\1n ", out)
        if m.start() == 0 and question[:1].isupper():
            out = out[:1].upper() + out[1:]
        if entity.mentioned_in(out) or entity.modifier_terms() & terms(out):
            return None
        head_terms = terms(entity.head)
        if head_terms and sum(1 for w in words(out) if stem(w) in head_terms) > len(head_terms):
            return None  # "is the river the longest river" reads oddly
        return out
    return None


# =============================================================================================
# Wording banks (ids are recorded in provenance.template)
# =============================================================================================
CLARIFY: dict[str, list[str]] = {
    "noun": [
        "Which {noun} do you mean?",
        "Which {noun} are you asking about?",
        "Could you tell me which {noun} you have in mind?",
        "I'm not sure which {noun} you're referring to. Can you name it?",
        "Can you specify the {noun} you mean?",
        "Sorry, which {noun} is this about?",
        "Which particular {noun} should I look at?",
        "Do you have a specific {noun} in mind? Which one?",
        "Before I answer: which {noun} do you mean?",
        "Which {noun} are you talking about here?",
        "Just to be sure, which {noun} is your question about?",
        "I don't see a {noun} mentioned yet. Can you say which one you mean?",
        'You asked "{context}". Which {noun} do you mean there?',
        'In "{context}", which {noun} do you mean?',
        'When you say "{context}", which {noun} are you thinking of?',
    ],
    "thing": [
        'What does "{anchor}" refer to here?',
        'What are you referring to by "{anchor}"?',
        'Could you tell me what "{anchor}" is?',
        'Sorry, what is "{anchor}" in your question?',
        'Can you clarify what you mean by "{anchor}"?',
        "What exactly are you asking about?",
        'I\'m not sure what "{anchor}" points to. What are you asking about?',
        "It isn't clear from our conversation: which thing are you asking about?",
        "What is the subject of your question?",
        "Could you name what you're asking about?",
        'In "{context}", what does "{anchor}" refer to?',
        'When you ask "{context}", what do you mean by "{anchor}"?',
        'You asked "{context}": what is "{anchor}" here?',
        'I cannot tell from our conversation: what is "{anchor}" in "{context}"?',
    ],
    "person": [
        'Who do you mean by "{anchor}"?',
        "Who are you asking about?",
        "Which person are you referring to?",
        "Could you tell me who you mean?",
        "Sorry, who are you talking about?",
        "Who is this question about?",
        'I\'m not sure who "{anchor}" is. Can you give me a name?',
        'In "{context}", who is "{anchor}"?',
        'When you ask "{context}", who do you mean?',
        'Who does "{anchor}" refer to in "{context}"?',
    ],
    "group": [
        'Who or what does "{anchor}" refer to?',
        'Who do you mean by "{anchor}"?',
        "Which ones are you asking about?",
        'What are "{anchor}" in your question?',
        'Could you say who or what you mean by "{anchor}"?',
        "Which group or items are you asking about?",
        "Who or what is your question about?",
        'In "{context}", who or what are "{anchor}"?',
        'When you ask "{context}", who do you mean by "{anchor}"?',
        'Which ones do you mean in "{context}"?',
    ],
    "place": [
        'Where do you mean by "{anchor}"?',
        "Which place are you asking about?",
        "Could you tell me where you mean?",
        'What does "{anchor}" refer to? Which place or setting?',
        "Where is this about?",
        "Which location do you have in mind?",
        'In "{context}", where is "{anchor}"?',
        'When you ask "{context}", which place do you mean?',
        'Where does "{anchor}" point to in "{context}"?',
    ],
    "ellipsis": [
        "Could you give me more context? What are you asking about?",
        'What would you like to know about "{fragment}"?',
        "Can you say more about what you'd like to know?",
        'I\'m missing some context. What does "{fragment}" relate to?',
        'Which topic is "{fragment}" about?',
        "I'm not sure what this refers to. Could you rephrase it as a full question?",
        'What is your question regarding "{fragment}"?',
        "Can you tell me what this is about?",
    ],
}
CLARIFY_DOCS: dict[str, list[str]] = {
    "two": [
        "Do you mean {a} or {b}?",
        "Are you asking about {a} or {b}?",
        "Which one do you mean: {a} or {b}?",
        "I found information on both {a} and {b}. Which one are you interested in?",
        "Is your question about {a} or about {b}?",
        "There are two matches, {a} and {b}. Which did you mean?",
        "Could you clarify whether you mean {a} or {b}?",
        "Do you want to know about {a}, or about {b}?",
        "{A} or {b}: which one are you asking about?",
    ],
    "few": [
        "Do you mean {or_list}?",
        "Which of these do you mean: {list}?",
        "Are you asking about {or_list}?",
        "The documents mention {and_list}. Which one do you mean?",
        "Could you tell me which one you mean: {or_list}?",
        "I see several possibilities: {list}. Which one is it?",
    ],
    "many": [
        "The documents cover several: {list}. Which one do you mean?",
        "For example {list}: which one are you asking about?",
        "Which one do you mean: {or_list}?",
        "There are several possibilities ({list}). Which one do you mean?",
        "I found a few possibilities ({list}). Which do you mean?",
        "There are several matches: {list}. Which one should I answer about?",
        "The passages mention {list}. Could you narrow it down?",
    ],
}
LEAD_INS = [
    "Okay, ",
    "Thanks. ",
    "One more thing: ",
    "Also, ",
    "Quick question: ",
    "Hmm, ",
    "Different question: ",
    "By the way, ",
    "And ",
    "So ",
    "Got it. ",
    "Another thing, ",
    "Ok so ",
    "Right, ",
    "Unrelated, but ",
    "Changing the subject, ",
    "Something else: ",
]


def _listing(labels: Sequence[str]) -> dict[str, str]:
    body = ", ".join(labels[:-1])
    return {
        "list": ", ".join(labels),
        "or_list": f"{body} or {labels[-1]}",
        "and_list": f"{body} and {labels[-1]}",
    }


_SINGULAR_ONLY = re.compile(r"\ba (?:specific )?\{noun\}|name it|Which one|see one", re.I)


def _plural(noun: str) -> bool:
    return noun.lower().endswith("s") and stem(noun) != noun.lower()


def clarify_dialog(anchor: Anchor, rng: random.Random) -> tuple[str, str]:
    bank = CLARIFY[anchor.kind]
    plural = anchor.kind == "noun" and _plural(anchor.text)
    allowed = [i for i, t in enumerate(bank) if not (plural and _SINGULAR_ONLY.search(t))]
    i = allowed[rng.randrange(len(allowed))]
    text = bank[i].format(noun=anchor.text, anchor=anchor.text, fragment=anchor.text, context=anchor.context)
    return _cap(text), f"clarify.{anchor.kind}.{i}"


_MENTIONS_RETRIEVAL = re.compile(r"\b(documents?|passages?|found|matches|information on)\b", re.I)


def clarify_documents(labels: Sequence[str], rng: random.Random, retrieved: bool = True) -> tuple[str, str]:
    """A clarification naming the interpretations; without documents, one that does not cite any."""
    size = "two" if len(labels) == 2 else "few" if len(labels) == 3 else "many"
    bank = CLARIFY_DOCS[size]
    allowed = [i for i, t in enumerate(bank) if retrieved or not _MENTIONS_RETRIEVAL.search(t)]
    i = allowed[rng.randrange(len(allowed))]
    a, b = labels[0], labels[1]
    text = bank[i].format(a=a, b=b, A=_cap(a), **_listing(labels))
    return _cap(text), f"clarify_docs.{size}.{i}"


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:] if text else text


# =============================================================================================
# The construction
# =============================================================================================
@dataclass
class _Ctx:
    seeds: list[SeedTurn]
    cfg: ConstructConfig
    rng: random.Random
    by_conv: dict[str, list[SeedTurn]]
    groups: dict[str, dict[str, Entity]]  # entity key -> modifier(lower) -> entity (from titles)
    docs_by_title: dict[str, list[Document]]
    doc_hosts: list[SeedTurn] = field(default_factory=list)
    rejects: Rejects = field(default_factory=Rejects)
    counts: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)


def _build_entities(seeds: Sequence[SeedTurn]) -> tuple[dict[str, dict[str, Entity]], dict[str, list[Document]]]:
    docs_by_title: dict[str, dict[str, Document]] = defaultdict(dict)
    for s in seeds:
        for d in s.documents:
            if d.title:
                docs_by_title[d.title][d.doc_id] = d
    raw: dict[str, list[Entity]] = defaultdict(list)
    for title in sorted(docs_by_title):
        e = entity_of_title(title)
        if e is not None:
            raw[e.key].append(e)
    groups: dict[str, dict[str, Entity]] = defaultdict(dict)
    for _, ents in sorted(raw.items()):
        for e in _common_suffix(ents) if ents[0].kind == "suffix" else ents:
            groups[e.key].setdefault(e.modifier.lower(), e)
    colliding = {k: v for k, v in groups.items() if len(v) >= 2}
    return colliding, {t: [docs[k] for k in sorted(docs)] for t, docs in docs_by_title.items()}


TOPIC_SWITCHES = frozenset({"Different question: ", "Unrelated, but ", "Changing the subject, ", "Something else: "})
# rows whose label rests on the dialog resolving the turn: an explicit topic switch would cut that link
_DIALOG_RESOLVED = frozenset({"hn_dialog_resolves", "hn_generalized_in_dialog"})


def _surface(text: str, ctx: _Ctx, switch_ok: bool = True) -> tuple[str, list[str]]:
    """Surface variation of a turn, drawn alike for every category: lead-in, lower-casing, dropped '?'.

    Topic-switch lead-ins ("Unrelated, but") go on every category except rows whose label says the
    dialog resolves the turn."""
    rng, cfg, tags = ctx.rng, ctx.cfg, []
    if rng.random() < cfg.lead_in_prob:
        i = rng.randrange(len(LEAD_INS))
        if not switch_ok and LEAD_INS[i] in TOPIC_SWITCHES:
            allowed = [j for j, lead in enumerate(LEAD_INS) if lead not in TOPIC_SWITCHES]
            i = allowed[rng.randrange(len(allowed))]
        first = text[:1]
        rest = text if (text[:2].isupper() or text.startswith("I ")) else first.lower() + text[1:]
        text, _ = LEAD_INS[i] + rest, tags.append(f"lead{i}")
    if rng.random() < cfg.lowercase_prob:
        text, _ = text[:1].lower() + text[1:], tags.append("lc")
    if text.endswith("?") and rng.random() < cfg.drop_qmark_prob:
        text, _ = text[:-1], tags.append("noq")
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
    resolved by documents) must find it in the dialog."""
    prior = set().union(*(terms(m.content) for m in ex.messages[:-1])) if len(ex.messages) > 1 else set()
    method = ex.provenance.method
    if ex.category == "ambiguous_dialog":
        hidden = referent_terms(seed) if method == "ad_cut_before_referent" else set()
        hidden = hidden or terms(seed.rewrite or seed.last_turn) - terms(ex.last_turn)
        docs = set().union(*(terms(d.title + " " + d.text) for d in ex.documents)) if ex.documents else set()
        if not hidden:
            return "nothing is missing from the turn"
        if hidden & (prior | docs):
            return f"the missing referent {sorted(hidden & (prior | docs))} is in the context"
    elif (
        ex.category == "hard_negative"
        and method != "hn_documents_resolve"
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
    ) -> Example | None:
        if setting not in self.ctx.cfg.settings:
            return None
        tags: list[str] = []
        if surface:
            turn, tags = _surface(turn, self.ctx, switch_ok=method not in _DIALOG_RESOLVED)
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


def _want(ctx: _Ctx, method: str) -> int:
    return ctx.cfg.per_seed.get(method, 0)


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


def _dialog_rows(em: _Emitter, seed: SeedTurn, hosts: list[SeedTurn]) -> None:
    """hn_dialog_resolves / ad_cut_before_referent / ad_stitched from a non-standalone turn."""
    ctx = em.ctx
    if seed.is_standalone or not seed.rewrite:
        return
    anchored = anchored_referent(seed)
    ref = referent_terms(seed)
    anchor = find_anchor(seed.last_turn, seed.rewrite)
    if not anchored:
        ctx.skipped["dialog:referent_not_in_dialog"] += 1
        return
    if anchor is None:
        ctx.skipped["dialog:no_anchor_in_turn"] += 1
        return
    history = seed.messages[:-1]
    if _want(ctx, "hn_dialog_resolves"):
        em.both(
            "hn_dialog_resolves",
            history,
            seed.last_turn,
            _docs(seed.documents, ctx),
            resolution=seed.rewrite,
            template=f"anchor.{anchor.kind}",
        )
    if _want(ctx, "ad_cut_before_referent"):
        cut = _cut_dialog(history, ref)
        docs = _referent_free_docs(seed, ref, len(cut), ctx)
        clar, tmpl = clarify_dialog(anchor, ctx.rng)
        em.both("ad_cut_before_referent", cut, seed.last_turn, docs, clarification=clar, template=tmpl)
    if anchor.kind == "ellipsis":
        return  # "what about bicycles?" after another topic is a new question, not a missing referent
    for _ in range(_want(ctx, "ad_stitched")):
        host = _pick_host(seed, ref, anchor, hosts, ctx)
        if host is None:
            ctx.skipped["ad_stitched:no_host"] += 1
            break
        clar, tmpl = clarify_dialog(anchor, ctx.rng)
        docs = host.documents if not any(mentions_any(d.title + " " + d.text, ref) for d in host.documents) else []
        em.both("ad_stitched", host.messages[:-1], seed.last_turn, _docs(docs, ctx), clarification=clar, template=tmpl)


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


def _pick_host(
    seed: SeedTurn,
    avoid_terms: set[str],
    anchor: Anchor | None,
    hosts: list[SeedTurn],
    ctx: _Ctx,
    avoid: Sequence[Entity] = (),
) -> SeedTurn | None:
    """Another conversation's dialog (>= 2 messages) that mentions neither the referent nor the anchor noun."""
    avoid_terms = set(avoid_terms)
    if anchor is not None and anchor.kind == "noun":
        avoid_terms |= terms(anchor.text)
    other_domain = ctx.cfg.stitch_other_domain and (anchor is None or anchor.kind != "noun")
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


def sense_cues(question: str, family: Sequence[Entity], docs_by_title: dict[str, list[Document]]) -> set[str]:
    """Terms of a loose question that only one entity of its family uses (in its documents or its name).

    "How hot does the surface of Mercury get?" keeps "surface", which only the planet's passages use:
    the question has lost its disambiguator but still says which Mercury it means, so it is no
    ambiguous row (before retrieval or after)."""
    names = set().union(*(terms(e.head) for e in family))
    vocab = [
        terms(" ".join([e.modifier, *(d.title + " " + d.text for d in docs_by_title.get(e.title, []))])) for e in family
    ]
    return {t for t in terms(question) - names if sum(t in v for v in vocab) == 1}


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


def _generalized_entity_rows(
    em: _Emitter, seed: SeedTurn, hosts: list[SeedTurn], entity: Entity, question: str
) -> None:
    ctx = em.ctx
    det = _DETERMINERS[ctx.rng.randrange(len(_DETERMINERS))]
    loose = generalize(question, entity, det)
    if loose is None or len(words(loose)) < 3:
        ctx.skipped["generalize:failed"] += 1
        return
    group = ctx.groups.get(entity.key, {})
    siblings = [e for k, e in sorted(group.items()) if k != entity.modifier.lower()]
    family = [entity, *siblings]
    history = seed.messages[:-1]
    noun_anchor = Anchor("noun", entity.head, _context(loose, words(entity.head)[-1]))
    gen = f"gen.{entity.kind}.{det}"
    # a loose question whose other words still pick one entity of the family makes no ambiguous row
    cued = bool(siblings and sense_cues(loose, family, ctx.docs_by_title))
    if cued:
        ctx.skipped["generalize:sense_cue"] += 1

    # hard negative: the dialog named this entity and no sibling, so the loose question is resolved
    named = [e for e in family if any(e.mentioned_in(m.content) for m in history)]
    others = {t.modifier.lower() for m in history for t in text_entities(m.content) if t.key == entity.key}
    if _want(ctx, "hn_generalized_in_dialog") and named == [entity] and others <= {entity.modifier.lower()}:
        em.both(
            "hn_generalized_in_dialog", history, loose, _docs(seed.documents, ctx), resolution=question, template=gen
        )
    # ambiguous in the dialog: nothing before the loose question names any entity of the family
    hidden = set().union(*(e.modifier_terms() for e in family))
    unpinned = _cut_dialog(history, hidden, family)
    if _want(ctx, "ad_generalized_unpinned") and not cued:
        if siblings and ctx.rng.random() < 0.4:
            labels = [e.label for e in family[: ctx.cfg.max_interpretations]]
            ctx.rng.shuffle(labels)
            clar, tmpl = clarify_documents(labels, ctx.rng, retrieved=False)
        else:
            labels, (clar, tmpl) = [], clarify_dialog(noun_anchor, ctx.rng)
        em.emit(
            "ad_generalized_unpinned",
            "pre_retrieval",
            unpinned,
            loose,
            clarification=clar,
            interpretations=labels,
            template=f"{gen}.{tmpl}",
        )
    if _want(ctx, "ad_stitched") and not cued and ctx.rng.random() < 0.5:
        host = _pick_host(seed, entity.modifier_terms(), noun_anchor, hosts, ctx, avoid=family)
        if host is not None:
            clar, tmpl = clarify_dialog(noun_anchor, ctx.rng)
            docs = [d for d in host.documents if not mentions_any(d.title + " " + d.text, hidden)]
            docs = docs if len(docs) == len(host.documents) else []
            em.both(
                "ad_stitched", host.messages[:-1], loose, _docs(docs, ctx), clarification=clar, template=f"{gen}.{tmpl}"
            )
    own_docs = [d for d in seed.documents if d.title == entity.title] if entity.title else []
    mine = (own_docs or ctx.docs_by_title.get(entity.title, []))[:2] if entity.title else []
    if not siblings or not mine:
        return
    # post-retrieval: one entity's documents resolve the loose question; several make it ambiguous.
    # It follows the seed's own cut dialog, or another conversation's (a topic switch), so that the
    # row's position in a dialog says nothing about its label
    placed = unpinned
    if ctx.rng.random() < ctx.cfg.switch_prob:
        host = _pick_host(seed, hidden, Anchor("noun", entity.head), hosts, ctx, avoid=family)
        placed = host.messages[:-1] if host is not None else unpinned
    if _want(ctx, "hn_documents_resolve"):
        em.emit(
            "hn_documents_resolve",
            "post_retrieval",
            placed,
            loose,
            documents=_docs(mine, ctx),
            resolution=question,
            template=gen,
        )
    for i in range(max(_want(ctx, "adoc_entity_collision"), _want(ctx, "clear_specific_docs"))):
        k = ctx.rng.randint(2, min(ctx.cfg.max_interpretations, len(family)))
        chosen = [entity, *ctx.rng.sample(siblings, k - 1)]
        per = max(1, ctx.cfg.max_documents // k)
        docs: list[Document] = []
        covered: list[Entity] = []
        for e in chosen:
            eds = (mine if e is entity else ctx.docs_by_title.get(e.title, []))[:per]
            if eds:
                docs.extend(eds)
                covered.append(e)
        if len(covered) < 2:
            ctx.skipped["adoc:sibling_without_documents"] += 1
            continue
        ctx.rng.shuffle(docs)
        labels = [e.label for e in covered]
        ctx.rng.shuffle(labels)
        shown: dict[str, list[Document]] = defaultdict(list)
        for d in docs:
            shown[d.title].append(d)
        if i < _want(ctx, "adoc_entity_collision") and not cued and not sense_cues(loose, covered, shown):
            clar, tmpl = clarify_documents(labels, ctx.rng)
            em.emit(
                "adoc_entity_collision",
                "post_retrieval",
                placed,
                loose,
                documents=docs,
                clarification=clar,
                interpretations=labels,
                template=f"{gen}.{tmpl}",
            )
        if i < _want(ctx, "clear_specific_docs"):
            em.emit(
                "clear_specific_docs",
                "post_retrieval",
                placed,
                question,
                documents=docs,
                template=f"specific.{entity.kind}",
            )


def construct(
    seeds: list[SeedTurn], cfg: ConstructConfig, *, rng: random.Random
) -> tuple[list[Example], Rejects, dict[str, Any]]:
    """Build examples of all four categories from `seeds`; deterministic given `rng`'s state."""
    seeds = sorted(seeds, key=lambda s: (s.conversation_id, s.turn))
    by_conv: dict[str, list[SeedTurn]] = defaultdict(list)
    for s in seeds:
        by_conv[s.conversation_id].append(s)
    groups, docs_by_title = _build_entities(seeds)
    ctx = _Ctx(seeds=seeds, cfg=cfg, rng=rng, by_conv=by_conv, groups=groups, docs_by_title=docs_by_title)
    hosts = [s for s in seeds if len(s.messages) >= 2]
    ctx.doc_hosts = [s for s in hosts if s.documents]
    out: list[Example] = []
    for seed in seeds:
        if len(words(seed.last_turn)) > cfg.max_turn_words:
            ctx.skipped["seed:too_long"] += 1
            continue
        em = _Emitter(ctx, seed, out)
        _clear_rows(em, seed)
        _dialog_rows(em, seed, hosts)
        _generalized_rows(em, seed, hosts)
    rows = _dedup(out, ctx)
    if cfg.length_match:
        rows = _length_match(rows, ctx)
    rows.sort(key=lambda e: (e.conversation_id, e.provenance.seed_id, e.category, e.setting, e.id))
    stats = _stats(rows, ctx, len(seeds), cfg)
    return rows, ctx.rejects, stats


_LENGTH_BINS = (0, 4, 6, 8, 10, 12, 15, 19, 25, 10_000)


def _length_bin(text: str) -> int:
    n = len(words(text))
    return next(i for i, edge in enumerate(_LENGTH_BINS[1:]) if n <= edge)


def _length_match(rows: list[Example], ctx: _Ctx) -> list[Example]:
    """Thin out clear rows (seeded) where their last-turn length is over-represented against the other
    categories, so that length alone says little about the label."""
    clear = [r for r in rows if r.category == "clear"]
    other = [r for r in rows if r.category != "clear"]
    if not clear or not other:
        return rows
    c_hist = Counter(_length_bin(r.last_turn) for r in clear)
    o_hist = Counter(_length_bin(r.last_turn) for r in other)
    ratio = {b: (o_hist[b] / len(other)) / (c_hist[b] / len(clear)) for b in c_hist}
    drop: set[str] = set()
    for r in sorted(clear, key=lambda e: e.id):
        if ctx.rng.random() >= ratio[_length_bin(r.last_turn)] * ctx.cfg.length_match_slack:
            drop.add(r.id)
    ctx.skipped["length_matched_out"] += len(drop)
    return [r for r in rows if r.id not in drop]


def _dedup(rows: list[Example], ctx: _Ctx) -> list[Example]:
    seen: dict[str, Example] = {}
    for r in rows:
        if r.id in seen:
            ctx.skipped["duplicate_id"] += 1
            continue
        seen[r.id] = r
    return list(seen.values())


# =============================================================================================
# Stats and the shallow-separability report
# =============================================================================================
def _stats(rows: list[Example], ctx: _Ctx, n_seeds: int, cfg: ConstructConfig) -> dict[str, Any]:
    cells = Counter(f"{r.category}/{r.setting}" for r in rows)
    by_seed: dict[str, set[str]] = defaultdict(set)
    for r in rows:
        by_seed[r.provenance.seed_id].add(r.category)
    amb = [r for r in rows if r.needs_clarification]
    paired = sum(1 for r in amb if "hard_negative" in by_seed[r.provenance.seed_id])
    stats: dict[str, Any] = {
        "seeds": n_seeds,
        "rows": len(rows),
        "by_category_setting": dict(sorted(cells.items())),
        "by_category": dict(sorted(Counter(r.category for r in rows).items())),
        "by_method": dict(sorted(Counter(r.provenance.method or "" for r in rows).items())),
        "skipped": dict(sorted(ctx.skipped.items())),
        "entity_groups": len(ctx.groups),
        "ambiguous_paired_with_hard_negative": round(paired / len(amb), 4) if amb else 0.0,
        "last_turn_words_mean": {
            c: round(
                sum(len(words(r.last_turn)) for r in rows if r.category == c)
                / max(1, sum(1 for r in rows if r.category == c)),
                2,
            )
            for c in CATEGORIES
        },
    }
    stats.update(ctx.rejects.counts())
    if cfg.separability:
        stats["shallow_separability"] = shallow_separability(rows, folds=cfg.separability_folds)
    return stats


def shallow_separability(rows: Sequence[Example], folds: int = 5) -> dict[str, Any]:
    """How well a bag-of-words logistic regression on the LAST TURN ALONE tells each category from the rest.

    Out-of-fold ROC AUC with folds grouped by conversation (0.5 = chance, 1.0 = a telltale artifact),
    per category (one vs rest), for the binary decision `needs_clarification`, and the same for the
    last turn's length alone and for its position (messages before it) alone, where artifacts show.
    """
    import numpy as np
    from sklearn.feature_extraction.text import CountVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    from sklearn.model_selection import GroupKFold

    texts = [r.last_turn for r in rows]
    groups = [r.conversation_id for r in rows]
    n_groups = len(set(groups))
    if n_groups < 2 or len(rows) < 10:
        return {"note": "too few rows or conversations"}
    k = min(folds, n_groups)
    lengths = np.array([len(words(t)) for t in texts], dtype=float)
    positions = np.array([len(r.messages) for r in rows], dtype=float)
    targets = {c: np.array([r.category == c for r in rows]) for c in CATEGORIES}
    targets["needs_clarification"] = np.array([r.needs_clarification for r in rows])
    bow: dict[str, float | None] = {}
    position: dict[str, float | None] = {}
    length: dict[str, float | None] = {}
    splits = list(GroupKFold(n_splits=k).split(texts, groups=groups))
    for name, y in targets.items():
        if y.sum() < k or (~y).sum() < k:
            bow[name] = length[name] = position[name] = None
            continue
        oof = np.zeros(len(rows))
        for train, test in splits:
            if len(set(y[train])) < 2:
                oof[test] = y[train].mean()
                continue
            vec = CountVectorizer(lowercase=True, token_pattern=r"(?u)\b\w+\b", ngram_range=(1, 2), binary=True)
            x_train = vec.fit_transform([texts[i] for i in train])
            clf = LogisticRegression(max_iter=2000, C=1.0)
            clf.fit(x_train, y[train])
            oof[test] = clf.predict_proba(vec.transform([texts[i] for i in test]))[:, 1]
        bow[name] = round(float(roc_auc_score(y, oof)), 4)
        auc_len = float(roc_auc_score(y, lengths))
        length[name] = round(max(auc_len, 1 - auc_len), 4)
        auc_pos = float(roc_auc_score(y, positions))
        position[name] = round(max(auc_pos, 1 - auc_pos), 4)
    return {
        "metric": "roc_auc_oof_grouped",
        "folds": k,
        "bow_last_turn": bow,
        "length_only": length,
        "position_only": position,
    }
