"""Stage `evaluate`: the trained adapter and the baselines on the test split, in one run.

Systems: `adapter` (the default LoRA variant), `zero_shot` and `few_shot` (the base model prompted
with the same system instruction, without an adapter; few-shot adds k worked examples from the
train split), and `minilm` (MiniLM sentence embeddings of the last turn, the dialog before it and
the documents, with a logistic regression trained on the train split: classification only).

How the language models are scored: the prompt ends with the answer prefix `{"clarification": "`,
so one forward pass gives P(CLEAR) (the probability of `CLEAR`'s first token); the decision is "ask"
when it is below the threshold (the adapter's, calibrated on the validation split; 0.5 for the
prompted baselines). A question is then generated (greedy, `max_new_tokens`, `CLEAR` forbidden
as the first token) only for the rows flagged, and scored against the reference on the rows where
both ask. Unparseable answers are counted, never fatal.

Inputs:  the test split, the train split (few-shot examples, the MiniLM classifier), the adapter
         folder, the base model folder.
Outputs: `metrics/eval.json` (DVC metrics), per-row predictions JSONL, plots: confusion matrices
         (PNG) and `classes.csv` (actual/predicted for DVC's confusion template).
Params:  `evaluate.*` (max_rows, batch_size, max_new_tokens, generate, embed_cache, baselines.*,
         llm_judge.*) and the top-level `seed`.
"""

from __future__ import annotations

import functools
import json
import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import Field

from clariedge.chat_format import CLEAR
from clariedge.config import StageConfig
from clariedge.io import save_figure, write_json, write_jsonl, write_text
from clariedge.schema import Example
from clariedge.training import metrics as M
from clariedge.training.data import load_examples, stratified_sample
from clariedge.training.infer import Precision
from clariedge.training.judge import JudgeSettings, llm_judge

log = logging.getLogger(__name__)


class BaselineSettings(StageConfig):
    zero_shot: bool
    few_shot: bool
    few_shot_k: int = Field(ge=1, le=16)
    minilm: bool
    max_rows: int | None = Field(ge=1, description="cap on test rows for the prompted baselines (stratified)")
    generate: bool = Field(description="generate the prompted baselines' questions (wording metrics)")
    max_generate: int | None = Field(ge=1, description="questions generated per baseline at most (flagged rows)")


class EvaluateConfig(StageConfig):
    max_rows: int | None = Field(ge=1, description="cap on test rows (stratified by category x setting)")
    batch_size: int = Field(ge=1)
    max_new_tokens: int = Field(ge=4)
    max_length: int | None = Field(ge=64, description="prompt cap; null: the adapter's training max_length")
    generate: bool = Field(description="generate questions for flagged rows (wording metrics)")
    max_generate: int | None = Field(ge=1, description="questions generated at most (flagged rows, by id)")
    embed_cache: str | None = Field(description="this stage's MiniLM embedding cache, a DVC out (null: no cache)")
    threads: int | None = Field(ge=1)
    precision: Precision = Field(
        description="inference precision; auto: bf16 where the hardware has it natively, else fp32"
    )
    baselines: BaselineSettings
    llm_judge: JudgeSettings


# ---------------------------------------------------------------------------------------------
# Scoring one system
# ---------------------------------------------------------------------------------------------
def score(
    rows: Sequence[Example],
    needs: Sequence[bool],
    questions: dict[int, str | None] | None = None,
    *,
    embed_fn: Callable[[list[str]], Any] | None = None,
) -> dict[str, Any]:
    """Decision metrics for `needs`, and wording metrics for `questions` (row index -> generated question)."""
    gold = [r.needs_clarification for r in rows]
    out = M.classification(gold, needs)
    out["fp_rate_hard_negatives"] = M.false_positive_rate([r.category for r in rows], needs)
    out["accuracy_by_category"] = M.accuracy_by([r.category for r in rows], gold, needs)
    out["accuracy_by_setting"] = M.accuracy_by([r.setting for r in rows], gold, needs)
    if questions is not None:
        out["quality"] = quality(rows, questions, embed_fn=embed_fn)
    return out


