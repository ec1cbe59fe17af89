"""Tests of the offline `construct` backend: coverage of categories x settings, labels consistent with
their evidence (no row contradicts its label), determinism, and the text operations it is built from."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
from conftest import params_section

from clariedge import ingest
from clariedge.construct import (
    METHODS,
    Anchor,
    Entity,
    SenseJudge,
    broken_name,
    construct,
    contradiction,
    entity_of_title,
    find_anchor,
    generalize,
    names_own_topic,
    plain_label,
    referent_terms,
    shallow_separability,
    still_named,
    terms,
    text_entities,
)
from clariedge.construct.reading import asks_something, drop_openers
from clariedge.construct.text import owner_left_out
from clariedge.construct.wording import CLARIFY, LEAD_INS, clarify_dialog, clarify_documents
from clariedge.io import write_records
from clariedge.schema import CATEGORIES, Document, Example, Message, SeedTurn, Source, asked_turn_id
from clariedge.text import words

# every method on, those params.yaml turns off included: the tests check each method's rows
FAST = params_section("synthesize.construct", separability=False, per_seed=dict.fromkeys(METHODS, 1))


@pytest.fixture(scope="module")
def sample_seeds(sample_dir: Path) -> list[SeedTurn]:
    seeds, _, _ = ingest.transform([sample_dir])
    return seeds


@pytest.fixture(scope="module")
def mtrag_seeds(mtrag_dir: Path) -> list[SeedTurn]:
    seeds, _, _ = ingest.transform([mtrag_dir])
    return seeds


@pytest.fixture(scope="module")
def sample_rows(sample_seeds: list[SeedTurn]) -> list[Example]:
    rows, _, _ = construct(sample_seeds, FAST, rng=random.Random(7))
    return rows


@pytest.fixture(scope="module")
def mtrag_rows(mtrag_seeds: list[SeedTurn]) -> list[Example]:
    rows, _, _ = construct(mtrag_seeds, FAST, rng=random.Random(7))
    return rows


# ---------------------------------------------------------------------------------------------
# Coverage: all four categories in both settings (ambiguous_documents post-retrieval only)
# ---------------------------------------------------------------------------------------------
def _cells(rows: list[Example]) -> set[tuple[str, str]]:
    return {(r.category, r.setting) for r in rows}


EXPECTED_CELLS = {(c, s) for c in CATEGORIES for s in ("pre_retrieval", "post_retrieval")} - {
    ("ambiguous_documents", "pre_retrieval")
}


def test_sample_covers_every_category_and_setting(sample_rows: list[Example]) -> None:
    assert _cells(sample_rows) == EXPECTED_CELLS
    assert 400 <= len(sample_rows) <= 3000  # every method on: 2,234 rows with data/sample_more added (2026-12-06)


def test_mtrag_covers_every_category_and_setting(mtrag_rows: list[Example]) -> None:
    assert _cells(mtrag_rows) == EXPECTED_CELLS


# ---------------------------------------------------------------------------------------------
# No row contradicts its label
# ---------------------------------------------------------------------------------------------
def _norm(text: str) -> str:
    return " ".join(text.lower().replace("?", "").split())


def _prior_terms(row: Example) -> set[str]:
    return set().union(*(terms(m.content) for m in row.messages[:-1])) if len(row.messages) > 1 else set()


def _doc_terms(row: Example) -> set[str]:
    return set().union(*(terms(d.title + " " + d.text) for d in row.documents)) if row.documents else set()


def check_labels(rows: list[Example], seeds: list[SeedTurn]) -> None:
    by_id = {s.id: s for s in seeds}
    assert rows, "no rows"
    for r in rows:
        prov = r.provenance
        where = f"{prov.method} {r.setting} {r.id}: {r.last_turn!r}"
        assert prov.generator == "construct", where
        assert METHODS[prov.method] == r.category, where
        assert prov.template, where
        seed = by_id[prov.seed_id]
        assert r.conversation_id == seed.conversation_id, where
        assert r.needs_clarification == (r.category in ("ambiguous_dialog", "ambiguous_documents")), where
        standalone = {_norm(q) for q in (seed.rewrite, seed.last_turn if seed.is_standalone else None) if q}
        if r.category == "clear":
            assert r.clarification is None and r.resolution is None, where
            # the turn is a human-written standalone question (up to a lead-in / case / final '?')
            assert any(_norm(r.last_turn).endswith(q) for q in standalone), where
        elif r.category == "hard_negative":
            assert r.clarification is None, where
            assert r.resolution and _norm(r.resolution) in standalone, where
            assert _norm(r.resolution) != _norm(r.last_turn), where
            hidden = terms(r.resolution) - terms(r.last_turn)
            if prov.method == "hn_turn_resolves":
                # the turn's own words pick one sense: judged by `checks.SenseJudge`, scored on the gold set
                assert ".cue" in r.provenance.template, where
            elif prov.method == "hn_documents_resolve":
                entities = {entity_of_title(d.title) for d in r.documents}
                assert len(entities) == 1 and None not in entities, where  # one reading only
                (entity,) = entities
                assert entity.mentioned_in(r.resolution), where
            else:  # the dialog supplies what the turn leaves out
                assert hidden & _prior_terms(r), where
        elif prov.method == "ad_as_written":
            # a writer's label: the row is the writer's variant after the seed's own dialog, with the writer's question
            assert seed.clarification and r.clarification == seed.clarification, where
            assert r.messages[:-1] == seed.messages[:-1] and _norm(r.last_turn).endswith(_norm(seed.last_turn)), where
            assert all(d in seed.documents for d in r.documents), where
        elif r.category == "ambiguous_dialog" and prov.method == "ad_two_candidates":
            # what the turn leaves out is in the dialog, beside another thing of its kind; the question names both
            assert r.clarification and r.resolution is None and seed.rewrite, where
            assert (terms(seed.rewrite) - terms(r.last_turn)) & _prior_terms(r), where
            entities = [entity_of_title(i) for i in r.interpretations]
            assert len(entities) == 2 and all(e and e.mentioned_in(r.messages[-3].content) for e in entities), where
            assert not any(e and e.mentioned_in(r.last_turn) for e in entities), where
        elif r.category == "ambiguous_dialog":
            assert r.clarification and r.resolution is None, where
            hidden = referent_terms(seed) if prov.method == "ad_cut_before_referent" else set()
            if not hidden:
                question = seed.rewrite or seed.last_turn
                hidden = terms(question) - terms(r.last_turn)
            assert hidden, where
            assert not hidden & _prior_terms(r), where  # the referent is missing from the dialog ...
            assert not hidden & _doc_terms(r), where  # ... and from the documents
        else:  # ambiguous_documents
            assert r.setting == "post_retrieval" and r.clarification, where
            assert len(r.interpretations) >= 2, where
            titles = sorted({d.title for d in r.documents})
            docs_by_title = {t: [d for d in r.documents if d.title == t] for t in titles}
            labels = {e.label for e in map(entity_of_title, titles) if e}
            assert set(r.interpretations) <= labels, where  # every interpretation has its documents
            named = {e.label: plain_label(e, docs_by_title) for e in map(entity_of_title, titles) if e}
            said = set(words(r.clarification))
            kinds = {e.kind for e in map(entity_of_title, titles) if e and e.label in r.interpretations}
            # senses of one name, each named (a shared tail said once: "the child or the adult fee")
            if kinds == {"paren"}:
                assert all(set(words(named[i])) <= said for i in r.interpretations), where
            else:  # names sharing a class noun ("the Hudson River"): asked for by that noun, no list of titles
                heads = {e.head for e in map(entity_of_title, titles) if e and e.label in r.interpretations}
                assert kinds == {"suffix"} and ".clarify.noun." in prov.template, where
                assert any(h in r.clarification.lower() for h in heads), where
            assert not any("(" in i and i in r.clarification for i in r.interpretations), where  # no title pasted
            for i in r.interpretations:  # the loose turn names none of them precisely
                entity = next(e for e in map(entity_of_title, (d.title for d in r.documents)) if e and e.label == i)
                assert not entity.mentioned_in(r.last_turn), where


def test_sample_rows_are_consistent_with_their_evidence(sample_rows: list[Example], sample_seeds) -> None:
    check_labels(sample_rows, sample_seeds)


def test_mtrag_rows_are_consistent_with_their_evidence(mtrag_rows: list[Example], mtrag_seeds) -> None:
    check_labels(mtrag_rows, mtrag_seeds)


def test_ambiguous_rows_are_paired_with_hard_negatives(sample_seeds: list[SeedTurn]) -> None:
    _, _, stats = construct(sample_seeds, FAST, rng=random.Random(7))
    # 0.89 on the sample: the meaning checks drop some seeds' hard negatives while keeping their ambiguous rows
    assert stats["ambiguous_paired_with_hard_negative"] >= 0.85


def test_surface_forms_overlap_across_categories(sample_rows: list[Example]) -> None:
    """Pronoun turns occur among hard negatives and ambiguous rows alike; clear rows are not all long."""

    def share_with_pronoun(cat: str) -> float:
        rows = [r for r in sample_rows if r.category == cat]
        return sum(bool(find_anchor(r.last_turn, None)) for r in rows) / len(rows)

    assert share_with_pronoun("hard_negative") > 0.3
    assert share_with_pronoun("ambiguous_dialog") > 0.3
    short_clear = [r for r in sample_rows if r.category == "clear" and len(r.last_turn.split()) <= 9]
    assert len(short_clear) >= 20


def test_many_wordings_are_drawn(sample_rows: list[Example]) -> None:
    # one clarification per instance (its pre- and post-retrieval rows share the drawn wording)
    clar = list(
        {
            (r.provenance.seed_id, r.provenance.method): r.clarification for r in sample_rows if r.needs_clarification
        }.values()
    )
    templates = {r.provenance.template.split(".lead")[0] for r in sample_rows if r.needs_clarification}
    assert len(set(clar)) > 0.6 * len(clar)
    assert len(templates) >= 30


# ---------------------------------------------------------------------------------------------
# Determinism
# ---------------------------------------------------------------------------------------------
def test_same_seed_gives_byte_identical_output(sample_seeds: list[SeedTurn], tmp_path: Path) -> None:
    a, _, sa = construct(sample_seeds, FAST, rng=random.Random(11))
    b, _, sb = construct(list(reversed(sample_seeds)), FAST, rng=random.Random(11))
    write_records(tmp_path / "a.parquet", a)
    write_records(tmp_path / "b.parquet", b)
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()
    assert sa == sb


def test_other_seed_draws_other_templates(sample_seeds: list[SeedTurn]) -> None:
    a, _, _ = construct(sample_seeds, FAST, rng=random.Random(11))
    b, _, _ = construct(sample_seeds, FAST, rng=random.Random(12))
    ta = {(r.provenance.seed_id, r.provenance.method, r.setting): r.provenance.template for r in a}
    tb = {(r.provenance.seed_id, r.provenance.method, r.setting): r.provenance.template for r in b}
    shared = set(ta) & set(tb)
    assert sum(ta[k] != tb[k] for k in shared) > 0.3 * len(shared)


# ---------------------------------------------------------------------------------------------
# Config and building blocks
# ---------------------------------------------------------------------------------------------
def test_per_seed_zero_disables_a_method(sample_seeds: list[SeedTurn]) -> None:
    cfg = params_section(
        "synthesize.construct",
        separability=False,
        per_seed={m: int(m in ("clear_as_is", "hn_dialog_resolves")) for m in METHODS},
    )
    rows, _, _ = construct(sample_seeds, cfg, rng=random.Random(1))
    assert {r.provenance.method for r in rows} == {"clear_as_is", "hn_dialog_resolves"}


def test_unknown_method_is_a_config_error() -> None:
    with pytest.raises(ValueError, match="unknown construct methods"):
        params_section("synthesize.construct", per_seed={"make_it_up": 1})
    with pytest.raises(ValueError, match="missing: .*clear_as_is"):
        params_section("synthesize.construct", per_seed={"hn_dialog_resolves": 1})
    on_off = {m: 1 for m in METHODS} | {"ad_generalized_unpinned": 2}
    with pytest.raises(ValueError, match=r"ad_generalized_unpinned: 2.*on \(1\) or off \(0\)"):
        params_section("synthesize.construct", per_seed=on_off)
    assert params_section("synthesize.construct", per_seed=on_off | {"ad_generalized_unpinned": 1, "ad_stitched": 3})


def test_title_entities_and_generalisation() -> None:
    planet = entity_of_title("Mercury (planet)")
    assert planet == Entity("mercury", "Mercury", "planet", "Mercury (planet)", "paren", "Mercury (planet)")
    assert generalize("how far is the planet mercury from the sun", planet, "the") == "how far is mercury from the sun"
    river = entity_of_title("Penobscot River")
    assert river is not None and river.key == "river"
    assert generalize("How long is the Penobscot River?", river, "that") == "How long is that river?"
    assert entity_of_title("List of New England Patriots seasons") is None
    assert entity_of_title("Running a query") is None  # a phrase, not a name-like modifier
    assert entity_of_title("Estimating your cost") is None
    football = entity_of_title("American football")
    assert football is not None and football.label == "American football"
    assert generalize("Is American football similar to rugby?", football, "that") == "Is football similar to rugby?"


def test_multi_word_disambiguators_and_names_inside_longer_names() -> None:
    mlb = entity_of_title("Cardinals (St. Louis, MLB)")
    assert mlb is not None and mlb.mentioned_in("Who founded the St. Louis Cardinals?")
    assert generalize("Who founded the St. Louis Cardinals?", mlb, "the") == "Who founded the Cardinals?"
    state = entity_of_title("Georgia (U.S. state)")
    assert (
        generalize("What is the capital of the U.S. state of Georgia?", state, "the")
        == "What is the capital of Georgia?"
    )
    # a disambiguator that is only the tail of the name in the question would leave "the St. Cardinals"
    louis = entity_of_title("Cardinals (Louis)")
    assert generalize("Who founded the St. Louis Cardinals?", louis, "the") is None
    assert generalize("Who founded the Saint Louis Cardinals?", louis, "the") is None
    assert generalize("Louis Cardinals: who founded them?", louis, "the") == "Cardinals: who founded them?"
    # a mention must start a token: "$5,000 credit limit" is no "000 credit"
    assert text_entities("With a $5,000 credit limit, what balance should I keep?") == []
    assert [e.modifier for e in text_entities("Is the Lite plan free?")] == ["Lite"]
    # a head that modifies another head is no head: "Which book is your question about?" for "book club sets" was
    # graded bad (2026-12-06)
    assert text_entities("How do Hensby Libraries' book club sets work for a reading group?") == []


MERCURY_DOCS = {
    "Mercury (planet)": [
        Document(
            doc_id="p",
            title="Mercury (planet)",
            text="Mercury is the smallest planet and the closest to the Sun. Its surface is hot by day, 430 C, "
            "and -180 C by night; craters cover the surface.",
        )
    ],
    "Mercury (element)": [
        Document(
            doc_id="e",
            title="Mercury (element)",
            text="Mercury is a chemical element, a heavy liquid metal once used in thermometers and barometers.",
        )
    ],
}


def _judge(**kw: float) -> SenseJudge:
    cfg = {"ask_max_margin": 0.1, "answer_min_margin": 0.15, "cue_min_margin": 0.03, **kw}
    return SenseJudge(MERCURY_DOCS, **cfg)


def test_sense_judge_reads_the_turns_other_words() -> None:
    judge, senses, name = _judge(), list(MERCURY_DOCS), {"mercury"}
    hot = judge.judge("How hot does the surface of Mercury get?", senses, name)
    assert (hot.label, hot.sense) == ("answer", "Mercury (planet)") and "surface" in hot.cues
    thermo = judge.judge("Is mercury still used in thermometers?", senses, name)
    assert (thermo.label, thermo.sense) == ("answer", "Mercury (element)")
    # nothing but the name and question words: open, however near one sense's passages happen to sit
    assert judge.judge("Tell me about Mercury", senses, name).label == "ask"
    assert judge.judge("what is mercury?", senses, name).label == "ask"
    # a word of each sense: no verdict either way
    assert judge.judge("is the liquid metal on the surface of mercury?", senses, name).label == "unclear"
    # fewer than two senses with passages: nothing to judge
    assert judge.judge("what is mercury?", ["Mercury (planet)", "Mercury (god)"], name).label == "unclear"


def test_sense_judge_thresholds_come_from_the_config() -> None:
    senses, name = list(MERCURY_DOCS), {"mercury"}
    # a lexical cue stands only when the similarity agrees by the configured margin
    assert _judge(cue_min_margin=2.0).judge("How hot does the surface of Mercury get?", senses, name).label == "unclear"


def test_broken_and_still_named_references() -> None:
    assert broken_name("Who founded the St. Cardinals?", "Cardinals")
    assert broken_name("how does a 5/6 mortgage actually work", "mortgage")
    assert broken_name("Who founded the Cardinals?", "Cardinals") is None
    assert still_named("is the vault plan available in that region (ca-central-1)?", "region")
    assert still_named("is the vault plan available in that region?", "region") is None


def test_names_own_topic_finds_names_not_words() -> None:
    topic = frozenset({"e-type", "jaguar", "xk120"})
    assert names_own_topic("when did they bring out the e-type", topic, frozenset())
    assert names_own_topic("when did they bring it out", topic, frozenset()) is None
    assert names_own_topic("when did they bring out the e-type", topic, frozenset({"e-type"})) is None


def test_ambiguous_documents_rows_prefer_no_sense(sample_rows: list[Example]) -> None:
    adoc = [r for r in sample_rows if r.category == "ambiguous_documents"]
    assert adoc
    docs_by_title: dict[str, list[Document]] = {}
    for r in sample_rows:
        for d in r.documents:
            docs_by_title.setdefault(d.title, []).append(d)
    c = FAST.checks
    judge = SenseJudge(
        docs_by_title,
        ask_max_margin=c.ask_max_margin,
        answer_min_margin=c.answer_min_margin,
        cue_min_margin=c.cue_min_margin,
    )
    for r in adoc:
        titles = sorted({d.title for d in r.documents})
        family = [e for e in map(entity_of_title, titles) if e is not None]
        assert len(family) >= 2, r.documents
        verdict = judge.judge(r.last_turn, titles, terms(family[0].head))
        assert verdict.label == "ask", (r.last_turn, titles, verdict)
        # options in plain words, never a title with its parentheses
        assert not any(t in (r.clarification or "") for t in titles), r.clarification


def test_referent_and_anchor_from_rewrite() -> None:
    seed = SeedTurn(
        conversation_id="c",
        turn=2,
        domain="cloud",
        messages=[
            Message(role="user", content="What does the Lite plan include?"),
            Message(role="assistant", content="The Lite plan includes 1 GB."),
            Message(role="user", content="when does the plan renew?"),
        ],
        last_turn="when does the plan renew?",
        rewrite="When does the Lite plan renew?",
        source=Source(format="test", path="inline"),
    )
    assert referent_terms(seed) == {"lite"}
    anchor = find_anchor(seed.last_turn, seed.rewrite)
    assert anchor is not None and (anchor.kind, anchor.text) == ("noun", "plan")
    rows, _, _ = construct([seed], FAST, rng=random.Random(0))
    by_method = {r.provenance.method: r for r in rows if r.setting == "pre_retrieval"}
    assert by_method["hn_dialog_resolves"].resolution == "When does the Lite plan renew?"
    cut = by_method["ad_cut_before_referent"]
    assert [m.content for m in cut.messages][-1].lower().startswith(("when", "okay", "thanks", "also", "so", "and"))
    assert len(cut.messages) == 1 and "plan" in cut.clarification


def test_the_question_targets_the_unresolved_word() -> None:
    # "they" are the scripts, in the turn itself: the table is what the dialog resolved
    anchor = find_anchor(
        "my scripts parse the table output, will they break",
        "Will my scripts that parse the nimbus CLI's table output break?",
    )
    assert anchor is not None and (anchor.kind, anchor.text) == ("noun", "table")
    anchor = find_anchor("does this plan renew monthly", "Does the Lite plan renew monthly?")
    assert anchor is not None and (anchor.kind, anchor.text) == ("noun", "plan")
    # ... but a turn that ends on "it", which the rewrite replaces, asks first what "it" is
    anchor = find_anchor("when did the americans manage it", "When did the first American go into space?")
    assert anchor is not None and (anchor.kind, anchor.text) == ("thing", "it")
    # "the next" is not a noun to ask about
    anchor = find_anchor("So what is the next after The Office?", "What should I watch next after The Office?")
    assert anchor is None or anchor.text != "next"
    # "that" as the subject of a verb: "Sorry, the take of what?" was published (2026-12-05)
    anchor = find_anchor(
        "how long does that take then, and whats the fare",
        "How long does the stopping Coastline train take from Tarrow Central to Brockhurst, and what is the fare?",
    )
    assert anchor is None or anchor.text != "take", anchor


def test_a_statement_is_not_a_question() -> None:
    for turn in ["so, they have solved the problem.", "That's a relief, but I could really use the assets"]:
        assert not asks_something(turn), turn
    for turn in [
        "whats the lag like",  # no question mark, a question word
        "Last one - are there showers at the campsite",  # after a lead-in
        "the food bank sounds good. the eastgate one is closest to me, do they need volunteers",
        "quick question: opposition leader for the movement",  # a search-style fragment
        "I need the forms for the application",  # a request
    ]:
        assert asks_something(turn), turn


def test_a_first_turn_loses_what_ties_it_to_an_earlier_message() -> None:
    # published as single-turn "ask" rows (2026-12-06): an opener with nothing before it told the label
    for turn, alone in [
        ("Going back to energy - why did the margin drop?", "why did the margin drop?"),
        ("ok and is the hall on the all sites pass?", "is the hall on the all sites pass?"),
        ("last one - are there showers at the campsite?", "are there showers at the campsite?"),
        ("That's a relief, but I could really use the assets?", "I could really use the assets?"),
        ("And the faster option, what's that cost?", "the faster option, what's that cost?"),
    ]:
        assert drop_openers(turn) == alone, turn
    for turn in ["Sometimes the bus is late, why?", "Andes peaks over 6000 m", "Thanksgiving date 2026?", "ok"]:
        assert drop_openers(turn) == turn, turn  # whole words only; nothing left keeps the turn
    for lead in LEAD_INS:  # every lead-in the construction adds is one a first turn loses
        assert drop_openers(lead + "what does the pass cost?") == "what does the pass cost?", lead


def test_no_first_turn_opens_with_a_lead_in_and_no_turn_with_two(sample_rows: list[Example]) -> None:
    alone = [r.last_turn for r in sample_rows if len(r.messages) == 1]
    assert alone and all(drop_openers(t) == t.strip() for t in alone), [
        t for t in alone if drop_openers(t) != t.strip()
    ][:5]
    led = [
        t[len(lead) :]
        for t in (r.last_turn for r in sample_rows)
        for lead in LEAD_INS
        if t.lower().startswith(lead.lower())
    ]
    assert led and all(drop_openers(t) == t.strip() for t in led), [t for t in led if drop_openers(t) != t.strip()]


def test_a_named_place_is_asked_about_by_its_noun() -> None:
    # the rewrite names the place itself, and where it is: "which residence?", not "the residence of what?"
    # ("The office of what, exactly?", "Sorry, the museum of what?" were published, 2026-12-05)
    for turn, rewrite, noun in [
        ("is the residence catered", "Is the Ashby Hall residence at Ellingham University catered?", "residence"),
        (
            "what hours is the office open",
            "When is the lost property office at the Calder Street interchange open?",
            "office",
        ),
        ("and the museum, is it open on sundays", "Is the Penmoor Museum of Childhood open on Sundays?", "museum"),
        (
            "can we bring a bouncy castle into the hall",
            "Can we bring a bouncy castle into the sports hall at the Wrexley Centre?",
            "hall",
        ),
    ]:
        anchor = find_anchor(turn, rewrite)
        assert anchor is not None and (anchor.text, anchor.owner) == (noun, ""), (turn, anchor)
        assert "of what" not in clarify_dialog(anchor, random.Random(0))[0]
    assert owner_left_out("What does the Corvane Group's final dividend for 2024 come to?", "dividend")
    # a noun with a name of its own is asked about by that name, whatever else the rewrite names (graded weak:
    # "What do you mean by the spa?", "Could you say what you mean by the hotel?", 2026-12-06)
    assert not owner_left_out(
        "What does the Kestrel powertrain warranty cover on a 2022 Ridgeback hybrid?", "powertrain"
    )
    for rewrite, noun in [
        ("Can I use Silverpine Rewards points to pay for a massage at the Juniper spa at Marlowe Bay Resort?", "spa"),
        ("Does Wenhaven need to approve a stay at the Bellhouse hotel before we book it?", "hotel"),
        ("Does the Thistle Hut shop take card payments, and do you have to be a member of the Society?", "shop"),
    ]:
        assert not owner_left_out(rewrite, noun), rewrite


def test_clarification_templates_fit_the_noun() -> None:
    for seed in range(60):
        mass, _ = clarify_dialog(Anchor("noun", "lag", "why is the lag so bad"), random.Random(seed))
        assert not re.search(r"\b(?:which|a) lag\b", mass, re.I), mass  # "which money", "a lag" do not read
        plural, _ = clarify_dialog(Anchor("noun", "lakes", "how deep are those lakes"), random.Random(seed))
        assert not re.search(r"\ban? lakes\b|which one", plural, re.I), plural
    # graded weak in blind readings (2026-12-05): "I'm not sure which game you're referring to. Can you name it?",
    # "I don't see a photo mentioned yet. Can you say which one you mean?"
    asked = {clarify_dialog(Anchor("noun", noun), random.Random(s))[0] for s in range(60) for noun in ("game", "dates")}
    assert not any(re.search(r"name it|mentioned yet", q) for q in asked), asked
    assert {"Sorry, which game?", "Sorry, which dates?"} <= asked


def test_clarifications_read_as_a_person_asks() -> None:
    # graded weak in a blind reading of 30 published questions (2026-12-05): stock openers ("Before I answer:",
    # "Just to be sure,"), a fronted list ("The adult or the child passport renewal: which one ...?") and two
    # questions where one says it ("Sorry, the rings of what? What is your question about?")
    stock = re.compile(r"before i answer|just to be sure|: which one|\?.*\?", re.I)
    anchors = [Anchor("noun", "problem"), Anchor("noun", "interview"), Anchor("noun", "Titanic")]
    anchors += [find_anchor("what are the rings made of", "What are Saturn's rings made of?")]
    seen = set()
    for seed in range(80):
        rng = random.Random(seed)
        for anchor in anchors:
            seen.add(text := clarify_dialog(anchor, rng)[0])
            assert not stock.search(text), text
        two = clarify_documents(["the adult passport renewal", "the child passport renewal"], rng)[0]
        seen.add(two)
        assert not stock.search(two), two
    assert len(seen) > 20  # the rule leaves the wordings varied
    # no fragment ("The powertrain warranty of which car?" was graded weak): every wording is a whole question
    car = find_anchor(
        "what does the powertrain warranty actually cover", "What does the Ridgeback powertrain warranty cover?"
    )
    for s in range(40):
        text = clarify_dialog(car, random.Random(s))[0]
        assert not re.match(r"the\b", text, re.I) and re.search(r"\b(which|what|could)\b", text, re.I), text


def test_a_wording_bank_of_another_size_changes_only_the_wording(monkeypatch: pytest.MonkeyPatch) -> None:
    """A template added to a bank must not move every random choice made after it: replacing the owner
    template "Sorry, the X of what?" (2026-12-06) reshuffled 250 of 663 published rows through the shared RNG."""
    anchor = find_anchor(
        "and the faster option, what's that cost", "How much does an Expedited restore cost on the plan?"
    )
    assert anchor is not None and anchor.owner
    bank = list(CLARIFY["owner"])
    for seed in range(50):
        after = set()
        for extra in (0, 1, 5):
            monkeypatch.setitem(CLARIFY, "owner", [*bank, *["Which {phrase} is that?"] * extra])
            rng = random.Random(seed)
            clarify_dialog(anchor, rng)
            clarify_documents(["the planet", "the element", "the god"], rng)
            after.add(rng.random())
        assert len(after) == 1, seed


def test_a_noun_whose_owner_is_missing_asks_for_the_owner() -> None:
    # graded weak: "which option?" when the user said "the faster option" and what is missing is the service
    cases = {
        (
            "and the faster option, what's that cost",
            "How much does an Expedited restore cost on the Nimbus Archive plan?",
        ): (
            "option",
            "faster option",
        ),
        (
            "going back to energy - why did the margin drop",
            "Why did the Corvane Energy segment's operating margin fall?",
        ): (
            "margin",
            "margin",
        ),
        ("if I need the money for an emergency can I get it out", "Can I withdraw money from my Roth IRA early?"): (
            "money",
            "money",
        ),
        (
            "different question - whats the final dividend this year",
            "What is Corvane Group's final dividend for 2024 and when is it paid?",
        ): (
            "final dividend",
            "final dividend",
        ),
        ("does the delay eat into the 78 weeks", "Does the processing delay count toward my 78 weeks of Acme pay?"): (
            "delay",
            "delay",
        ),
    }
    said = "The board proposed a final dividend of 12.4p per share."  # the conversation says "final dividend"
    for (turn, rewrite), (noun, phrase) in cases.items():
        anchor = find_anchor(turn, rewrite, said)
        assert anchor is not None and (anchor.text, anchor.owner) == (noun, phrase), (turn, anchor)
        for seed in range(20):
            text, tmpl = clarify_dialog(anchor, random.Random(seed))  # "What do you mean by the X?"
            assert tmpl.startswith("clarify.owner.") and f"the {phrase}" in text.lower(), text
            assert not re.search(rf"\bwhich {noun}\b", text, re.I), text
            # "Sorry, the margin of what?" and "I'm not sure what the rings refers to here" read as weak (2026-12-06)
            assert "of what" not in text and "refers to" not in text, text
    # nothing the user did not say: the owner's kind from the hidden rewrite read as an assumption ("Which
    # instance's zone do you mean?", "Which plan's faster option do you mean?" graded bad, 2026-12-06), a guess
    # from the domain as a wrong one ("which product's lag?" after an admissions chat, 2026-12-05)
    rewrite = "How much does an Expedited restore cost on the Nimbus Object Storage Archive plan?"
    anchor = find_anchor("and the faster option, what's that cost", rewrite)
    lag = find_anchor("whats the lag like", "How much replication lag is there on a Quarry DB read replica?")
    for a, hidden in [(anchor, {"plan", "nimbus", "archive", "restore"}), (lag, {"replica", "quarry", "product"})]:
        asked = {clarify_dialog(a, random.Random(s))[0] for s in range(30)}
        assert asked and not any(set(words(t.lower())) & hidden for t in asked), asked
    # the rewrite names the noun itself ("the Lite plan", "the Nimbus Enterprise support plan"): ask which one
    for rewrite in ("How much does the Nimbus Lite plan cost?", "When does the Nimbus Enterprise support plan renew?"):
        anchor = find_anchor("when does the plan renew", rewrite)
        assert anchor is not None and anchor.text == "plan" and not anchor.owner, anchor


def test_a_compound_noun_is_asked_about_whole() -> None:
    """Read in a blind grading of the questions about 30 new sample conversations (2026-12-06): "Which soft is your
    question about?", "Which audiology are you asking about?", "What kids do you mean?" (the user wrote "the soft
    play", "the audiology centre", "the kids club") and "What do you mean by the shop take?" ("does the shop take
    cards?"). The conversation's own dialog and passages say which words belong together; the rewrite cannot (it
    copies the turn)."""
    cases = [
        (
            "can his sister go in the soft play too or is it big kids only",
            "Can his sister go in the Jungle Den soft play too, or is it for older children only?",
            "The Jungle Den soft play at Quarry Hill is open daily; the soft play is for under-8s.",
            "soft play",
        ),
        (
            "what if she cant get there, does the audiology centre do home visits",
            "If my mum can't get to the Callow Street audiology centre, does it do home visits?",
            "The Callow Street audiology centre offers walk-in repairs on weekday mornings.",
            "audiology centre",
        ),
        (
            "can the kids club have him in the evening",
            "Can the Willow kids' club at the Silverpine Grand look after him in the evening?",
            "The Willow kids' club runs from 9am to 5pm for children aged 4 to 12.",
            "kids club",
        ),
        (
            "what does the powertrain warranty actually cover",
            "What does the Kestrel powertrain warranty cover on a Ridgeback?",
            "The Kestrel powertrain warranty runs for 8 years or 100,000 miles.",
            "powertrain warranty",
        ),
        (
            "Does the park and ride fill up? id be getting there around 8:30?",
            "Does the Kingsway park and ride fill up by 8:30am?",
            "The Kingsway park and ride has 600 spaces and buses every 12 minutes.",
            "park and ride",
        ),
        # a verb or an adjective after the noun is not part of it, though the rewrite repeats it
        (
            "does the shop take cards",
            "Does the Thistle Hut shop take cards?",
            "The Thistle Hut shop takes cash.",
            "shop",
        ),
        (
            "is the pool open on sundays",
            "Is the Rook Lane pool open on Sundays?",
            "The Rook Lane pool opens at 6am.",
            "pool",
        ),
        (
            "is the tram accessible",
            "Is the Summit Loop tram accessible?",
            "The Summit Loop tram runs every 10 minutes.",
            "tram",
        ),
    ]
    for turn, rewrite, said, noun in cases:
        anchor = find_anchor(turn, rewrite, said)
        assert anchor is not None and anchor.text == noun, (turn, anchor)
        for seed in range(20):
            text = clarify_dialog(anchor, random.Random(seed))[0]
            phrase = anchor.owner or anchor.text
            assert re.search(rf"\b{phrase}\b", text, re.I), text


def test_options_sharing_a_tail_say_it_once() -> None:
    labels = ["the child passport renewal", "the adult passport renewal"]
    for seed in range(30):
        text, _ = clarify_documents(labels, random.Random(seed))
        assert text.lower().count("passport renewal") == 1, text  # not "the child passport renewal or the adult ..."
        assert "the child" in text.lower() and "the adult passport renewal" in text, text
    names = ["the St. Louis Cardinals (MLB)", "the Arizona Cardinals (NFL)"]  # nothing shared at the end: said whole
    assert all(n in clarify_documents(names, random.Random(s))[0] for s in range(10) for n in names)
    three = ["the Basic support plan", "the Business support plan", "the Enterprise support plan"]
    for seed in range(30):
        text, _ = clarify_documents(three, random.Random(seed))
        # joined with "or"/"and" the tail is said once; a comma list keeps every option whole
        assert text.count("support plan") in (1, 3), text


def test_a_full_product_name_is_not_made_open(sample_rows: list[Example]) -> None:
    # readers took "how much does the Continental Rail Pass cost for a 26-year-old?" as named (twice, blind)
    open_rows = [r for r in sample_rows if r.category == "ambiguous_dialog"]
    assert open_rows
    assert not any("continental rail pass" in r.last_turn.lower() for r in open_rows)
    assert any("cardinals" in r.last_turn.lower() for r in open_rows)  # a bare shared name still is open


def test_a_donor_rewrite_comparing_with_its_dialog_is_not_clear() -> None:
    from clariedge.construct.clear import _REFERS_TO_DIALOG

    assert _REFERS_TO_DIALOG.search("Have there been others who have used carbon dioxide for similar purposes?")
    assert _REFERS_TO_DIALOG.search("what did you mean by the cap?")
    assert not _REFERS_TO_DIALOG.search("Is American football similar to rugby?")
    assert not _REFERS_TO_DIALOG.search("How long can a reticulated python get?")


def test_shallow_separability_detects_a_telltale_word(sample_rows: list[Example]) -> None:
    marked = [
        r.model_copy(update={"messages": [*r.messages[:-1], Message(role="user", content="ZZTOP " + r.last_turn)]})
        if r.category == "clear"
        else r
        for r in sample_rows
    ]
    report = shallow_separability(marked, folds=3)
    assert report["bow_last_turn"]["clear"] > 0.99
    honest = shallow_separability(sample_rows, folds=3)
    assert honest["bow_last_turn"]["clear"] < report["bow_last_turn"]["clear"]


def test_shallow_separability_detects_passages_that_give_the_label_away(sample_rows: list[Example]) -> None:
    """Passages that share the turn's words only when it needs no question show in `passage_overlap_only`."""
    unrelated = Document(doc_id="zz", title="Zebra", text="Zebras graze on the savanna in herds.")

    def plant(r: Example) -> Example:
        if not r.documents:
            return r
        if r.needs_clarification:
            return r.model_copy(update={"documents": [unrelated]})
        return r.model_copy(update={"documents": [Document(doc_id="yy", title="", text=r.last_turn)]})

    report = shallow_separability([plant(r) for r in sample_rows], folds=3)
    assert report["passage_overlap_only"]["needs_clarification"] > 0.95
    honest = shallow_separability(sample_rows, folds=3)
    assert honest["passage_overlap_only"]["needs_clarification"] < 0.95


