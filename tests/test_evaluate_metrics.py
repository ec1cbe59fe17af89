"""Every evaluation metric on hand-made predictions whose values are worked out by hand."""

from __future__ import annotations

import json
import random

import pytest
from conftest import params_section

from clariedge.schema import Document, Example, Message, Provenance
from clariedge.training import metrics as M
from clariedge.training.data import stratified_sample
from clariedge.training.evaluate import few_shot_block, minilm_texts, quality, score


def _ex(
    i: int,
    category: str,
    question: str | None = None,
    interpretations: list[str] | None = None,
    setting: str = "pre_retrieval",
) -> Example:
    docs = [Document(doc_id=f"d{i}", title="T", text="some text")] if setting == "post_retrieval" else []
    return Example(
        conversation_id=f"c{i}",
        domain="wiki",
        setting=setting,
        category=category,
        messages=[Message(role="user", content=f"turn {i} about it")],
        documents=docs,
        needs_clarification=category in ("ambiguous_dialog", "ambiguous_documents"),
        clarification=question,
        interpretations=interpretations or [],
        provenance=Provenance(generator="human", seed_id=f"c{i}::1"),
    )


def test_classification_counts_and_ratios() -> None:
    gold = [True, True, False, False, True]
    pred = [True, False, True, False, True]
    m = M.classification(gold, pred)
    assert m["confusion"] == {"tp": 2, "fp": 1, "fn": 1, "tn": 1}
    assert m["accuracy"] == 0.6
    assert m["precision"] == pytest.approx(0.6667)
    assert m["recall"] == pytest.approx(0.6667)
    assert m["f1"] == pytest.approx(0.6667)


def test_classification_degenerate_and_mismatch() -> None:
    m = M.classification([False, False], [False, False])
    assert m["accuracy"] == 1.0 and m["precision"] == 0.0 and m["recall"] == 0.0 and m["f1"] == 0.0
    with pytest.raises(ValueError, match="2 labels but 1 predictions"):
        M.classification([True, False], [True])


def test_accuracy_by_group() -> None:
    out = M.accuracy_by(["a", "b", "a", "a"], [True, False, True, False], [True, True, False, False])
    assert out == {"a": {"n": 3, "accuracy": 0.6667}, "b": {"n": 1, "accuracy": 0.0}}


def test_false_positive_rate_on_hard_negatives() -> None:
    cats = ["hard_negative", "hard_negative", "clear", "hard_negative"]
    assert M.false_positive_rate(cats, [True, False, True, False]) == pytest.approx(0.3333)
    assert M.false_positive_rate(["clear"], [True]) is None


def test_rouge_l() -> None:
    # LCS of [do you mean a or b] and [do you mean b] is 4: P = 4/6, R = 4/4, F = 0.8
    assert M.rouge_l("Do you mean A or B?", "do you mean b") == pytest.approx(0.8)
    assert M.rouge_l("same words", "same words") == 1.0
    assert M.rouge_l("", "anything") == 0.0
    assert M.lcs_length(list("abcbdab"), list("bdcaba")) == 4


def test_interpretation_coverage() -> None:
    q = "Do you mean the Arizona Cardinals or the St. Louis Cardinals?"
    assert M.names_interpretation(q, "Arizona Cardinals (NFL team)")  # 2 of 4 content words: arizona, cardinals
    assert not M.names_interpretation(q, "Cardinal birds of North America")
    assert M.interpretation_coverage(q, ["Arizona Cardinals", "St. Louis Cardinals", "cardinal bird species"]) == (
        pytest.approx(2 / 3)
    )
    assert M.interpretation_coverage(q, []) is None
    assert M.mean([1.0, None, 0.0]) == 0.5 and M.mean([None]) is None


def test_score_puts_it_together() -> None:
    rows = [
        _ex(1, "ambiguous_dialog", "Which plan do you mean, basic or pro?", ["basic plan", "pro plan"]),
        _ex(2, "hard_negative"),
        _ex(3, "hard_negative", setting="post_retrieval"),
        _ex(4, "clear", setting="post_retrieval"),
    ]
    needs = [True, True, False, False]
    s = score(rows, needs, {0: "Do you mean the basic plan or the pro plan?"})
    assert s["accuracy"] == 0.75 and s["confusion"] == {"tp": 1, "fp": 1, "fn": 0, "tn": 2}
    assert s["fp_rate_hard_negatives"] == 0.5
    assert s["accuracy_by_category"]["hard_negative"] == {"n": 2, "accuracy": 0.5}
    assert s["accuracy_by_setting"] == {
        "post_retrieval": {"n": 2, "accuracy": 1.0},
        "pre_retrieval": {"n": 2, "accuracy": 0.5},
    }
    q = s["quality"]
    assert q["rows"] == 1 and q["interpretation_coverage"] == 1.0 and q["gold_interpretation_coverage"] == 1.0
    assert 0.3 < q["rouge_l"] < 1.0
    assert q["embedding_similarity"] is None  # no embedder given


