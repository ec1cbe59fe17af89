"""Stage `external`: the adapter and the baselines on real, human-labelled conversations (`clariedge benchmark`).

The pipeline's own test split only shows that the model learned the pipeline's data. This stage scores
the same decision on labelled sets written by people outside the project (by default the three files
in `../shared/data/realdev/`, see its README), or on a user's own labelled logs.

Sets are MTRAG generation-task JSONL (`input` messages, `contexts` documents), read by the same reader
as `clariedge ingest` / `clariedge predict`, plus the label `answerability`: a turn needs a clarifying
question when it holds `UNDERSPECIFIED` (MTRAG-UN's ANSWERABLE, PARTIAL and UNANSWERABLE are "answer").
The label is never model input. A bad line is a reject with file, line and reason (as in `ingest`),
never a crash; a set whose file is absent is skipped, logged, and recorded as skipped.

Systems (each switchable in params):
- `adapter`: the default LoRA adapter's decision from P(CLEAR) at its calibrated threshold, in the same
  reading window as the `evaluate` stage; optionally a few generated questions (`external.generate`).
- `always_clear`: never asks (balanced accuracy 0.5 on any set with both classes: the floor).
- `minilm`: MiniLM embeddings of (last turn, dialog before it, documents) with a logistic regression
  trained on the pipeline's own train split (the `evaluate` stage's classifier).
- `zero_shot`: the base model, the same instruction, no adapter, threshold 0.5.

Scores per set and system (sklearn): balanced accuracy (the sets' share of positives is not natural)
with a seeded, class-stratified bootstrap 95% interval, recall of "ask", the rate of asking on
answerable turns, n, positives, and the ROC AUC of P(ask) where the system has a score.

Inputs:  the labelled JSONL files in `external.sets`, the train split parquet, the adapter folder, the
         base model folder.
Outputs: `metrics/external.json` (DVC metrics), a plot of balanced accuracy per set and system with the
         intervals (PNG), per-row predictions JSONL.
Params:  `external.*` (sets, max_rows, sample_seed, adapter, baselines.*, generate, max_generate, examples,
         bootstrap); `evaluate.max_length`, `evaluate.batch_size`, `evaluate.max_new_tokens`,
         `evaluate.precision`, `evaluate.threads` (the reading window and inference settings of
         `evaluate`); the top-level `seed` (the MiniLM classifier's fit).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import Field

from clariedge.config import StageConfig
from clariedge.io import Rejects, save_figure, write_json, write_jsonl
from clariedge.schema import Document, Message
from clariedge.training.benchmark_systems import Prediction, predict_sets

log = logging.getLogger(__name__)

ASK_LABEL = "UNDERSPECIFIED"
SYSTEMS = ("adapter", "always_clear", "minilm", "zero_shot")  # the order of the plot and the metrics


class ExternalBaselines(StageConfig):
    always_clear: bool = Field(description="the never-ask floor")
    minilm: bool = Field(description="MiniLM + logistic regression trained on the own train split")
    zero_shot: bool = Field(description="the base model with the same instruction, no adapter (costly)")


class ExternalConfig(StageConfig):
    sets: dict[str, str] = Field(description="set name -> labelled MTRAG task JSONL; an absent file is skipped")
    max_rows: int | None = Field(ge=1, description="rows per set at most, stratified by label (null: all)")
    sample_seed: int = Field(
        description="draws the rows scored and the bootstrap resamples; apart from the top-level seed, so that "
        "builds with other seeds are scored on the same rows"
    )
    adapter: bool = Field(description="score the default adapter (costly: one forward pass per row)")
    baselines: ExternalBaselines
    generate: bool = Field(description="generate the adapter's questions for rows it asks about")
    max_generate: int = Field(ge=1, description="questions generated per set at most")
    lengths: bool = Field(description="length profile of the train split and of every set (tokens, messages)")
    examples: int = Field(ge=0, description="example turns the adapter asks about, kept per set in the metrics")
    bootstrap: int = Field(ge=100, description="bootstrap resamples for the 95% interval")


# ---------------------------------------------------------------------------------------------
# Reading labelled sets
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LabelledRow:
    """One judged turn: the model's input (messages, documents) and the gold decision (never input)."""

    id: str
    needs: bool
    label: str
    messages: list[Message]
    documents: list[Document] = field(default_factory=list)
    where: str = ""

    @property
    def last_turn(self) -> str:
        return self.messages[-1].content