def test_stats_carry_the_shallow_separability_report(sample_seeds: list[SeedTurn]) -> None:
    _, _, stats = construct(
        sample_seeds[:80], params_section("synthesize.construct", separability_folds=3), rng=random.Random(2)
    )
    report = stats["shallow_separability"]
    assert report["metric"] == "roc_auc_oof_grouped" and report["folds"] == 3
    for name in ("clear", "hard_negative", "ambiguous_dialog", "needs_clarification"):
        assert 0.0 <= report["bow_last_turn"][name] <= 1.0
        assert 0.5 <= report["length_only"][name] <= 1.0
    assert stats["rows"] == sum(stats["by_category"].values())


def test_contradiction_safety_net_flags_planted_errors(sample_rows: list[Example], sample_seeds) -> None:
    by_id = {s.id: s for s in sample_seeds}
    ad = next(
        r for r in sample_rows if r.provenance.method == "ad_cut_before_referent" and r.setting == "pre_retrieval"
    )
    hn = next(r for r in sample_rows if r.provenance.method == "hn_dialog_resolves" and r.setting == "pre_retrieval")
    seed_ad, seed_hn = by_id[ad.provenance.seed_id], by_id[hn.provenance.seed_id]
    assert contradiction(ad, seed_ad) is None and contradiction(hn, seed_hn) is None
    # the ambiguous turn back in its full dialog: the referent is there, the label would be wrong
    resolved = ad.model_copy(update={"messages": [*seed_ad.messages[:-1], ad.messages[-1]]})
    assert "in the context" in contradiction(resolved, seed_ad)
    # the hard negative without its dialog: nothing resolves it any more
    alone = hn.model_copy(update={"messages": hn.messages[-1:]})
    assert "does not supply" in contradiction(alone, seed_hn)


