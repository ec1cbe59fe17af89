"""Test helpers for clean/publish: Example rows from real MTRAG seed turns, tiny inline rows, label flips.

Real rows (`mtrag_examples`): a standalone turn with its dialog is `clear`; a turn whose human rewrite
differs (it leans on the dialog, and the dialog resolves it) is a `hard_negative`; the same turn moved
onto the history of another conversation (topic switch: nothing there resolves it) is
`ambiguous_dialog`, with the other conversation's id, the way the construct backend stitches rows.
Turns with passages also get a post-retrieval copy. Simple, but the labels are right by construction,
so planted flips are the only label errors.
"""

from __future__ import annotations

import random
from pathlib import Path

from clariedge.schema import AMBIGUOUS, Annotation, Document, Example, Message, Provenance, SeedTurn

QUESTIONS = (
    "Which one do you mean: {a}?",
    "Could you say what '{t}' refers to?",
    "Are you asking about {a}, or something else?",
    "What exactly should I look up for '{t}'?",
)


def _prov(seed_id: str, method: str) -> Provenance:
    return Provenance(
        generator="construct",
        method=method,
        seed_id=seed_id,
        template="test",
        prompt_id="construct",
        prompt_version="0",
    )


def _settings(seed: SeedTurn) -> list[tuple[str, list]]:
    out = [("pre_retrieval", [])]
    if seed.documents:
        out.append(("post_retrieval", seed.documents[:3]))
    return out


def mtrag_examples(mtrag_dir: Path, *, limit: int | None = None, seed: int = 0) -> list[Example]:
    """Example rows (clear / hard_negative / ambiguous_dialog) built from the real MTRAG files."""
    from clariedge.ingest import transform

    seeds, _, _ = transform([mtrag_dir])
    rng = random.Random(seed)
    by_conv: dict[str, list[SeedTurn]] = {}
    for s in seeds:
        by_conv.setdefault(s.conversation_id, []).append(s)
    convs = sorted(by_conv)
    rows: list[Example] = []
    for s in seeds:
        category = "clear" if s.is_standalone else "hard_negative"
        for setting, docs in _settings(s):
            rows.append(
                Example(
                    conversation_id=s.conversation_id,
                    domain=s.domain,
                    setting=setting,
                    category=category,
                    messages=s.messages,
                    documents=docs,
                    needs_clarification=False,
                    resolution=None if s.is_standalone else s.rewrite,
                    provenance=_prov(s.id, category),
                )
            )
        if s.is_standalone:
            continue
        other = by_conv[rng.choice([c for c in convs if c != s.conversation_id])]
        host = rng.choice(other)
        history = host.messages[:-1] or host.messages  # end with a user turn is re-added below
        msgs = [*history[-4:], Message(role="user", content=s.last_turn)]
        if msgs[0].role != "user" and len(msgs) > 1 and msgs[-2].role == "user":
            msgs = msgs[1:]
        if len(msgs) >= 2 and msgs[-2].role == "user":  # keep alternation: drop a trailing user message
            msgs = [*msgs[:-2], msgs[-1]]
        q = rng.choice(QUESTIONS).format(t=s.last_turn[:40], a=s.rewrite or "the earlier topic")
        rows.append(
            Example(
                conversation_id=host.conversation_id,
                domain=host.domain,
                setting="pre_retrieval",
                category="ambiguous_dialog",
                messages=msgs,
                needs_clarification=True,
                clarification=q,
                interpretations=[s.rewrite or s.last_turn],
                provenance=_prov(s.id, "ambiguous_dialog"),
            )
        )
    rows = sorted({r.id: r for r in rows}.values(), key=lambda r: r.id)
    if limit is not None and len(rows) > limit:
        rows = sorted(random.Random(seed).sample(rows, limit), key=lambda r: r.id)
    return rows


def flip(ex: Example, rng: random.Random) -> Example:
    """The same row with needs_clarification flipped, kept schema-valid (what a bad label source does)."""
    data = ex.model_dump()
    if ex.category in AMBIGUOUS:
        data.update(
            category=rng.choice(["clear", "hard_negative"]),
            needs_clarification=False,
            clarification=None,
            interpretations=[],
            id="",
        )
    else:
        data.update(
            category="ambiguous_dialog",
            needs_clarification=True,
            clarification=rng.choice(QUESTIONS).format(t=ex.last_turn[:40], a="the other one"),
            id="",
        )
    return Example.model_validate(data)


