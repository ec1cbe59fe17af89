"""Publishing: grouped, stratified splits; reproducible files; a card whose counts match; load_from_disk."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest
import yaml
from conftest import params_section, write_params
from make_examples import tiny_examples

from clariedge.chat_format import build_messages, target_json
from clariedge.config import ConfigError, load_section
from clariedge.io import read_table, write_records
from clariedge.publish import SPLITS, PublishConfig, dataset_features, parquet_features, run, stratum, transform
from clariedge.schema import Example


@pytest.fixture(scope="module")
def rows():
    # 200 conversations of 2-5 rows (all four categories, both settings), plus rows stitched onto
    # another conversation: they carry the host conversation's id and must follow it
    base = tiny_examples(200, seed=1)
    stitched = [
        ex.model_copy(update={"conversation_id": base[i + 7].conversation_id, "id": ""})
        for i, ex in enumerate(base[:20])
    ]
    return base + [ex.model_validate(ex.model_dump()) for ex in stitched]


def test_splits_are_grouped_and_stratified(rows):
    splits, stats = transform(rows, params_section("publish"), rng=random.Random(3))
    convs = {s: {ex.conversation_id for ex in splits[s]} for s in SPLITS}
    assert not convs["train"] & convs["validation"]
    assert not convs["train"] & convs["test"]
    assert not convs["validation"] & convs["test"]
    assert sum(len(v) for v in splits.values()) == len(rows)
    n = len(rows)
    for s, ratio in zip(SPLITS, (0.7, 0.15, 0.15), strict=True):
        assert abs(len(splits[s]) / n - ratio) < 0.02, (s, len(splits[s]))
    overall = Counter(stratum(ex) for ex in rows)
    for s in SPLITS:
        c = Counter(stratum(ex) for ex in splits[s])
        for k in overall:
            # tolerance: a validation split of ~100 rows in 30 conversations of 2-5 rows
            assert abs(c[k] / len(splits[s]) - overall[k] / n) < 0.04, (s, k)
    print(f"\nmax stratum share deviation {stats['max_stratum_share_deviation']}")
    assert stats["max_stratum_share_deviation"] < 0.04


def test_assignment_is_seeded(rows):
    a, _ = transform(rows, params_section("publish"), rng=random.Random(1))
    b, _ = transform(rows, params_section("publish"), rng=random.Random(1))
    c, _ = transform(rows, params_section("publish"), rng=random.Random(2))
    ids = {s: [ex.id for ex in a[s]] for s in SPLITS}
    assert ids == {s: [ex.id for ex in b[s]] for s in SPLITS}
    assert ids != {s: [ex.id for ex in c[s]] for s in SPLITS}


def test_review_status_filter(rows):
    marked = [
        ex.model_copy(update={"review_status": "pending" if i % 10 == 0 else "unreviewed"}) for i, ex in enumerate(rows)
    ]
    splits, stats = transform(marked, params_section("publish"), rng=random.Random(0))
    pending = sum(1 for ex in marked if ex.review_status == "pending")
    assert stats["excluded_pending"] == pending
    assert sum(len(v) for v in splits.values()) == len(rows) - pending


def test_ratios_are_validated(tmp_path):
    params = tmp_path / "params.yaml"
    write_params(params, publish={"ratios": {"train": 0.8, "validation": 0.15, "test": 0.15}})
    with pytest.raises(ConfigError, match="publish.ratios: .*sum to 1"):
        load_section(params, "publish", PublishConfig)


def _publish(tmp_path, rows, name: str, seed: int = 11):
    src = tmp_path / "cleaned.parquet"
    if not src.exists():
        write_records(src, rows)
    d = tmp_path / name
    stats = run(
        src,
        d / "clariedge",
        d / "parquet",
        d / "chat",
        params_section("publish"),
        seed=seed,
        stats_path=d / "publish.json",
    )
    return d, stats


def _files(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_run_is_byte_identical_and_loads(tmp_path, rows):
    from datasets import ClassLabel, Dataset, DatasetDict, load_from_disk

    a, stats = _publish(tmp_path, rows, "a")
    b, _ = _publish(tmp_path, rows, "b")
    files_a, files_b = _files(a), _files(b)
    assert set(files_a) == set(files_b)
    assert {k for k in files_a if k.startswith("parquet/")} == {f"parquet/{s}.parquet" for s in SPLITS}
    for k in files_a:
        assert files_a[k] == files_b[k], k

    dd = load_from_disk(str(a / "clariedge"))
    assert isinstance(dd, DatasetDict) and list(dd) == list(SPLITS)
    assert dd["train"].features == dataset_features()
    assert isinstance(dd["train"].features["category"], ClassLabel)
    assert {s: dd[s].num_rows for s in SPLITS} == stats["rows"]
    # the parquet beside it: the same rows, typed features, labels as strings; each row is an Example
    pq_ds = Dataset.from_parquet(str(a / "parquet" / "test.parquet"))
    assert pq_ds.features == parquet_features() and pq_ds["id"] == dd["test"]["id"]
    back = [
        Example.model_validate({k: v for k, v in r.items() if k in Example.model_fields})
        for r in read_table(a / "parquet" / "test.parquet")
    ]
    by_id = {ex.id: ex for ex in rows}
    assert [ex.model_dump(exclude={"label_quality", "annotations"}) for ex in back] == [
        by_id[ex.id].model_dump(exclude={"label_quality", "annotations"}) for ex in back
    ]
    # round trip of one row, and its chat line
    row = dd["test"][0]
    ex = by_id[row["id"]]
    assert dd["test"].features["category"].int2str(row["category"]) == ex.category
    assert row["messages"] == [m.model_dump() for m in ex.messages]
    assert json.loads(row["target"]) == ex.target
    chat = [json.loads(line) for line in (a / "chat" / "test.jsonl").read_text().splitlines()]
    assert [c["id"] for c in chat] == dd["test"]["id"]
    assert chat[0]["messages"] == build_messages(ex.messages, ex.documents)
    assert chat[0]["target"] == target_json(ex)


def test_card_counts_match_the_data(tmp_path, rows):
    from datasets import load_from_disk

    d, _ = _publish(tmp_path, rows, "card")
    text = (d / "clariedge" / "README.md").read_text()
    _, header, body = text.split("---\n", 2)
    meta = yaml.safe_load(header)
    dd = load_from_disk(str(d / "clariedge"))
    assert meta["license"] == "apache-2.0"
    assert {s["name"]: s["num_examples"] for s in meta["dataset_info"]["splits"]} == {s: dd[s].num_rows for s in SPLITS}
    assert [f["split"] for f in meta["configs"][0]["data_files"]] == list(SPLITS)
    assert [f["name"] for f in meta["dataset_info"]["features"]] == list(dataset_features())
    # the counts table: one line per category x setting present, per split
    table = {}
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 6 and cells[1] in ("pre_retrieval", "post_retrieval"):
            table[(cells[0], cells[1])] = [int(x) for x in cells[2:]]
    for (cat, setting), counts in table.items():
        for s, n in zip(SPLITS, counts[:3], strict=True):
            feats = dd[s].features
            actual = sum(
                1
                for c, st in zip(dd[s]["category"], dd[s]["setting"], strict=True)
                if feats["category"].int2str(c) == cat and feats["setting"].int2str(st) == setting
            )
            assert actual == n, (cat, setting, s)
        assert counts[3] == sum(counts[:3])
    assert sum(sum(v[:3]) for v in table.values()) == len(rows)
    assert "**Unreviewed.**" in body and "construct" in body
    assert "## Warning" not in body  # no clean stats, no category warning


def test_card_shows_clean_category_warnings(tmp_path, rows):
    # metrics/clean.json as the clean stage writes it when a category's labels look wrong as a whole
    n_docs = sum(ex.category == "ambiguous_documents" for ex in rows)
    warning = {
        "category": "ambiguous_documents",
        "rows": n_docs,
        "median_label_quality": 0.33,
        "others_median_label_quality": 0.69,
        "ratio": 0.4783,
    }
    clean_stats = {"label": "needs_clarification", "policy": "send_back", "rows_in": len(rows), "flagged": 40}
    clean_stats |= {"sent_back": 40, "sent_back_first": 24, "category_warnings": [warning]}
    (tmp_path / "clean.json").write_text(json.dumps(clean_stats))
    src = tmp_path / "cleaned.parquet"
    write_records(src, rows)
    d = tmp_path / "warned"
    out = (d / "clariedge", d / "parquet", d / "chat")
    run(src, *out, params_section("publish"), seed=11, clean_stats_path=tmp_path / "clean.json")
    body = (d / "clariedge" / "README.md").read_text().split("---\n", 2)[2]
    # its own section, before the counts, naming the category with its numbers
    assert "## Warning: label quality" in body
    assert body.index("## Warning: label quality") < body.index("## Counts")
    section = body[body.index("## Warning: label quality") : body.index("## Counts")]
    assert f"| `ambiguous_documents` | {n_docs} | {n_docs} | 0.330 | 0.690 | 0.48 |" in section
    assert "24 of their rows were sent back to review first" in section
    # clean stats without warnings (or from before they existed): no section
    (tmp_path / "clean.json").write_text(json.dumps({**clean_stats, "category_warnings": []}))
    d2 = tmp_path / "quiet"
    out = (d2 / "clariedge", d2 / "parquet", d2 / "chat")
    run(src, *out, params_section("publish"), seed=11, clean_stats_path=tmp_path / "clean.json")
    assert "## Warning" not in (d2 / "clariedge" / "README.md").read_text()


def test_cli_publish(tmp_path, rows):
    from typer.testing import CliRunner

    from clariedge.cli import app

    src = tmp_path / "cleaned.parquet"
    write_records(src, rows)
    params = tmp_path / "params.yaml"
    write_params(params, seed=5, publish={"ratios": {"train": 0.8, "validation": 0.1, "test": 0.1}})
    res = CliRunner().invoke(
        app,
        [
            "publish",
            str(src),
            "-o",
            str(tmp_path / "ds"),
            "--parquet-dir",
            str(tmp_path / "pq"),
            "--chat-dir",
            str(tmp_path / "chat"),
            "--stats",
            str(tmp_path / "publish.json"),
            "--params",
            str(params),
        ],
    )
    assert res.exit_code == 0, res.output
    stats = json.loads((tmp_path / "publish.json").read_text())
    assert abs(stats["rows"]["train"] / len(rows) - 0.8) < 0.03
    paths = ["-o", str(tmp_path / "ds2"), "--parquet-dir", str(tmp_path / "pq2"), "--chat-dir", str(tmp_path / "c2")]
    missing = CliRunner().invoke(app, ["publish", str(tmp_path / "nope.parquet"), *paths, "--params", str(params)])
    assert missing.exit_code == 1 and "nope.parquet" in missing.output
