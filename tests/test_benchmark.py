"""The `external` stage (`clariedge benchmark`): scoring on inline examples, reading labelled MTRAG task JSONL
with bad lines, absent sets skipped by name, and (slow) the always-CLEAR and MiniLM baselines for real."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from clariedge.cli import app
from clariedge.io import Rejects
from clariedge.training.benchmark import (
    ExternalConfig,
    bootstrap_interval,
    label_of,
    read_labelled,
    run,
    sample_rows,
    score,
)

ROOT = Path(__file__).resolve().parents[1]


def _task(i: int, turn: str, label: str, *, history: bool = True, docs: bool = False) -> dict:
    msgs = [{"speaker": "user", "text": "Tell me about the lease and the loan."}] if history else []
    if history:
        msgs.append({"speaker": "agent", "text": "The lease and the loan differ in cost and terms."})
    msgs.append({"speaker": "user", "text": turn})
    return {
        "task_id": f"conv{i}<::>{len(msgs) // 2 + 1}",
        "conversation_id": f"conv{i}",
        "input": msgs,
        "contexts": [{"document_id": f"d{i}", "title": "Lease basics", "text": "All about the lease."}] if docs else [],
        "answerability": [label],
        "targets": [{"speaker": "agent", "text": "gold: never model input"}],
    }


def _write(path: Path, lines: list[dict | str]) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines), encoding="utf-8")
    return path


def _cfg(**over) -> ExternalConfig:
    """The project's `external` params with overrides (params.yaml is the one source of defaults)."""
    raw = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))["external"]
    return ExternalConfig.model_validate({**raw, **over})


def _run_without_models(
    sets: dict, tmp_path: Path, cfg: ExternalConfig, train: Path | None = None, seed: int = 1
) -> dict:
    """The stage's `run` with the adapter and the zero-shot model off (their folders are never read); outputs
    under tmp_path/out; the train split is read only when the MiniLM baseline is on."""
    out = tmp_path / "out"
    return run(
        sets,
        train or tmp_path / "no_train.parquet",
        tmp_path / "no_adapter",
        tmp_path / "no_base",
        out / "external.json",
        out / "predictions.jsonl",
        out / "external.png",
        cfg,
        seed=seed,
        max_length=None,
        batch_size=8,
        max_new_tokens=16,
        precision="fp32",
        progress=False,
    )


# ---------------------------------------------------------------------------------------------
# Scoring (pure)
# ---------------------------------------------------------------------------------------------
GOLD = [True, True, True, False, False, False, False, False, False, False]
NEEDS = [True, True, False, False, False, True, False, False, False, False]


def test_score_balanced_accuracy_recall_and_ask_rate() -> None:
    s = score(GOLD, NEEDS, seed=1, n_boot=500)
    recall_ask, recall_clear = 2 / 3, 6 / 7
    assert s["n"] == 10 and s["positives"] == 3
    assert s["balanced_accuracy"] == pytest.approx((recall_ask + recall_clear) / 2, abs=1e-4)
    assert s["recall_ask"] == pytest.approx(recall_ask, abs=1e-4)
    assert s["ask_rate_answerable"] == pytest.approx(1 / 7, abs=1e-4)
    assert s["accuracy"] == pytest.approx(0.8) and s["ask_rate"] == pytest.approx(0.3)
    assert s["confusion"] == {"tn": 6, "fp": 1, "fn": 1, "tp": 2}
    assert s["roc_auc"] is None  # no score given
    lo, hi = s["ci95"]
    assert lo <= s["balanced_accuracy"] <= hi and lo < hi
    assert lo >= 0.0 and hi <= 1.0


def test_bootstrap_interval_is_seeded_and_narrows_with_more_rows() -> None:
    a = bootstrap_interval(GOLD, NEEDS, seed=7, n_boot=400)
    assert a == bootstrap_interval(GOLD, NEEDS, seed=7, n_boot=400)
    big = bootstrap_interval(GOLD * 20, NEEDS * 20, seed=7, n_boot=400)
    assert big[1] - big[0] < a[1] - a[0]
    assert bootstrap_interval([], [], seed=7, n_boot=400) is None


