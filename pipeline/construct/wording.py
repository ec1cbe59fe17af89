"""Wording banks of clarifications and lead-ins (ids are recorded in `provenance.template`)."""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence

from clariedge.construct.entities import Entity
from clariedge.construct.text import Anchor, stem
from clariedge.schema import Document

CLARIFY: dict[str, list[str]] = {
    "noun": [
        "Which {noun} do you mean?",
        "Which {noun} are you asking about?",
        "Could you tell me which {noun} you have in mind?",
        "Which {noun} are you referring to?",
        "Which {noun} is this about?",
        "Which {noun} are you talking about here?",
        "Which {noun} is your question about?",
        "Sorry, which {noun}?",
        "What {noun} do you mean?",
        "What {noun} are you asking about?",
    ],
    # a definite noun whose owner is what is missing ("the faster option" of what?): ask for the owner, not "which
    # option" (text.owner_left_out), naming the phrase and nothing the user did not say. Graded weak or bad in blind
    # readings: "Which product are you asking about?" for "the lag" after a cooking chat, "Which plan do you mean? I
    # need it to look up the faster option." (2026-12-05); "Which instance's zone do you mean?" and "Which plan's
    # faster option do you mean?", a kind taken from the hidden rewrite (2026-12-06); "Sorry, the margin of what?"
    # read as weak (4 of 9 weak questions, 2026-12-06), and so did "I'm not sure what the zone refers to here. Could
    # you say a bit more?" (4 of 5, the same day): ask what the phrase means, in the user's own words
    "owner": [
        "What do you mean by the {phrase}?",
        "When you say the {phrase}, what do you mean?",
        "Could you say what you mean by the {phrase}?",
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
        "Is it {a} or {b} you're asking about?",
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
        "There are several possibilities: {list}. Which one do you mean?",
        "I found a few possibilities: {list}. Which do you mean?",
        "There are several matches: {list}. Which one should I answer about?",
        "The passages mention {list}. Could you narrow it down?",
    ],
}
# how a user asks to compare two things of one kind (`compare.two_candidate_rows`); {a}, {b}: their plain names
COMPARE = [
    "what's the difference between {a} and {b}?",
    "how do {a} and {b} compare?",
    "can you tell me about {a} and {b}?",
    "could you compare {a} with {b} for me?",
    "what are the main differences between {a} and {b}?",
    "tell me a bit about {a} and {b}, please",
    "how is {a} different from {b}?",
]
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


def shared_tail(labels: Sequence[str]) -> list[str]:
    """Labels that differ only before a common tail, said once: "the child passport renewal", "the adult
    passport renewal" -> "the child", "the adult passport renewal" (to join with "or" / "and"); else as given."""
    split = [label.split() for label in labels]
    if len(split) < 2 or any(len(ws) < 3 or ws[0] != "the" for ws in split):
        return list(labels)
    n = 0
    while all(len(ws) - n > 2 for ws in split) and len({ws[-1 - n] for ws in split}) == 1:
        n += 1
    if n == 0 or any(not w.isalpha() for w in split[0][-n:]):
        return list(labels)
    return [" ".join(ws[:-n]) for ws in split[:-1]] + [labels[-1]]


def _listing(labels: Sequence[str], short: Sequence[str]) -> dict[str, str]:
    """The list slots of a template: every label whole, or joined with "or"/"and" with a shared tail said once."""
    body = ", ".join(short[:-1])
    return {
        "list": ", ".join(labels),
        "or_list": f"{body} or {short[-1]}",
        "and_list": f"{body} and {short[-1]}",
    }


_SINGULAR_ONLY = re.compile(r"\ba (?:specific )?\{noun\}|Which one|\{noun\} is (?:this|your question)", re.I)
# templates that count the noun ("which lag", "a money"): not for a noun that names a mass
_COUNTS = re.compile(r"\b(?:which|a) (?:specific )?\{noun\}|which one", re.I)
# nouns that name a mass or an activity, not one of several things: "the lag", "the money"
MASS_NOUNS = frozenset(
    [
        "advice",
        "baggage",
        "cash",
        "damage",
        "equipment",
        "evidence",
        "feedback",
        "furniture",
        "homework",
        "information",
        "lag",
        "luggage",
        "maintenance",
        "money",
        "pay",
        "research",
        "software",
        "storage",
        "traffic",
        "weather",
    ]
)


def pick(rng: random.Random, n: int) -> int:
    """An index in range(n) from exactly one draw of `rng`, whatever n is: a wording bank that grows or shrinks
    changes the wording it picks, not every random choice made after it (hosts, surface forms, thinning)."""
    return min(int(rng.random() * n), n - 1)


def _plural(noun: str) -> bool:
    return noun.lower().endswith("s") and stem(noun) != noun.lower()