def label_of(obj: Mapping[str, Any]) -> tuple[bool, str]:
    """(needs a question, the label as text) from a task's `answerability`; ValueError names the problem."""
    value = obj.get("answerability")
    if value is None:
        raise ValueError(
            "answerability: field required (the label: a list holding UNDERSPECIFIED when the turn needs a "
            'clarifying question, e.g. ["ANSWERABLE"])'
        )
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v.strip() for v in value):
        raise ValueError(f"answerability: expected a non-empty list of label strings, got {str(value)[:60]!r}")
    labels = [v.strip().upper() for v in value]
    return ASK_LABEL in labels, "|".join(labels)


def read_labelled(path: str | Path, rejects: Rejects) -> list[LabelledRow]:
    """Labelled rows of one MTRAG task JSONL; every bad line is a reject (`file:line`, reason), once."""
    from clariedge.ingest import iter_jsonl, read_mtrag_tasks

    path = Path(path)
    labels: dict[int, tuple[bool, str] | ValueError] = {}
    for line, obj in iter_jsonl(path, Rejects()):  # its JSON problems are reported by the task reader below
        try:
            labels[line] = label_of(obj)
        except ValueError as err:
            labels[line] = err
    rows = []
    for seed in read_mtrag_tasks(path, rejects):
        line = seed.source.line or 0
        label = labels.get(line)
        where = f"{path}:{line}"
        if isinstance(label, ValueError) or label is None:
            rejects.add(
                "invalid_label", where, str(label or "answerability: not read"), {"task_id": seed.source.task_id}
            )
            continue
        rows.append(
            LabelledRow(
                id=seed.source.task_id or seed.id,
                needs=label[0],
                label=label[1],
                messages=list(seed.messages),
                documents=list(seed.documents),
                where=where,
            )
        )
    return rows


def sample_rows(rows: Sequence[LabelledRow], max_rows: int | None, seed: int) -> list[LabelledRow]:
    """At most `max_rows` rows keeping the share of positives (seeded); all rows sorted by id otherwise."""
    from clariedge.training.data import stratified_sample

    return stratified_sample(rows, max_rows, random.Random(seed), key=lambda r: r.needs)


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# ---------------------------------------------------------------------------------------------
# Scoring (pure)
# ---------------------------------------------------------------------------------------------
def bootstrap_interval(
    gold: Sequence[bool], needs: Sequence[bool], *, seed: int, n_boot: int, level: float = 0.95
) -> list[float] | None:
    """Percentile bootstrap interval of balanced accuracy, resampling within each class (the class sizes are
    the set's design, not chance); None for an empty set."""
    import numpy as np

    g = np.asarray(gold, dtype=bool)
    correct = g == np.asarray(needs, dtype=bool)
    if not len(g):
        return None
    rng = np.random.default_rng(seed)
    recalls = []
    for cls in (True, False):
        c = correct[g == cls]
        if len(c):
            recalls.append(c[rng.integers(0, len(c), size=(n_boot, len(c)))].mean(axis=1))
    ba = np.mean(recalls, axis=0)
    lo, hi = np.percentile(ba, [100 * (1 - level) / 2, 100 * (1 + level) / 2])
    return [round(float(lo), 4), round(float(hi), 4)]