def test_donor_turns_never_show_a_user_only_dialog(mtrag_rows: list[Example], mtrag_seeds) -> None:
    """MTRAG's retrieval tasks give 90 conversations' user turns without the assistant's answers: such a turn
    opens a row or follows another conversation's dialog, never its own user-only transcript."""
    donors = {s.id for s in mtrag_seeds if s.turn > 1 and not any(m.role == "assistant" for m in s.messages[:-1])}
    assert len(donors) > 300  # the retrieval tasks of all 110 conversations
    for row in mtrag_rows:
        history = row.messages[:-1]
        assert not history or any(m.role == "assistant" for m in history), (row.provenance.method, row.last_turn)
    from_donors = [r for r in mtrag_rows if r.provenance.seed_id in donors]
    stitched = [r for r in from_donors if r.provenance.method == "ad_stitched"]
    assert stitched, "a donor turn with an open reference is stitched onto another conversation"
    own = {s.id: s.conversation_id for s in mtrag_seeds}
    hosts = {tuple((m.role, m.content) for m in s.messages[:-1]): s.conversation_id for s in mtrag_seeds}
    for r in stitched:
        host = hosts.get(tuple((m.role, m.content) for m in r.messages[:-1]))
        assert host is not None and host != own[r.provenance.seed_id]
    placed = [r for r in from_donors if r.category == "clear" and len(r.messages) > 1]
    opened = [r for r in from_donors if r.category == "clear" and len(r.messages) == 1]
    assert placed and opened, "a donor's clear rows stand both first and after another dialog, as its asks do"