def quality(
    rows: Sequence[Example], questions: dict[int, str | None], *, embed_fn: Callable[[list[str]], Any] | None = None
) -> dict[str, Any]:
    """Wording against the reference, over the rows where the gold and the system both ask a question."""
    pairs = [(i, q) for i, q in sorted(questions.items()) if q and q != CLEAR and rows[i].needs_clarification]
    out: dict[str, Any] = {"rows": len(pairs)}
    if not pairs:
        return {
            **out,
            "rouge_l": None,
            "embedding_similarity": None,
            "interpretation_coverage": None,
            "gold_interpretation_coverage": None,
        }
    refs = [rows[i].clarification or "" for i, _ in pairs]
    preds = [q for _, q in pairs]
    out["rouge_l"] = M.mean([M.rouge_l(p, r) for p, r in zip(preds, refs, strict=True)])
    if embed_fn is not None:
        a, b = embed_fn(preds), embed_fn(refs)
        out["embedding_similarity"] = M.mean([float(x) for x in (a * b).sum(axis=1)])
    else:
        out["embedding_similarity"] = None
    out["interpretation_coverage"] = M.mean([M.interpretation_coverage(p, rows[i].interpretations) for (i, p) in pairs])
    # the same measure on the reference questions: the ceiling the references themselves reach
    out["gold_interpretation_coverage"] = M.mean(
        [M.interpretation_coverage(r, rows[i].interpretations) for (i, _), r in zip(pairs, refs, strict=True)]
    )
    return out


# ---------------------------------------------------------------------------------------------
# The systems
# ---------------------------------------------------------------------------------------------
def lm_predictions(
    clarifier: Any, rows: Sequence[Example], *, generate: bool, max_generate: int | None = None
) -> dict[str, Any]:
    """First-token decisions for every row, questions for the flagged rows; timings and parse failures."""
    items = [(r.messages, r.documents or None) for r in rows]
    t0 = time.perf_counter()
    first = clarifier.decide(items)
    t_cls = time.perf_counter() - t0
    needs = [n for _, n in first]
    questions: dict[int, str | None] = {}
    raws: dict[int, str] = {}
    unparseable = 0
    t1 = time.perf_counter()
    if generate:
        from clariedge.chat_format import parse_answer

        flagged = [i for i, n in enumerate(needs) if n][:max_generate]
        texts = clarifier.generate([items[i] for i in flagged], question=True) if flagged else []
        for i, raw in zip(flagged, texts, strict=True):
            value = parse_answer(raw)
            raws[i] = raw
            if value is None:
                unparseable += 1
            questions[i] = value
    t_gen = time.perf_counter() - t1
    return {
        "needs": needs,
        "p_clear": [round(p, 5) for p, _ in first],
        "questions": questions if generate else None,
        "raws": raws,
        "unparseable": unparseable,
        "classify_s": round(t_cls, 1),
        "generate_s": round(t_gen, 1),
    }


def few_shot_block(train_rows: Sequence[Example], k: int, rng: random.Random, max_doc_chars: int = 160) -> str:
    """k worked examples (one per category in turn, the shortest dialogs) as text for the system message."""
    by_cat: dict[str, list[Example]] = {}
    for r in sorted(train_rows, key=lambda r: r.id):
        by_cat.setdefault(r.category, []).append(r)
    picks: list[Example] = []
    cats = sorted(by_cat)
    pools = {
        c: sorted(by_cat[c], key=lambda r: (len(r.messages), sum(len(m.content) for m in r.messages)))[:20]
        for c in cats
    }
    for c in cats:
        rng.shuffle(pools[c])
    i = 0
    while len(picks) < k and any(pools.values()):
        c = cats[i % len(cats)]
        if pools[c]:
            picks.append(pools[c].pop())
        i += 1
    parts = ["Examples of the task:"]
    for n, ex in enumerate(picks, 1):
        lines = [f"Example {n}:"]
        for d in ex.documents[:3]:
            lines.append(f"[document: {d.title}] {d.text[:max_doc_chars]}")
        lines.extend(f"{m.role}: {m.content}" for m in ex.messages[-3:])
        lines.append("Answer: " + json.dumps(ex.target, ensure_ascii=False))
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def minilm_texts(r: Example) -> tuple[str, str, str]:
    """The three views the MiniLM classifier embeds: last turn, the dialog before it, the documents."""
    before = " ".join(f"{m.role}: {m.content}" for m in r.messages[-4:-1]) or "(no earlier turns)"
    docs = " ".join(f"{d.title}. {d.text[:300]}" for d in r.documents[:5]) or "(no documents)"
    return r.last_turn, before, docs


def fit_minilm(
    train_rows: Sequence[Example], *, seed: int, cache: str | None = None
) -> Callable[[Sequence[Any]], tuple[list[bool], list[float] | None]]:
    """Logistic regression on MiniLM embeddings of (last turn, dialog before it, documents), trained on
    `train_rows`: a function from rows to (decisions, P(ask)) (P(ask) None when the train split has one class)."""
    import numpy as np
    from sklearn.linear_model import LogisticRegression

    from clariedge.embed import embed

    def features(rows: Sequence[Any]) -> Any:
        views = [minilm_texts(r) for r in rows]
        return np.concatenate([embed([v[j] for v in views], cache_path=cache) for j in range(3)], axis=1)

    y = [int(r.needs_clarification) for r in train_rows]
    if len(set(y)) < 2:
        only = bool(y[0]) if y else False
        log.warning("minilm: the train split has one class only; it predicts %s everywhere", "ask" if only else "CLEAR")
        return lambda rows: ([only] * len(rows), None)
    clf = LogisticRegression(max_iter=2000, C=1.0, random_state=seed).fit(features(train_rows), y)

    def predict(rows: Sequence[Any]) -> tuple[list[bool], list[float] | None]:
        if not rows:
            return [], []
        p = clf.predict_proba(features(rows))[:, list(clf.classes_).index(1)]
        return [bool(x >= 0.5) for x in p], [round(float(x), 5) for x in p]

    return predict