def test_quality_skips_clear_and_unparseable_and_uses_real_embeddings() -> None:
    from clariedge.embed import embed

    rows = [
        _ex(1, "ambiguous_dialog", "Which product do you mean?"),
        _ex(2, "clear"),
        _ex(3, "ambiguous_dialog", "Which one?"),
    ]
    q = quality(rows, {0: "Which product do you mean?", 1: "Which one?", 2: None}, embed_fn=lambda t: embed(t))
    assert q["rows"] == 1  # row 1 is gold-clear, row 2 unparseable
    assert q["rouge_l"] == 1.0 and q["embedding_similarity"] == pytest.approx(1.0, abs=1e-3)


def test_stratified_sample_keeps_the_mix_and_is_deterministic() -> None:
    rows = [_ex(i, "clear") for i in range(30)] + [_ex(100 + i, "hard_negative") for i in range(10)]
    a = stratified_sample(rows, 8, random.Random(1))
    b = stratified_sample(rows, 8, random.Random(1))
    assert [r.id for r in a] == [r.id for r in b]
    assert sum(r.category == "clear" for r in a) == 6 and sum(r.category == "hard_negative" for r in a) == 2
    assert stratified_sample(rows, None, random.Random(1)) == sorted(rows, key=lambda r: r.id)


def test_few_shot_block_and_minilm_views() -> None:
    rows = [
        _ex(1, "ambiguous_dialog", "Which one do you mean?"),
        _ex(2, "clear"),
        _ex(3, "hard_negative"),
        _ex(4, "clear", setting="post_retrieval"),
    ]
    block = few_shot_block(rows, 3, random.Random(0))
    assert block.count("Example ") == 3 and '{"clarification": "CLEAR"}' in block
    assert '"Which one do you mean?"' in block
    last, before, docs = minilm_texts(rows[3])
    assert last == "turn 4 about it" and before == "(no earlier turns)" and docs.startswith("T. some text")


def test_llm_judge_against_a_loopback_openai_server(tmp_path) -> None:
    from openai_stub import Behaviour, OpenAIStub

    from clariedge.training.evaluate import llm_judge

    rows = [
        _ex(1, "ambiguous_dialog", "Which plan?", ["basic", "pro"]),
        _ex(2, "ambiguous_dialog", "Which one?"),
        _ex(3, "clear"),
    ]
    questions = {0: "Do you mean basic or pro?", 1: "Which product?", 2: "Why?"}
    with OpenAIStub() as stub:
        endpoint = params_section("evaluate.llm_judge.openai", base_url=stub.base_url, model="stub")
        cfg = params_section("evaluate.llm_judge", enabled=True, openai=endpoint, cache=str(tmp_path / "judge.sqlite"))
        stub.push(Behaviour.ok('{"rating": 4}'), Behaviour.ok("no json here"))
        out = llm_judge(rows, questions, cfg)
        assert out == {"rows": 2, "failed": 1, "mean_rating": 4.0}  # row 2 is gold-clear: not judged
        hits = stub.hits
        stub.push(Behaviour.ok('{"rating": 2}'))
        again = llm_judge(rows, questions, cfg)
        assert stub.hits == hits + 1  # the first answer came from the cache, the failed one was asked again
        assert again == {"rows": 2, "failed": 0, "mean_rating": 3.0}
        assert "Do you mean basic or pro?" in json.dumps(stub.bodies[0])


def test_best_threshold() -> None:
    # ask when p_clear < t: the ask rows sit at 0.2/0.3/0.55, the clear rows at 0.6/0.9 -> t in (0.55, 0.6)
    t, acc = M.best_threshold([0.2, 0.3, 0.55, 0.6, 0.9], [True, True, True, False, False])
    assert 0.55 < t < 0.6 and acc == 1.0
    # not separable: the best accuracy wins, then the threshold nearest 0.5
    t, acc = M.best_threshold([0.4, 0.6], [False, False])
    assert acc == 1.0 and t <= 0.4
    assert M.best_threshold([], []) == (0.5, 0.0)


def test_best_threshold_for_balanced_accuracy() -> None:
    # one row in five needs a question: never asking is 80% accurate but only 0.5 balanced
    p = [0.1, 0.35, 0.4, 0.6, 0.8]
    gold = [True, False, False, False, False]
    t_acc, acc = M.best_threshold(p, gold)
    t_bal, bal = M.best_threshold(p, gold, "balanced_accuracy")
    assert bal == 1.0 and 0.1 < t_bal < 0.35
    assert acc == 1.0  # here both agree; now a noisy case where they do not
    p = [0.3, 0.2, 0.25, 0.6, 0.7, 0.8, 0.9, 0.95, 0.97, 0.99]
    gold = [True] + [False] * 2 + [False] * 7
    t_acc, acc = M.best_threshold(p, gold)
    t_bal, bal = M.best_threshold(p, gold, "balanced_accuracy")
    assert t_bal > t_acc  # balanced accuracy buys the one "ask" with two false alarms
    assert bal > 0.5 and acc == 0.9
    with pytest.raises(ValueError, match="balanced_accuracy"):
        M.best_threshold(p, gold, "f1")
