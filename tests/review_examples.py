"""Small Example rows of all four categories for the review tests (inline, no data files needed)."""

from __future__ import annotations

from clariedge.schema import Document, Example, Message, Provenance

PLANS = ("Basic", "Pro", "Team", "Enterprise", "Starter", "Plus", "Max", "Edu")


def make_examples(n: int, *, domain: str = "cloud") -> list[Example]:
    """`n` distinct examples cycling through the four categories and both settings."""
    rows: list[Example] = []
    for i in range(n):
        a, b = PLANS[i % len(PLANS)], PLANS[(i + 3) % len(PLANS)]
        kind = i % 4
        prov = Provenance(generator="construct", method=f"m{kind}", seed_id=f"conv-{i}::2", score=0.5 + (i % 5) / 10)
        docs = [
            Document(doc_id=f"doc-{i}-a", title=f"{a} plan", text=f"The **{a}** plan costs {10 + i} USD a month."),
            Document(doc_id=f"doc-{i}-b", title=f"{b} plan", text=f"The {b} plan costs {20 + i} USD a month."),
        ]
        if kind == 0:
            msgs = [
                Message(role="user", content=f"I'm comparing the {a} and the {b} plan (#{i})."),
                Message(role="assistant", content=f"{a} has 10 GB, {b} has 100 GB."),
                Message(role="user", content="and how much does it cost?"),
            ]
            ex = Example(
                conversation_id=f"conv-{i}",
                domain=domain,
                setting="pre_retrieval",
                category="ambiguous_dialog",
                messages=msgs,
                needs_clarification=True,
                clarification=f"Do you mean the {a} plan or the {b} plan?",
                provenance=prov,
            )
        elif kind == 1:
            msgs = [Message(role="user", content=f"How much is the plan? (#{i})")]
            ex = Example(
                conversation_id=f"conv-{i}",
                domain=domain,
                setting="post_retrieval",
                category="ambiguous_documents",
                messages=msgs,
                documents=docs,
                needs_clarification=True,
                clarification=f"Which plan do you mean: {a} or {b}?",
                provenance=prov,
            )
        elif kind == 2:
            msgs = [Message(role="user", content=f"What does the {a} plan cost per month? (#{i})")]
            ex = Example(
                conversation_id=f"conv-{i}",
                domain=domain,
                setting="post_retrieval",
                category="clear",
                messages=msgs,
                documents=docs[:1],
                needs_clarification=False,
                provenance=prov,
            )
        else:
            msgs = [
                Message(role="user", content=f"Tell me about the {a} plan (#{i})."),
                Message(role="assistant", content=f"{a} has 10 GB of storage."),
                Message(role="user", content="does it support JSON export?"),
            ]
            ex = Example(
                conversation_id=f"conv-{i}",
                domain=domain,
                setting="pre_retrieval",
                category="hard_negative",
                messages=msgs,
                needs_clarification=False,
                resolution=f"Does the {a} plan support JSON export?",
                provenance=prov,
            )
        rows.append(ex)
    return rows