# ---------------------------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------------------------
def plot_confusions(systems: dict[str, dict[str, Any]], path: str | Path) -> None:
    """One 2x2 confusion matrix per system, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(systems)
    fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names), 3.2), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        c = systems[name]["confusion"]
        grid = [[c["tn"], c["fp"]], [c["fn"], c["tp"]]]
        ax.imshow(grid, cmap="Blues")
        for a in range(2):
            for b in range(2):
                ax.text(b, a, str(grid[a][b]), ha="center", va="center", fontsize=12)
        ax.set_xticks([0, 1], ["CLEAR", "ask"])
        ax.set_yticks([0, 1], ["CLEAR", "ask"])
        ax.set_xlabel("predicted")
        ax.set_ylabel("gold")
        ax.set_title(f"{name}\nacc {systems[name]['accuracy']:.3f}")
    fig.tight_layout()
    save_figure(fig, path)


# ---------------------------------------------------------------------------------------------
# The stage
# ---------------------------------------------------------------------------------------------
def run(
    test_path: str | Path,
    train_path: str | Path,
    adapter_dir: str | Path,
    base_dir: str | Path,
    metrics_path: str | Path,
    predictions_path: str | Path,
    plots_dir: str | Path,
    cfg: EvaluateConfig,
    *,
    seed: int,
) -> dict[str, Any]:
    """Score the adapter and the enabled baselines on the (sampled) test split; write the metrics, the per-row
    predictions and the plots."""
    import torch

    from clariedge.embed import embed

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    t_start = time.perf_counter()
    test_all = load_examples(test_path)
    train_rows = load_examples(train_path)
    rows = stratified_sample(test_all, cfg.max_rows, random.Random(seed))
    log.info("evaluate: %d of %d test rows", len(rows), len(test_all))
    if cfg.embed_cache:  # this stage's own cache file, a DVC out (persist): present even when nothing is embedded
        from clariedge.embed import ensure_cache

        ensure_cache(cfg.embed_cache)
    out = Scored(embed_fn=functools.partial(embed, cache_path=cfg.embed_cache))

    # ---- the adapter -------------------------------------------------------------------------------
    clar = _clarifier(adapter_dir, base_dir, cfg, cfg.max_length)
    out.add_lm("adapter", clar, rows, generate=cfg.generate, max_generate=cfg.max_generate)
    if cfg.llm_judge.enabled and out.per_row["adapter"]["questions"]:
        out.systems["adapter"]["llm_judge"] = llm_judge(rows, out.per_row["adapter"]["questions"], cfg.llm_judge)
    max_length = clar.max_length
    del clar

    # ---- prompted baselines (base model, no adapter): zero-shot, and k worked examples from the train split -----------
    b = cfg.baselines
    brows_idx = _subset_index(rows, b.max_rows, seed)
    variants = [("zero_shot", "")] if b.zero_shot else []
    if b.few_shot:
        variants.append(("few_shot", few_shot_block(train_rows, b.few_shot_k, random.Random(seed))))
    base = _clarifier(None, base_dir, cfg, max_length) if variants else None
    for name, shots in variants:
        base.few_shot = shots
        # the same room for the row as the adapter has, plus the examples
        base.max_length = max_length + (len(base.tok(shots, add_special_tokens=False)["input_ids"]) + 8 if shots else 0)
        brows = [rows[i] for i in brows_idx]
        out.add_lm(
            name, base, brows, generate=b.generate and cfg.generate, max_generate=b.max_generate, index=brows_idx
        )
    del base

    # ---- MiniLM classifier ----------------------------------------------------------------------------------
    if b.minilm:
        t0 = time.perf_counter()
        needs = fit_minilm(train_rows, seed=seed, cache=cfg.embed_cache)(rows)[0]
        out.systems["minilm"] = score(rows, needs)
        out.timing["minilm"] = {"classify_s": round(time.perf_counter() - t0, 1)}
        out.per_row["minilm"] = {"needs": needs}

    # ---- write --------------------------------------------------------------------------------------------------
    result = summary(rows, len(test_all), brows_idx, out.systems, out.per_row["adapter"]["needs"])
    out.timing["total_s"] = round(time.perf_counter() - t_start, 1)
    result["timing"] = out.timing
    write_json(metrics_path, result)
    write_jsonl(predictions_path, _prediction_rows(rows, out.per_row))
    write_plots(out.systems, rows, out.per_row["adapter"]["needs"], Path(plots_dir))
    return result


@dataclass
class Scored:
    """Per system: its scores (the metrics), its timings and its per-row predictions."""

    embed_fn: Callable[[list[str]], Any]
    systems: dict[str, dict[str, Any]] = field(default_factory=dict)
    timing: dict[str, Any] = field(default_factory=dict)
    per_row: dict[str, dict[str, Any]] = field(default_factory=dict)

    def add_lm(
        self,
        name: str,
        clarifier: Any,
        rows: Sequence[Example],
        *,
        generate: bool,
        max_generate: int | None,
        index: list[int] | None = None,
    ) -> None:
        """Score a language model on `rows` (the test rows at `index`, when a subset)."""
        pred = lm_predictions(clarifier, rows, generate=generate, max_generate=max_generate)
        self.systems[name] = score(rows, pred["needs"], pred["questions"], embed_fn=self.embed_fn)
        self.systems[name]["unparseable"] = pred["unparseable"]
        self.timing[name] = {"classify_s": pred["classify_s"], "generate_s": pred["generate_s"]}
        self.per_row[name] = pred if index is None else {**pred, "index": index}


def _clarifier(
    adapter_dir: str | Path | None, base_dir: str | Path, cfg: EvaluateConfig, max_length: int | None
) -> Any:
    from clariedge.training.infer import Clarifier

    return Clarifier(
        adapter_dir,
        base=base_dir,
        max_length=max_length,
        batch_size=cfg.batch_size,
        max_new_tokens=cfg.max_new_tokens,
        precision=cfg.precision,
    )


def summary(
    rows: Sequence[Example],
    test_rows: int,
    brows_idx: Sequence[int],
    systems: dict[str, dict[str, Any]],
    adapter_needs: Sequence[bool],
) -> dict[str, Any]:
    """The metrics: rows, every system's scores, the adapter's on the baselines' rows when those are capped
    (like for like), the best baseline's accuracy."""
    baseline_rows = {n: s["n"] for n, s in systems.items()}
    if len(brows_idx) != len(rows):
        sub = [adapter_needs[i] for i in brows_idx]
        systems["adapter_on_baseline_rows"] = M.classification([rows[i].needs_clarification for i in brows_idx], sub)
    return {
        "rows": len(rows),
        "test_rows": test_rows,
        "rows_by_category": _count(r.category for r in rows),
        "baseline_rows": baseline_rows,
        "systems": systems,
        "best_baseline_accuracy": max(
            (s["accuracy"] for n, s in systems.items() if n not in ("adapter", "adapter_on_baseline_rows")),
            default=None,
        ),
    }