def test_a_donor_turn_after_another_dialog_shows_what_a_retriever_finds_for_it(
    mtrag_rows: list[Example], mtrag_seeds
) -> None:
    """An MTRAG turn without passages of its own, placed after another conversation's dialog, is shown the passages
    a retriever finds for it, not the host conversation's: those are about something else and taught "unrelated
    passages -> answer" (28 published rows, 2026-12-06)."""
    from clariedge.construct.core import is_donor

    bare = {s.id for s in mtrag_seeds if is_donor(s) and not s.documents}
    host_docs = {tuple(m.content for m in s.messages[:-1]): {d.doc_id for d in s.documents} for s in mtrag_seeds}
    rows = [r for r in mtrag_rows if r.provenance.seed_id in bare and r.category == "clear" and r.documents]
    assert len(rows) >= 5
    for r in rows:
        assert {d.doc_id for d in r.documents} != host_docs[tuple(m.content for m in r.messages[:-1])], r.last_turn


def test_a_clear_turn_may_be_shown_passages_that_miss_it(sample_seeds: list[SeedTurn]) -> None:
    """`missed_passages_prob`: a clear turn's post-retrieval row shows, that often, passages a retriever found in
    other conversations instead of its own (retrieval misses; the turn stays clear)."""
    own = {s.id: {d.doc_id for d in s.documents} for s in sample_seeds}

    def shown_own(prob: float) -> list[bool]:
        cfg = params_section("synthesize.construct", separability=False, missed_passages_prob=prob)
        rows, _, _ = construct(sample_seeds[:120], cfg, rng=random.Random(3))
        clear = [
            r
            for r in rows
            if r.provenance.method in ("clear_as_is", "clear_rewrite") and r.documents and own[r.provenance.seed_id]
        ]
        return [{d.doc_id for d in r.documents} <= own[r.provenance.seed_id] for r in clear]

    assert all(shown_own(0.0)) and shown_own(0.0)
    missed = shown_own(1.0)
    assert missed and not any(missed)