def _fits(template: str, anchor: Anchor) -> bool:
    """Whether a template's slots fit the anchor: its number, a mass noun, a quote that would read truncated, and
    a turn short enough to quote whole."""
    if anchor.kind == "noun" and not anchor.owner:
        noun = anchor.text.lower()
        if _plural(noun) and _SINGULAR_ONLY.search(template):
            return False
        if noun in MASS_NOUNS and _COUNTS.search(template):
            return False
    if anchor.text.endswith("...") and "{fragment}" in template:
        return False  # a fragment of a longer turn is never quoted (it reads as a truncated quote)
    return bool(anchor.context) or "{context}" not in template  # the whole turn is quoted, or nothing


def clarify_dialog(anchor: Anchor, rng: random.Random) -> tuple[str, str]:
    """A clarification asking for what `anchor` leaves open, in a template that fits it."""
    kind = "owner" if anchor.owner else anchor.kind
    bank = CLARIFY[kind]
    allowed = [i for i, t in enumerate(bank) if _fits(t, anchor)]
    i = allowed[pick(rng, len(allowed))]
    text = bank[i].format(
        noun=anchor.text,
        anchor=anchor.text,
        fragment=anchor.text,
        context=anchor.context,
        phrase=anchor.owner,
    )
    text = re.sub(r"\b([Aa]) (?=[aeiouAEIOU])", r"\1n ", text)  # "a adjudicator" -> "an adjudicator"
    return _cap(text), f"clarify.{kind}.{i}"


_MENTIONS_RETRIEVAL = re.compile(r"\b(documents?|passages?|found|matches|information on)\b", re.I)


def clarify_documents(labels: Sequence[str], rng: random.Random, retrieved: bool = True) -> tuple[str, str]:
    """A clarification naming the interpretations; without documents, one that does not cite any."""
    size = "two" if len(labels) == 2 else "few" if len(labels) == 3 else "many"
    bank = CLARIFY_DOCS[size]
    allowed = [i for i, t in enumerate(bank) if retrieved or not _MENTIONS_RETRIEVAL.search(t)]
    i = allowed[pick(rng, len(allowed))]
    short = shared_tail(labels)
    a, b = short[:2] if len(labels) == 2 else labels[:2]
    text = bank[i].format(a=a, b=b, **_listing(labels, short))
    return _cap(text), f"clarify_docs.{size}.{i}"


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:] if text else text


def _is_common_noun(name: str, docs_by_title: Mapping[str, Sequence[Document]]) -> bool:
    """Whether a title's name is a common noun ("Building permit", "Mortgage"): the passages write it in lower
    case more often than capitalised inside a sentence ("Mercury", "Python" stay names)."""
    if name.islower():
        return True
    text = " ".join(d.text for docs in docs_by_title.values() for d in docs)
    low = name[:1].lower() + name[1:]
    n_low = len(re.findall(rf"\b{re.escape(low)}\b", text))
    n_cap = len(re.findall(rf"(?<![.?!:]\s)(?<!^)\b{re.escape(name[:1].upper() + name[1:])}\b", text))
    return n_low > n_cap


def display_head(entity: Entity, docs_by_title: Mapping[str, Sequence[Document]]) -> str:
    """The shared name as running text writes it: "building permit", but "Mercury", "Cardinals"."""
    if entity.kind == "paren" and _is_common_noun(entity.head, docs_by_title):
        return entity.head[:1].lower() + entity.head[1:]
    return entity.head


def plain_label(entity: Entity, docs_by_title: Mapping[str, Sequence[Document]]) -> str:
    """An interpretation named in plain words, never a title with its parentheses.

    "Mercury (planet)" -> "the planet", "Mercury (mythology)" -> "Mercury in mythology",
    "Cardinals (St. Louis, MLB)" -> "the St. Louis Cardinals (MLB)", "IRA (Roth)" -> "the Roth IRA",
    "Object Storage (Archive plan)" -> "the Archive plan", "Mortgage (fixed-rate)" -> "the fixed-rate mortgage",
    "Form 1099 (DIV)" -> "Form 1099-DIV"; suffix entities keep their label ("the Penobscot River")."""
    if entity.kind != "paren":
        return entity.label
    head, dis = entity.head, entity.modifier
    first, _, rest = (p.strip() for p in dis.partition(","))
    if rest:
        return f"the {first} {head} ({rest})"
    if head.split()[-1][:1].isdigit():
        return f"{head}-{dis}"
    common = _is_common_noun(head, docs_by_title)
    shown = head[:1].lower() + head[1:] if common else head
    if dis.endswith("ology"):
        return f"{shown} in {dis}"
    if re.fullmatch(r"[A-Za-z]{0,3}\d[\w.]*", dis):
        return f"{shown} {dis}"  # a version or code: "nimbus CLI v2"
    class_noun = any(w[:1].islower() for w in dis.split()) and (not common or (" " not in head and "-" not in dis))
    if class_noun:
        return f"the {dis}"  # a class noun for a proper name: "the planet", "the U.S. state", "the car maker"
    if dis.split()[-1].lower() in ("plan", "tier", "version", "edition") or stem(dis.split()[-1]) == stem(
        head.split()[-1]
    ):
        return f"the {dis}"
    return f"the {dis} {shown}"
