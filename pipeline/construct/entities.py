"""Entities from document titles (`Head (Disambiguator)`, `Modifier Head`) and from running text, and the
generalisation that removes what distinguishes one ("How long is the Penobscot River?" -> "How long is the river?")."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from clariedge.construct.text import _DETERMINERS, _POSSESSIVES, stem, terms
from clariedge.schema import Document, SeedTurn
from clariedge.text import STOP, words, wordset

GENERIC_HEADS = wordset(
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
_HEADS = "|".join(sorted(GENERIC_HEADS, key=len, reverse=True))
_HEAD_AFTER = re.compile(rf"\s+(?i:{_HEADS})s?\b")  # a head right after another: "book club sets"
_LEX_MENTION = re.compile(rf"\b(?P<mod>{_CAP}(?:\s+{_CAP})*)\s+(?P<head>(?i:{_HEADS})s?)\b")


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
        if _HEAD_AFTER.match(after):
            continue  # the head modifies another: "Hensby Libraries' book club sets" is no book ("Which book?", bad)
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


def class_noun(entity: Entity) -> str | None:
    """The class a title's disambiguator names ("planet", "programming language", "U.S. state"), else None
    (names and qualifiers: "Arizona, NFL", "fixed-rate", "Roth")."""
    dis, head = entity.modifier, entity.head
    if entity.kind != "paren" or "," in dis or "-" in dis or not any(w[:1].islower() for w in dis.split()):
        return None
    if " " in head or not head[:1].isupper():
        return None  # "Building permit (residential)": a qualifier of a common noun, not a class of a name
    return dis


def to_class(question: str, entity: Entity) -> str | None:
    """Replace the precise name by its class: "How far is the planet Mercury from the Sun?" -> "How far is the
    planet from the Sun?" (a member of a class left unnamed), or None when the question has no precise mention,
    names the entity elsewhere, or already uses the class noun."""
    cls = class_noun(entity)
    if cls is None or terms(cls) & terms(_strip_mentions(question, entity)):
        return None
    for pat in entity.patterns():
        m = pat.search(question)
        if not m or _inside_name(question[: m.start()]):
            continue
        before = words(question[: m.start()])[-1:]
        det = "" if before and before[0] in ("the", *_POSSESSIVES) else "the "
        out = re.sub(r"\s+", " ", question[: m.start()] + det + cls + question[m.end() :]).strip()
        if m.start() == 0 and question[:1].isupper():
            out = out[:1].upper() + out[1:]
        if terms(entity.head) & terms(out) or entity.mentioned_in(out):
            return None
        return out
    return None


def _strip_mentions(question: str, entity: Entity) -> str:
    for pat in entity.patterns():
        question = pat.sub(" ", question)
    return question