def test_an_open_turn_is_never_shown_passages_naming_its_noun(sample_rows: list[Example]) -> None:
    """An open reference's passages are what a retriever finds on its other words: none names its open noun, which
    would pin it down ("which plan?" beside a passage about one plan). The noun is read from the row's own
    question: the word the turn and the clarification share. (Two things compared are shown one passage each:
    `test_two_things_compared_then_it_asks_which`; a writer's open variant, the passages of every reading.)"""
    asks = [
        r
        for r in sample_rows
        if r.category == "ambiguous_dialog"
        and r.documents
        and r.provenance.method not in ("ad_two_candidates", "ad_as_written")
    ]
    assert len(asks) >= 20
    for r in asks:
        noun = terms(r.last_turn) & terms(r.clarification or "")
        assert not any(noun & terms(f"{d.title} {d.text}") for d in r.documents), (r.last_turn, r.clarification)


def test_two_things_compared_then_it_asks_which(sample_rows: list[Example]) -> None:
    """`ad_two_candidates`: the user compared two variants of one name and the assistant described both; the turn's
    "it" fits either, so the clarification names the two, and their passages (one each) are shown after retrieval.
    `clear_one_of_two`: the precise question after the same dialog names exactly one of them."""
    from clariedge.construct.entities import entity_of_title

    asks = [r for r in sample_rows if r.provenance.method == "ad_two_candidates"]
    clear = [r for r in sample_rows if r.provenance.method == "clear_one_of_two"]
    assert len({r.provenance.seed_id for r in asks}) >= 5 and clear
    for r in asks + clear:
        compared, described = r.messages[-3].content, r.messages[-2].content
        titles = {d.title for d in r.documents}
        assert r.messages[-2].role == "assistant" and len(described) > 100
        if r.needs_clarification:
            assert re.search(r"\bit\b", r.last_turn, re.I), r.last_turn
            assert r.clarification and "(" not in r.clarification and len(r.interpretations) == 2
            for e in map(entity_of_title, r.interpretations):  # each told apart in the comparison and the question
                assert e and e.modifier_terms() <= terms(compared) & terms(r.clarification), (e, r.clarification)
        if r.setting == "post_retrieval":
            assert len(titles) == 2
            entities = [entity_of_title(t) for t in titles]
            assert all(e is not None and e.mentioned_in(compared) for e in entities), compared
            named = [e for e in entities if e.mentioned_in(r.last_turn)]
            assert len(named) == (0 if r.needs_clarification else 1), r.last_turn