def score(
    gold: Sequence[bool],
    needs: Sequence[bool],
    p_ask: Sequence[float] | None = None,
    *,
    seed: int,
    n_boot: int,
) -> dict[str, Any]:
    """Decision metrics of one system on one set (positive class: needs a question)."""
    import warnings

    from sklearn.metrics import balanced_accuracy_score, confusion_matrix, recall_score, roc_auc_score

    if len(gold) != len(needs) or (p_ask is not None and len(p_ask) != len(gold)):
        raise ValueError(f"score: {len(gold)} labels, {len(needs)} decisions, {len(p_ask or [])} scores")
    n, positives = len(gold), int(sum(gold))
    out: dict[str, Any] = {"n": n, "positives": positives}
    if not n:
        return {
            **out,
            "balanced_accuracy": None,
            "ci95": None,
            "recall_ask": None,
            "ask_rate_answerable": None,
            "ask_rate": None,
            "accuracy": None,
            "roc_auc": None,
        }
    gold_b, needs_b = [bool(x) for x in gold], [bool(x) for x in needs]
    tn, fp, fn, tp = (int(x) for x in confusion_matrix(gold_b, needs_b, labels=[False, True]).ravel())
    with warnings.catch_warnings():  # one class only: balanced accuracy is that class's recall (sklearn warns)
        warnings.simplefilter("ignore")
        ba = float(balanced_accuracy_score(gold_b, needs_b))
    out["balanced_accuracy"] = round(ba, 4)
    out["ci95"] = bootstrap_interval(gold_b, needs_b, seed=seed, n_boot=n_boot)
    out["recall_ask"] = round(float(recall_score(gold_b, needs_b, zero_division=0)), 4) if positives else None
    out["ask_rate_answerable"] = round(fp / (fp + tn), 4) if fp + tn else None
    out["ask_rate"] = round((tp + fp) / n, 4)
    out["accuracy"] = round((tp + tn) / n, 4)
    out["roc_auc"] = (
        round(float(roc_auc_score(gold_b, list(p_ask))), 4) if p_ask is not None and 0 < positives < n else None
    )
    out["confusion"] = {"tn": tn, "fp": fp, "fn": fn, "tp": tp}
    return out