def write_plots(
    systems: dict[str, dict[str, Any]], rows: Sequence[Example], adapter_needs: Sequence[bool], plots_dir: Path
) -> None:
    """The confusion matrices (PNG) and the adapter's `classes.csv` (actual/predicted, DVC's confusion template)."""
    plot_confusions(
        {n: s for n, s in systems.items() if "confusion" in s and n != "adapter_on_baseline_rows"},
        plots_dir / "confusion_matrix.png",
    )
    write_text(
        plots_dir / "classes.csv",
        "actual,predicted\n"
        + "".join(f"{_label(r.needs_clarification)},{_label(n)}\n" for r, n in zip(rows, adapter_needs, strict=True)),
    )


def _label(needs: bool) -> str:
    return "ask" if needs else "clear"


def _count(values: Any) -> dict[str, int]:
    return dict(sorted(Counter(values).items()))


def _subset_index(rows: Sequence[Example], n: int | None, seed: int) -> list[int]:
    chosen = {r.id for r in stratified_sample(rows, n, random.Random(seed + 1))}
    return [i for i, r in enumerate(rows) if r.id in chosen]


def _prediction_rows(rows: Sequence[Example], per_row: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for system, pred in per_row.items():
        index = pred.get("index") or list(range(len(rows)))
        questions = pred.get("questions") or {}
        for j, i in enumerate(index):
            r = rows[i]
            row = {
                "system": system,
                "id": r.id,
                "category": r.category,
                "setting": r.setting,
                "gold": r.needs_clarification,
                "needs": pred["needs"][j],
            }
            if "p_clear" in pred:
                row["p_clear"] = pred["p_clear"][j]
            if j in questions:
                row["clarification"] = questions[j]
            if j in pred.get("raws", {}) and questions.get(j) is None:
                row["raw"] = pred["raws"][j]
            out.append(row)
    return sorted(out, key=lambda x: (x["system"], x["id"]))