def test_a_writers_open_variant_is_asked_only_as_written(sample_rows: list[Example], sample_seeds) -> None:
    """A sample turn's `open_variant` (a person wrote it, and the question to ask) makes `ad_as_written` rows and
    nothing else: no method reads it as a turn to answer, a donor or a host. The turn as it was asked still makes
    its own rows after the same dialog, so the two differ by the turn alone."""
    written = {s.id: s for s in sample_seeds if s.clarification}
    assert len(written) >= 40
    by_method: dict[str, set[str]] = {}
    for r in sample_rows:
        by_method.setdefault(r.provenance.method, set()).add(r.provenance.seed_id)
    assert by_method["ad_as_written"] == set(written)
    assert all(not (ids & set(written)) for m, ids in by_method.items() if m != "ad_as_written")
    # no other row shows a variant: not as a dialog's turn, not as its last turn
    variants = {_norm(s.last_turn) for s in written.values()}
    for r in sample_rows:
        if r.provenance.method != "ad_as_written":
            assert not any(_norm(m.content) in variants for m in r.messages if m.role == "user"), r.last_turn
    answered = set().union(*(ids for m, ids in by_method.items() if METHODS[m] in ("clear", "hard_negative")))
    assert sum(asked_turn_id(i) in answered for i in written) >= len(written) // 3