# ---------------------------------------------------------------------------------------------
# Plot
# ---------------------------------------------------------------------------------------------
def plot(result: Mapping[str, Any], path: str | Path) -> None:
    """Balanced accuracy per set (groups) and system (bars) with the bootstrap 95% intervals; chance at 0.5."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scored = [n for n, s in result["sets"].items() if s["status"] == "scored"]
    systems = [s for s in SYSTEMS if any(s in result["sets"][n]["systems"] for n in scored)]
    fig, ax = plt.subplots(figsize=(max(4.0, 1.6 + 1.4 * len(scored) * max(1, len(systems)) / 2), 3.6))
    width = 0.8 / max(1, len(systems))
    for k, system in enumerate(systems):
        xs, ys, lo, hi = [], [], [], []
        for j, name in enumerate(scored):
            s = result["sets"][name]["systems"].get(system)
            if not s or s["balanced_accuracy"] is None:
                continue
            xs.append(j - 0.4 + width * (k + 0.5))
            ys.append(s["balanced_accuracy"])
            ci = s["ci95"] or [s["balanced_accuracy"]] * 2
            lo.append(s["balanced_accuracy"] - ci[0])
            hi.append(ci[1] - s["balanced_accuracy"])
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=system)
    ax.axhline(0.5, color="grey", linestyle="--", linewidth=1)
    ax.set_xticks(range(len(scored)), [f"{n}\n(n={result['sets'][n]['rows']})" for n in scored])
    ax.set_ylim(0, 1)
    ax.set_ylabel("balanced accuracy (95% CI)")
    skipped = [n for n, s in result["sets"].items() if s["status"] != "scored"]
    title = "external sets" + (f" (skipped: {', '.join(skipped)})" if skipped else "")
    ax.set_title(title if scored else "no external set found: " + ", ".join(skipped or ["none listed"]), fontsize=9)
    if systems:
        ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    save_figure(fig, path)


# ---------------------------------------------------------------------------------------------
# The stage
# ---------------------------------------------------------------------------------------------
def load_sets(
    sets: Mapping[str, str | Path], max_rows: int | None, seed: int
) -> tuple[dict[str, list[LabelledRow]], dict[str, dict[str, Any]]]:
    """Read every set that exists: (name -> sampled rows, name -> its record for the metrics)."""
    rows_by_set: dict[str, list[LabelledRow]] = {}
    info: dict[str, dict[str, Any]] = {}
    for name, path in sets.items():
        path = Path(path)
        if not path.is_file():
            log.warning("external: set %r skipped: %s not found (external.sets.%s in params)", name, path, name)
            info[name] = {"status": "skipped", "path": str(path), "reason": "file not found"}
            continue
        rejects = Rejects()
        rows = read_labelled(path, rejects)
        for r in rejects.rows[:20]:
            log.warning("external: %s: %s: %s", r["where"], r["reason"], r["detail"])
        if len(rejects) > 20:
            log.warning("external: %s: %d more rejected lines", path, len(rejects) - 20)
        picked = sample_rows(rows, max_rows, seed)
        info[name] = {
            "status": "scored" if picked else "empty",
            "path": str(path),
            "sha256": file_sha256(path),
            "rows_read": len(rows),
            "rows": len(picked),
            "positives": sum(r.needs for r in picked),
            "rejected": len(rejects),
            **rejects.counts(),
        }
        if not picked:
            log.warning("external: set %r has no usable labelled row (%d rejected): nothing scored", name, len(rejects))
            continue
        rows_by_set[name] = picked
        log.info("external: %s: %d of %d rows (%d ask)", name, len(picked), len(rows), info[name]["positives"])
    return rows_by_set, info


def run(
    sets: Mapping[str, str | Path],
    train_path: str | Path,
    adapter_dir: str | Path,
    base_dir: str | Path,
    metrics_path: str | Path,
    predictions_path: str | Path,
    plot_path: str | Path,
    cfg: ExternalConfig,
    *,
    seed: int,
    max_length: int | None,
    batch_size: int,
    max_new_tokens: int,
    precision: str,
    threads: int | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Score every enabled system on every labelled set present; write metrics, plot and per-row predictions."""
    from clariedge.training.data import load_examples

    t_start = time.perf_counter()
    rows_by_set, info = load_sets(sets, cfg.max_rows, cfg.sample_seed)
    train_rows = functools.cache(lambda: load_examples(train_path))  # read once, by the systems that need it
    lm = {"max_length": max_length, "batch_size": batch_size, "max_new_tokens": max_new_tokens, "precision": precision}
    passes = predict_sets(
        rows_by_set, train_rows, adapter_dir, base_dir, cfg, lm, seed=seed, threads=threads, progress=progress
    )

    # ---- how long the conversations are: the real sets beside the own train split ---------------------------
    lengths: dict[str, Any] = {}
    if rows_by_set and cfg.lengths:
        window = passes.window.get("max_length") or max_length
        lengths = length_profiles({"train": train_rows(), **rows_by_set}, base_dir, window)

    # ---- score and write --------------------------------------------------------------------------------
    for name, rows in rows_by_set.items():
        info[name]["systems"] = score_set(rows, passes.decisions[name], passes.questions.get(name), cfg)
    for name in info:
        info[name].setdefault("systems", {})
    passes.timing["total_s"] = round(time.perf_counter() - t_start, 1)
    result = {
        "sets": info,
        "scored": sorted(rows_by_set),
        "skipped": sorted(n for n, s in info.items() if s["status"] != "scored"),
        "max_rows": cfg.max_rows,
        "sample_seed": cfg.sample_seed,
        **passes.window,
        "lengths": lengths,
        "timing": passes.timing,
    }
    write_json(metrics_path, result)
    write_jsonl(predictions_path, prediction_rows(rows_by_set, passes.decisions, passes.questions))
    plot(result, plot_path)
    return result