def test_always_clear_scores_exactly_one_half() -> None:
    s = score(GOLD, [False] * len(GOLD), seed=3, n_boot=300)
    assert s["balanced_accuracy"] == 0.5 and s["ci95"] == [0.5, 0.5]
    assert s["recall_ask"] == 0.0 and s["ask_rate_answerable"] == 0.0 and s["ask_rate"] == 0.0


def test_roc_auc_of_p_ask_follows_the_ranking() -> None:
    p_good = [0.9, 0.8, 0.7, 0.1, 0.2, 0.3, 0.1, 0.2, 0.3, 0.4]
    assert score(GOLD, NEEDS, p_good, seed=1, n_boot=100)["roc_auc"] == 1.0
    assert score(GOLD, NEEDS, [1 - p for p in p_good], seed=1, n_boot=100)["roc_auc"] == 0.0
    assert score([False] * 4, [False] * 4, [0.1, 0.2, 0.3, 0.4], seed=1, n_boot=100)["roc_auc"] is None  # one class
    with pytest.raises(ValueError, match="labels"):
        score(GOLD, NEEDS[:-1], seed=1, n_boot=100)


# ---------------------------------------------------------------------------------------------
# Reading labelled sets
# ---------------------------------------------------------------------------------------------
def test_label_of() -> None:
    assert label_of({"answerability": ["UNDERSPECIFIED"]}) == (True, "UNDERSPECIFIED")
    for other in ("ANSWERABLE", "PARTIAL", "UNANSWERABLE"):
        assert label_of({"answerability": [other]})[0] is False
    assert label_of({"answerability": "underspecified"})[0] is True
    with pytest.raises(ValueError, match="answerability: field required"):
        label_of({"input": []})
    with pytest.raises(ValueError, match="answerability: expected"):
        label_of({"answerability": []})


def test_read_labelled_rejects_bad_lines_with_file_and_line(tmp_path: Path) -> None:
    no_label = _task(3, "what does it cost?", "ANSWERABLE")
    del no_label["answerability"]
    f = _write(
        tmp_path / "set.jsonl",
        [
            _task(1, "how much does it cost?", "UNDERSPECIFIED"),
            "{not json",
            no_label,
            _task(4, "how long does the lease take to renew?", "ANSWERABLE", docs=True),
            {"task_id": "conv5<::>1", "answerability": ["ANSWERABLE"]},  # no input
        ],
    )
    rejects = Rejects()
    rows = read_labelled(f, rejects)
    assert [(r.id, r.needs) for r in rows] == [("conv1<::>2", True), ("conv4<::>2", False)]
    assert rows[1].documents and rows[1].last_turn == "how long does the lease take to renew?"
    assert all(m.content != "gold: never model input" for r in rows for m in r.messages)  # labels never input
    where = {r["where"]: r["reason"] for r in rejects.rows}
    assert where == {f"{f}:2": "malformed_json", f"{f}:3": "invalid_label", f"{f}:5": "invalid_row"}
    assert "answerability" in next(r["detail"] for r in rejects.rows if r["reason"] == "invalid_label")


def test_sample_rows_is_stratified_and_seeded(tmp_path: Path) -> None:
    f = _write(
        tmp_path / "s.jsonl",
        [_task(i, f"turn {i}?", "UNDERSPECIFIED" if i % 4 == 0 else "ANSWERABLE") for i in range(40)],
    )
    rows = read_labelled(f, Rejects())
    a = sample_rows(rows, 20, seed=5)
    assert len(a) == 20 and sum(r.needs for r in a) == 5  # 10 of 40 ask -> 5 of 20
    assert [r.id for r in a] == [r.id for r in sample_rows(rows, 20, seed=5)]
    assert [r.id for r in a] != [r.id for r in sample_rows(rows, 20, seed=6)]
    assert len(sample_rows(rows, None, seed=5)) == 40