def test_asks_are_shown_passages_on_their_words(mtrag_rows: list[Example]) -> None:
    """The passages shown with an open turn share its words as a clear turn's do (the retriever weighs keyword
    match as much as closeness in meaning), except the open reference itself: ranked by meaning alone they shared
    14% of an open turn's words against 58-78% for the other rows (ROC AUC 0.86 for the label, 2026-12-06); real
    turns show no such gap (0.39-0.61)."""
    from clariedge.construct.stats import passage_overlap

    asks = [r for r in mtrag_rows if r.needs_clarification and r.documents and r.category == "ambiguous_dialog"]
    assert len(asks) >= 10
    assert sum(passage_overlap(r) > 0 for r in asks) >= 0.6 * len(asks)


def test_clear_rows_read_alone_stand_alone(mtrag_rows: list[Example], mtrag_seeds) -> None:
    """A clear row shown first or after another conversation's dialog is read alone: its turn must not point
    outside itself ("what about pollution?", "this soccer event", "What a terrible war!"); the blind reading
    of 2026-12-04 found 4 of 5 disagreements there. MTRAG's rewrites include such turns, so the check runs."""
    from clariedge.construct.core import is_donor
    from clariedge.construct.reading import needs_its_dialog

    rewrites = [s.rewrite for s in mtrag_seeds if s.rewrite]
    assert sum(needs_its_dialog(t) is not None for t in rewrites) > 20  # the rule has work to do
    donors = {s.id for s in mtrag_seeds if is_donor(s)}
    alone = [
        r for r in mtrag_rows if r.category == "clear" and (len(r.messages) == 1 or r.provenance.seed_id in donors)
    ]
    assert len(alone) > 50

    def own_words(turn: str) -> str:  # without the lead-in drawn for rows after a dialog ("Also, ")
        lead = next((x for x in LEAD_INS if turn.lower().startswith(x.lower())), "")
        return turn[len(lead) :]

    bad = [r.last_turn for r in alone if needs_its_dialog(own_words(r.last_turn))]
    assert not bad, bad