def score_set(
    rows: Sequence[LabelledRow],
    decisions: Mapping[str, Prediction],
    questions: Mapping[int, str | None] | None,
    cfg: ExternalConfig,
) -> dict[str, dict[str, Any]]:
    """Every system's scores on one set (in the order of `SYSTEMS`), the adapter's with example turns."""
    gold = [r.needs for r in rows]
    systems = {}
    for system in SYSTEMS:
        if system in decisions:
            needs, p_ask = decisions[system]
            systems[system] = score(gold, needs, p_ask, seed=cfg.sample_seed, n_boot=cfg.bootstrap)
    if "adapter" in systems:
        systems["adapter"]["examples"] = examples(rows, decisions["adapter"][0], questions, cfg.examples)
    return systems


def length_profiles(
    groups: Mapping[str, Sequence[Any]], base_dir: str | Path, window: int | None
) -> dict[str, dict[str, Any]]:
    """Per group of rows (the train split, each real set): messages per row, words of the last turn, and the
    model tokens of the whole prompt (chat template, instruction, dialog, passages) before any cut, as median
    and 90th percentile, plus the share of prompts longer than the reading `window`."""
    import numpy as np
    from transformers import AutoTokenizer

    from clariedge.training.data import ANSWER_PREFIX, encode_prompt

    tok = AutoTokenizer.from_pretrained(str(base_dir))
    answer_prefix = len(tok(ANSWER_PREFIX, add_special_tokens=False)["input_ids"])  # ends the prompt, not counted

    def stats(values: Sequence[int]) -> dict[str, float]:
        return {"median": float(np.median(values)), "p90": float(np.percentile(values, 90))}

    out: dict[str, dict[str, Any]] = {}
    for name, rows in groups.items():
        if not rows:
            continue
        # a budget no prompt reaches: nothing is cut, the whole rendered prompt is counted
        tokens = [len(encode_prompt(tok, r.messages, r.documents, max_prompt=10**9).ids) - answer_prefix for r in rows]
        out[name] = {
            "rows": len(rows),
            "messages": stats([len(r.messages) for r in rows]),
            "last_turn_words": stats([len(r.messages[-1].content.split()) for r in rows]),
            "prompt_tokens": stats(tokens),
            "over_window": round(sum(t > window for t in tokens) / len(tokens), 4) if window else None,
        }
    return out


def examples(
    rows: Sequence[LabelledRow], needs: Sequence[bool], questions: Mapping[int, str | None] | None, k: int
) -> list[dict[str, Any]]:
    """The first `k` turns (by id) the system asks about: the turn, whether it needed a question, the question."""
    out = []
    for i in [i for i, n in enumerate(needs) if n][:k]:
        ex: dict[str, Any] = {"id": rows[i].id, "turn": rows[i].last_turn[:200], "gold_ask": rows[i].needs}
        if questions is not None and i in questions:
            ex["question"] = questions[i]
        out.append(ex)
    return out


def prediction_rows(
    rows_by_set: Mapping[str, Sequence[LabelledRow]],
    decisions: Mapping[str, Mapping[str, Prediction]],
    questions: Mapping[str, Mapping[int, str | None]],
) -> list[dict[str, Any]]:
    out = []
    for name, rows in rows_by_set.items():
        for system, (needs, p_ask) in decisions[name].items():
            for i, r in enumerate(rows):
                row: dict[str, Any] = {
                    "set": name,
                    "system": system,
                    "id": r.id,
                    "gold": r.needs,
                    "label": r.label,
                    "needs": needs[i],
                }
                if p_ask is not None:
                    row["p_ask"] = p_ask[i]
                if system == "adapter" and i in questions.get(name, {}):
                    row["clarification"] = questions[name][i]
                out.append(row)
    return sorted(out, key=lambda x: (x["set"], x["system"], x["id"]))
