"""Stage `publish`: ClariEdge-style train/validation/test splits as a Hugging Face dataset, parquet and chat JSONL.

Inputs:  cleaned examples (parquet, `Example` rows, `data/cleaned.parquet`); optionally the clean
         stage's stats JSON (`metrics/clean.json`) for the card (its counts, and its `category_warnings`
         as a warning section near the top).
Outputs: `data/clariedge/` (`DatasetDict.save_to_disk`: splits train/validation/test with typed
         features, and the dataset card `README.md` with the YAML header the Hub reads, rendered by
         `clariedge.dataset_card`);
         `data/clariedge-parquet/{split}.parquet` (the same rows, byte-identical for the same inputs
         and seed; `category`/`setting` as strings there, so a row reads back as an `Example` plus
         `target`: train and evaluate read these); `data/clariedge-chat/{split}.jsonl` (the model's chat format, built by
         `clariedge.chat_format`); stats JSON.
Params:  `publish.ratios` (train/validation/test), `publish.include_review_status`,
         `publish.pretty_name`, `publish.license`, `publish.hub_repo`, `publish.hub_private`;
         the top-level `seed`. The Hub token comes from the environment (`HF_TOKEN`), read by the CLI.

Splits are grouped by `conversation_id` (rows stitched onto another conversation carry that
conversation's id, so they follow it) and stratified by category x setting: conversations are taken
largest first (ties in a seeded order) and each goes to the split whose per-stratum counts it brings
closest to the target ratios (least squared relative error). Deterministic for a given seed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import shutil
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from clariedge.chat_format import build_messages, target_json
from clariedge.config import StageConfig
from clariedge.dataset_card import render_card
from clariedge.io import atomic_path, read_records, write_json, write_jsonl
from clariedge.schema import CATEGORIES, SETTINGS, Example, Provenance, ReviewStatus

log = logging.getLogger(__name__)

SPLITS = ("train", "validation", "test")


class Ratios(StageConfig):
    train: float = Field(gt=0, lt=1)
    validation: float = Field(ge=0, lt=1)
    test: float = Field(ge=0, lt=1)

    @model_validator(mode="after")
    def _sum_to_one(self) -> Ratios:
        total = self.train + self.validation + self.test
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"ratios must sum to 1, got {total:.4f}")
        return self


class PublishConfig(StageConfig):
    """params.yaml `publish:`; see the module docstring."""

    ratios: Ratios
    include_review_status: list[ReviewStatus]
    pretty_name: str
    license: str
    hub_repo: str | None
    hub_private: bool


def stratum(ex: Example) -> str:
    return f"{ex.category}|{ex.setting}"


# ---------------------------------------------------------------------------------------------
# Split assignment
# ---------------------------------------------------------------------------------------------
def assign_splits(rows: list[Example], ratios: Ratios, rng: random.Random) -> dict[str, str]:
    """conversation_id -> split: grouped by conversation, greedy stratification by category x setting."""
    groups: dict[str, Counter[str]] = defaultdict(Counter)
    for ex in rows:
        groups[ex.conversation_id][stratum(ex)] += 1
    keys = sorted({k for g in groups.values() for k in g}) + ["__rows__"]
    for g in groups.values():
        g["__rows__"] = sum(g.values())
    total = Counter()
    for g in groups.values():
        total.update(g)
    share = {"train": ratios.train, "validation": ratios.validation, "test": ratios.test}
    target = {s: {k: share[s] * total[k] for k in keys} for s in SPLITS}
    current = {s: Counter() for s in SPLITS}

    order = sorted(groups)
    rng.shuffle(order)
    order.sort(key=lambda c: -groups[c]["__rows__"])  # stable: equal sizes keep the seeded order
    out: dict[str, str] = {}
    for conv in order:
        g = groups[conv]
        best, best_cost = None, None
        for s in SPLITS:
            if share[s] == 0:
                continue
            # change in squared relative error if `conv` goes to split s
            cost = 0.0
            for k, n in g.items():
                t = max(target[s][k], 1e-9)
                before, after = current[s][k] - t, current[s][k] + n - t
                cost += (after * after - before * before) / t
            if best_cost is None or cost < best_cost - 1e-12:
                best, best_cost = s, cost
        out[conv] = best
        current[best].update(g)
    return out


# ---------------------------------------------------------------------------------------------
# Features and tables
# ---------------------------------------------------------------------------------------------
def dataset_features():
    """The typed `datasets.Features` of every split."""
    from datasets import ClassLabel, Features, List, Value

    string = Value("string")
    return Features(
        {
            "id": string,
            "conversation_id": string,
            "domain": string,
            "setting": ClassLabel(names=list(SETTINGS)),
            "category": ClassLabel(names=list(CATEGORIES)),
            "messages": List({"role": string, "content": string}),
            "documents": List({"doc_id": string, "title": string, "text": string}),
            "needs_clarification": Value("bool"),
            "clarification": string,
            "target": string,
            "interpretations": List(string),
            "resolution": string,
            "label_quality": Value("float64"),
            "review_status": string,
            "provenance": {k: string for k in Provenance.model_fields if k != "score"},  # as `to_row` keeps it
        }
    )


def parquet_features():
    """The features of the per-split parquet files: as `dataset_features`, but `category` and `setting`
    stay strings, so each row reads back as an `Example` (plus `target`) for train/evaluate."""
    from datasets import Value

    features = dataset_features()
    features["category"] = Value("string")
    features["setting"] = Value("string")
    return features


def parquet_table(examples: list[Example]):
    """The Arrow table written to `{split}.parquet` (with the Hugging Face feature metadata)."""
    import pyarrow as pa

    rows = [to_row(ex) | {"category": ex.category, "setting": ex.setting} for ex in examples]
    return pa.Table.from_pylist(rows, schema=parquet_features().arrow_schema)


def to_row(ex: Example) -> dict[str, Any]:
    """A dataset row (class labels as their integer ids, as `ClassLabel` stores them)."""
    prov = ex.provenance.model_dump()
    prov.pop("score", None)
    return {
        "id": ex.id,
        "conversation_id": ex.conversation_id,
        "domain": ex.domain,
        "setting": SETTINGS.index(ex.setting),
        "category": CATEGORIES.index(ex.category),
        "messages": [m.model_dump() for m in ex.messages],
        "documents": [d.model_dump() for d in ex.documents],
        "needs_clarification": ex.needs_clarification,
        "clarification": ex.clarification,
        "target": target_json(ex),
        "interpretations": list(ex.interpretations),
        "resolution": ex.resolution,
        "label_quality": ex.label_quality,
        "review_status": ex.review_status,
        "provenance": prov,
    }


def chat_row(ex: Example) -> dict[str, Any]:
    """One line of the chat export: what training and inference feed the model."""
    return {
        "id": ex.id,
        "messages": build_messages(ex.messages, ex.documents),
        "documents": [{"doc_id": d.doc_id, "title": d.title, "text": d.text} for d in ex.documents],
        "target": target_json(ex),
        "category": ex.category,
        "setting": ex.setting,
    }


def build_dataset_dict(splits: dict[str, list[Example]]):
    """A `DatasetDict` with a content-derived fingerprint (so `save_to_disk` output is reproducible)."""
    import pyarrow as pa
    from datasets import Dataset, DatasetDict, DatasetInfo, NamedSplit

    features = dataset_features()
    out = {}
    for name in SPLITS:
        rows = [to_row(ex) for ex in splits[name]]
        table = pa.Table.from_pylist(rows, schema=features.arrow_schema)
        fingerprint = hashlib.sha256(json.dumps([r["id"] for r in rows]).encode()).hexdigest()[:16]
        info = DatasetInfo(features=features, license="apache-2.0")
        out[name] = Dataset(table, info=info, split=NamedSplit(name), fingerprint=f"{name}-{fingerprint}")
    return DatasetDict(out)


# ---------------------------------------------------------------------------------------------
# The pure core
# ---------------------------------------------------------------------------------------------
def transform(
    rows: list[Example], cfg: PublishConfig, *, rng: random.Random
) -> tuple[dict[str, list[Example]], dict[str, Any]]:
    """Filter by review status, assign splits; rows in each split sorted by (conversation_id, id)."""
    keep = [ex for ex in rows if ex.review_status in cfg.include_review_status]
    excluded = Counter(ex.review_status for ex in rows if ex.review_status not in cfg.include_review_status)
    assignment = assign_splits(keep, cfg.ratios, rng)
    splits: dict[str, list[Example]] = {s: [] for s in SPLITS}
    for ex in keep:
        splits[assignment[ex.conversation_id]].append(ex)
    for s in SPLITS:
        splits[s].sort(key=lambda e: (e.conversation_id, e.id))
    stats = split_stats(splits)
    stats.update(rows_in=len(rows), rows_out=len(keep))
    stats.update({f"excluded_{k}": v for k, v in sorted(excluded.items())})
    return splits, stats


def split_stats(splits: dict[str, list[Example]]) -> dict[str, Any]:
    """Counts per split, category and setting, and the worst stratum-share deviation from the whole."""
    everything = [ex for s in SPLITS for ex in splits[s]]
    overall = Counter(stratum(ex) for ex in everything)
    n = max(1, len(everything))
    stats: dict[str, Any] = {"rows": {s: len(splits[s]) for s in SPLITS}}
    stats["conversations"] = {s: len({ex.conversation_id for ex in splits[s]}) for s in SPLITS}
    stats["by_split_category_setting"] = {
        s: dict(sorted(Counter(stratum(ex) for ex in splits[s]).items())) for s in SPLITS
    }
    dev = 0.0
    for s in SPLITS:
        m = len(splits[s])
        if not m:
            continue
        c = Counter(stratum(ex) for ex in splits[s])
        dev = max(dev, *(abs(c[k] / m - overall[k] / n) for k in overall))
    stats["max_stratum_share_deviation"] = round(dev, 4)
    return stats


# ---------------------------------------------------------------------------------------------
# I/O
# ---------------------------------------------------------------------------------------------
def run(
    in_path: str | Path,
    out_dir: str | Path,
    parquet_dir: str | Path,
    chat_dir: str | Path,
    cfg: PublishConfig,
    *,
    seed: int,
    stats_path: str | Path | None = None,
    clean_stats_path: str | Path | None = None,
    hub_token: str | None = None,
) -> dict[str, Any]:
    """Read the cleaned rows; write the DatasetDict + card, the parquet and chat files, the stats."""
    import pyarrow.parquet as pq

    rows = read_records(in_path, Example)
    splits, stats = transform(rows, cfg, rng=random.Random(seed))
    if not any(splits.values()):
        raise ValueError(f"{in_path}: no rows to publish (review statuses kept: {cfg.include_review_status})")
    dd = build_dataset_dict(splits)
    clean_stats = None
    if clean_stats_path and Path(clean_stats_path).exists():
        clean_stats = json.loads(Path(clean_stats_path).read_text(encoding="utf-8"))
    card = render_card(dd, splits, cfg, clean_stats)

    out_dir = Path(out_dir)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    dd.save_to_disk(str(tmp))
    (tmp / "README.md").write_text(card, encoding="utf-8")
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)

    for s in SPLITS:
        with atomic_path(Path(parquet_dir) / f"{s}.parquet") as p:
            pq.write_table(parquet_table(splits[s]), p, compression="zstd")
        write_jsonl(Path(chat_dir) / f"{s}.jsonl", (chat_row(ex) for ex in splits[s]))
    if stats_path:
        write_json(stats_path, stats)
    log.info(
        "publish: %s rows per split, max stratum deviation %.3f", stats["rows"], stats["max_stratum_share_deviation"]
    )
    if cfg.hub_repo and hub_token:
        push_to_hub(dd, card, cfg.hub_repo, hub_token, private=cfg.hub_private)
        stats["pushed_to"] = cfg.hub_repo
    elif cfg.hub_repo:
        log.warning("publish: publish.hub_repo is set but HF_TOKEN is not: not pushing")
    return stats


def push_to_hub(dd, card: str, repo: str, token: str, *, private: bool = True) -> None:
    """Upload the splits (as `data/{split}-*.parquet`) and the card to a Hub dataset repository."""
    from huggingface_hub import HfApi

    dd.push_to_hub(repo, token=token, private=private)
    HfApi(token=token).upload_file(
        path_or_fileobj=card.encode("utf-8"), path_in_repo="README.md", repo_id=repo, repo_type="dataset"
    )