def test_an_unpinned_loose_question_stands_alone(sample_rows: list[Example], mtrag_rows: list[Example]) -> None:
    """Its own dialog cut before the name can still offer a referent of the kind: "does the company put on any shows
    that family members can come and watch" after a chat naming Kelbridge Opera (sample-long-theatre-02) was
    answered, not asked, by a blind reader (2026-12-06)."""
    rows = [r for r in sample_rows + mtrag_rows if r.provenance.method == "ad_generalized_unpinned"]
    assert len(rows) >= 10
    assert all(len(r.messages) == 1 for r in rows), [r.last_turn for r in rows if len(r.messages) > 1]


def test_open_rows_after_retrieval_show_what_a_retriever_returns(mtrag_rows: list[Example]) -> None:
    """An open question after retrieval gets the corpus passages nearest to it that do not name its noun, as a
    retriever would return them: on topic, yet none so close that it may settle the turn (a billing passage would
    settle "when do the invoices come out each month?"). Passages of another domain taught "unrelated passages ->
    ask", which no real retriever shows."""
    from clariedge.construct.senses import _minilm

    rows = [r for r in mtrag_rows if r.provenance.method == "ad_generalized_unpinned" and r.documents]
    assert len(rows) >= 5
    limit = FAST.checks.passage_max_similarity
    best = []
    for r in rows:
        sims = _minilm([f"{d.title} {d.text}" for d in r.documents]) @ _minilm([r.last_turn])[0]
        assert sims.max() < limit + 0.05, (r.last_turn, r.documents[int(sims.argmax())].title)  # + surface drawn
        best.append(float(sims.max()))
    # another domain's passages, drawn at random, were at 0.05 on average (2026-12-06)
    assert sum(best) / len(best) > 0.2, sorted(best)


def test_names_are_words_the_corpus_capitalises() -> None:
    from clariedge.construct.reading import _mostly_capitalised

    texts = [
        "We flew to Montreal in May. The Montreal office was closed.",
        "Save your work often. You can save a file twice, and I save mine hourly.",
        "Keep the ca-central-1 region.",
    ]
    names = _mostly_capitalised(texts)
    assert "montreal" in names and "ca-central-1" in names
    assert "save" not in names  # a heading's capital, lower-case in running text


def test_length_alone_does_not_tell_the_label(sample_seeds: list[SeedTurn], mtrag_seeds) -> None:
    """Rewrites are long complete questions full of "the ...", and resolved follow-ups are longer than open
    references too: without matching, "short -> ask" is the easiest rule in the data, the reverse of real users.
    Matching thins clear rows and hard negatives toward the ask rows' surface (length bin, "the ...", "this/that"),
    while every ask row is kept."""
    from collections import Counter

    from clariedge.construct.build import _surface_bin

    seeds = [*sample_seeds, *mtrag_seeds]
    matched, _, _ = construct(seeds, FAST, rng=random.Random(3))
    raw, _, _ = construct(seeds, FAST.model_copy(update={"length_match": []}), rng=random.Random(3))

    def distance(rows: list[Example], category: str = "clear") -> float:
        """Total variation between the surface histograms of one answer category and the ask rows."""
        answer = Counter(_surface_bin(r.last_turn) for r in rows if r.category == category)
        ask = Counter(_surface_bin(r.last_turn) for r in rows if r.needs_clarification)
        n_c, n_a = sum(answer.values()), sum(ask.values())
        return 0.5 * sum(abs(answer[b] / n_c - ask[b] / n_a) for b in set(answer) | set(ask))

    def count(rows: list[Example], category: str) -> int:
        return sum(r.category == category for r in rows)

    assert distance(raw) > 0.3  # the construction alone: clear turns look unlike ask turns
    # measured: 0.47 -> 0.37 with bins of length x "the ..." x "this/that" (0.40 -> 0.27 before the demonstrative
    # bin; clear turns with a demonstrative are rare since a turn read alone must not point outside itself)
    assert distance(matched) < 0.85 * distance(raw)
    assert distance(matched, "hard_negative") < 0.85 * distance(raw, "hard_negative")
    for category in ("clear", "hard_negative"):
        assert count(matched, category) < count(raw, category)
    for category in ("ambiguous_dialog", "ambiguous_documents"):
        assert count(matched, category) == count(raw, category)