def test_rows_scored_follow_sample_seed_not_the_build_seed(tmp_path: Path) -> None:
    """A build with another top-level seed is scored on the same real rows; another sample_seed draws others."""
    f = _write(
        tmp_path / "s.jsonl",
        [_task(i, f"turn {i}?", "UNDERSPECIFIED" if i % 4 == 0 else "ANSWERABLE") for i in range(40)],
    )
    base = {"adapter": False, "lengths": False, "max_rows": 12}
    base["baselines"] = {"always_clear": True, "minilm": False, "zero_shot": False}

    def scored(sample_seed: int, seed: int) -> list[str]:
        r = _run_without_models({"s": f}, tmp_path, _cfg(**base, sample_seed=sample_seed), seed=seed)
        assert r["sample_seed"] == sample_seed
        preds = (tmp_path / "out" / "predictions.jsonl").read_text().splitlines()
        return sorted(json.loads(x)["id"] for x in preds)

    first = scored(5, seed=1)
    assert len(first) == 12
    assert scored(5, seed=2) == first
    assert scored(6, seed=1) != first


# ---------------------------------------------------------------------------------------------
# The stage without models: absent sets are skipped by name
# ---------------------------------------------------------------------------------------------
def test_missing_set_is_skipped_and_named(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    present = _write(
        tmp_path / "present.jsonl",
        [_task(1, "how much does it cost?", "UNDERSPECIFIED"), _task(2, "how long is the lease?", "ANSWERABLE")],
    )
    cfg = _cfg(adapter=False, lengths=False, baselines={"always_clear": True, "minilm": False, "zero_shot": False})
    out = tmp_path / "out"
    with caplog.at_level("WARNING"):
        r = _run_without_models({"mine": present, "gone_set": tmp_path / "nowhere.jsonl"}, tmp_path, cfg)
    assert "gone_set" in caplog.text and "nowhere.jsonl" in caplog.text
    saved = json.loads((out / "external.json").read_text())
    assert saved == r
    assert saved["skipped"] == ["gone_set"] and saved["scored"] == ["mine"]
    assert saved["sets"]["gone_set"]["status"] == "skipped" and saved["sets"]["gone_set"]["systems"] == {}
    mine = saved["sets"]["mine"]
    assert mine["rows"] == 2 and mine["positives"] == 1 and len(mine["sha256"]) == 64
    assert mine["systems"]["always_clear"]["balanced_accuracy"] == 0.5
    preds = [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]
    assert {(p["set"], p["system"], p["needs"]) for p in preds} == {("mine", "always_clear", False)} and len(preds) == 2
    assert (out / "external.png").read_bytes()[:4] == b"\x89PNG"


def test_cli_succeeds_with_no_set_present(tmp_path: Path) -> None:
    params = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    params["external"]["sets"] = {"a": str(tmp_path / "a.jsonl"), "b": str(tmp_path / "b.jsonl")}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
    out = tmp_path / "out"
    args = ["benchmark", "--train-split", str(tmp_path / "t.parquet"), "--adapter", str(tmp_path / "ad")]
    args += ["--base", str(tmp_path / "base"), "--metrics", str(out / "m.json"), "--predictions"]
    args += [str(out / "p.jsonl"), "--plot", str(out / "p.png"), "--params", str(tmp_path / "params.yaml")]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    saved = json.loads((out / "m.json").read_text())
    assert saved["skipped"] == ["a", "b"] and saved["scored"] == []
    assert "a: skipped" in res.output and (out / "p.jsonl").read_text() == "" and (out / "p.png").exists()
    bad = CliRunner().invoke(app, [*args, "--set", "nopath"])
    assert bad.exit_code == 1 and "NAME=PATH" in bad.output


def test_config_has_no_defaults() -> None:
    with pytest.raises(ValueError, match="sets"):
        ExternalConfig()


# ---------------------------------------------------------------------------------------------
# Slow: the always-CLEAR and MiniLM baselines for real, on a tiny labelled file
# ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_baselines_end_to_end_on_a_tiny_labelled_file(tmp_path: Path) -> None:
    from make_examples import tiny_examples

    from clariedge.io import write_records

    train = tmp_path / "train.parquet"
    write_records(train, tiny_examples(30, seed=2))
    tasks = []
    for i, (a, b) in enumerate([("lease", "loan"), ("phone plan", "tablet plan"), ("visa", "permit")] * 4):
        hist = [
            {"speaker": "user", "text": f"Tell me about the {a} and the {b}."},
            {"speaker": "agent", "text": f"The {a} and the {b} differ in cost and terms."},
        ]
        for j, (turn, label) in enumerate(
            [("How much does it cost?", "UNDERSPECIFIED"), (f"How long does the {a} take to renew?", "ANSWERABLE")]
        ):
            tasks.append(
                {
                    "task_id": f"t{i}{j}<::>2",
                    "input": [*hist, {"speaker": "user", "text": turn}],
                    "contexts": [],
                    "answerability": [label],
                }
            )
    f = _write(tmp_path / "tiny.jsonl", tasks)
    cfg = _cfg(
        adapter=False,
        lengths=False,
        max_rows=None,
        baselines={"always_clear": True, "minilm": True, "zero_shot": False},
    )
    out = tmp_path / "out"
    r = _run_without_models({"tiny": f, "absent": tmp_path / "absent.jsonl"}, tmp_path, cfg, train=train)
    systems = r["sets"]["tiny"]["systems"]
    assert set(systems) == {"always_clear", "minilm"} and r["skipped"] == ["absent"]
    assert systems["always_clear"]["balanced_accuracy"] == 0.5
    m = systems["minilm"]
    assert m["n"] == 24 and m["positives"] == 12 and m["roc_auc"] is not None
    # the turns are worded like the train rows: a classifier that learned anything beats never asking
    assert m["balanced_accuracy"] > 0.5 and m["roc_auc"] > 0.5
    preds = [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(preds) == 48 and all(0.0 <= p["p_ask"] <= 1.0 for p in preds if p["system"] == "minilm")
    assert all((p["p_ask"] >= 0.5) == p["needs"] for p in preds if p["system"] == "minilm")


def test_length_profiles_count_messages_words_and_prompt_tokens(base_model_dir: Path, tmp_path: Path) -> None:
    """The train split's lengths beside a real set's: longer dialogs and passages give longer prompts."""
    from clariedge.training.benchmark import length_profiles

    short = [_task(i, "and the fees?", "ANSWERABLE", history=False) for i in range(4)]
    long = [_task(i, "how does the lease compare on cost?", "UNDERSPECIFIED", docs=True) for i in range(4)]
    rows = {}
    for name, tasks in (("short", short), ("long", long)):
        rows[name] = read_labelled(_write(tmp_path / f"{name}.jsonl", tasks), Rejects())
    prof = length_profiles(rows, base_model_dir, window=None)
    assert prof["short"]["messages"]["median"] == 1 and prof["long"]["messages"]["median"] == 3
    assert prof["short"]["last_turn_words"]["median"] == 3 and prof["long"]["last_turn_words"]["median"] == 7
    short_tokens, long_tokens = prof["short"]["prompt_tokens"]["median"], prof["long"]["prompt_tokens"]["median"]
    assert long_tokens > short_tokens + 20 and prof["short"]["over_window"] is None
    between = length_profiles(rows, base_model_dir, window=int(short_tokens + long_tokens) // 2)
    assert between["short"]["over_window"] == 0.0 and between["long"]["over_window"] == 1.0