def plant_flips(rows: list[Example], fraction: float, seed: int) -> tuple[list[Example], set[str]]:
    """Flip `fraction` of the rows' needs_clarification; returns the rows and the flipped rows' ids."""
    rng = random.Random(seed)
    k = round(fraction * len(rows))
    picked = set(rng.sample(range(len(rows)), k))
    out, flipped = [], set()
    for i, ex in enumerate(rows):
        if i in picked:
            ex = flip(ex, rng)
            flipped.add(ex.id)
        out.append(ex)
    return out, flipped


def plant_broken_category(
    rows: list[Example], category: str, fraction: float, seed: int
) -> tuple[list[Example], set[str]]:
    """Break `fraction` of one category's rows as a whole the way the audit of issue 15 found
    ambiguous_documents: the turn's own words name its topic ("What does the visa cover?") while the
    row keeps its "ask" label and question. For rows with documents (the tiny rows' `All about the X.`);
    returns the rows and the broken rows' (new) ids."""
    rng = random.Random(seed)
    members = [i for i, ex in enumerate(rows) if ex.category == category and ex.documents]
    picked = set(rng.sample(members, round(fraction * len(members))))
    out, broken = [], set()
    for i, ex in enumerate(rows):
        if i in picked:
            doc = ex.documents[-1]
            topic = (
                doc.text.removeprefix("All about the ").rstrip(".") if doc.text.startswith("All about") else doc.title
            )
            data = ex.model_dump()
            data["messages"][-1]["content"] = f"What does the {topic} cover?"
            ex = Example.model_validate({**data, "id": ""})
            broken.add(ex.id)
        out.append(ex)
    return out, broken


WORDS = (
    "plan",
    "router",
    "tax form",
    "visa",
    "loan",
    "library card",
    "storage bucket",
    "pension",
    "permit",
    "database",
    "refund",
    "passport",
)


def tiny_examples(n_conversations: int = 40, seed: int = 0) -> list[Example]:
    """Inline rows of all four categories in both settings, several per conversation (no files needed)."""
    rng = random.Random(seed)
    rows: list[Example] = []
    for c in range(n_conversations):
        conv = f"conv{c:03d}"
        a, b = rng.sample(WORDS, 2)
        hist = [
            Message(role="user", content=f"Tell me about the {a} and the {b}."),
            Message(role="assistant", content=f"The {a} and the {b} differ in cost and terms."),
        ]
        docs = [
            Document(doc_id=f"{conv}-d1", title=f"{a.title()} basics", text=f"All about the {a}."),
            Document(doc_id=f"{conv}-d2", title=f"{b.title()} basics", text=f"All about the {b}."),
        ]
        prov = _prov(f"{conv}::2", "tiny")
        specs = [
            ("clear", "pre_retrieval", [], f"How long does the {a} take to renew?", None),
            ("hard_negative", "pre_retrieval", [], f"And the {b}, does it cost more?", None),
            ("ambiguous_dialog", "pre_retrieval", [], "How much does it cost?", f"Do you mean the {a} or the {b}?"),
            ("clear", "post_retrieval", docs, f"What does the {a} cover?", None),
            ("ambiguous_documents", "post_retrieval", docs, "What are the terms?", f"The {a} or the {b} terms?"),
        ]
        for cat, setting, d, turn, q in rng.sample(specs, rng.randint(2, len(specs))):
            rows.append(
                Example(
                    conversation_id=conv,
                    domain=rng.choice(["govt", "cloud"]),
                    setting=setting,
                    category=cat,
                    messages=[*hist, Message(role="user", content=turn)],
                    documents=d,
                    needs_clarification=cat in AMBIGUOUS,
                    clarification=q,
                    provenance=prov,
                )
            )
    return sorted(rows, key=lambda r: r.id)


def annotate(rows: list[Example], annotators: dict[str, float], seed: int, per_row: int = 3) -> list[Example]:
    """Give each row `per_row` submitted annotations from annotators with the given error rates."""
    rng = random.Random(seed)
    names = sorted(annotators)
    out = []
    for ex in rows:
        anns = []
        for name in sorted(rng.sample(names, min(per_row, len(names)))):
            wrong = rng.random() < annotators[name]
            needs = ex.needs_clarification != wrong
            anns.append(
                Annotation(
                    annotator=name,
                    status="submitted",
                    needs_clarification=needs,
                    clarification=(ex.clarification or "Which one do you mean?") if needs else None,
                )
            )
        out.append(ex.model_copy(update={"annotations": anns}))
    return out
