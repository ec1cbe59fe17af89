"""Stage `filter`: keep only candidates that are valid, distinct, within bounds, not self-answering and balanced.

Steps, in order (each drop is a reject with its reason, counted as `dropped_<reason>` in the stats):
1. schema: every row is re-validated as an `Example` (`invalid_row`), its id must be its content hash
   (`id_mismatch`), ambiguous rows carry a question (`clarification_not_question`) and every row the
   evidence for its label (`missing_evidence`: hard negatives a resolution other than the turn itself,
   ambiguous_documents >= 2 interpretations; `unsupported_interpretation`: an interpretation that no
   retrieved document mentions).
2. length bounds on the last turn, the clarification and the dialog (`too_short`, `too_long`).
3. leakage: a clarification must not answer the question it asks about (`clarification_answers`):
   it may not copy a run of `leakage.shingle` words from a document (unless the turn, the dialog or the
   interpretations hold that run too), nor state a number that the turn, dialog and interpretations
   do not contain (a year, an amount, a count is what an answer looks like).
4. exact duplicates (`duplicate`: the same id, or the same model-visible text: dialog, document ids
   and target) and near-duplicates (`near_duplicate`: MiniLM cosine >= `dedup.threshold` on the last
   turn + target, compared within the same category and setting; the first row in id order stays).
5. optional LLM judge (`judge.enabled`, off by default): the `judge_clarification` prompt through
   `clariedge.llm` asks whether an ambiguous row's clarification is a clarification request and does
   not answer the question (`judge_not_clarification`, `judge_answers_question`; `judge_error` per
   `judge.on_error`).
6. balancing (seeded): at most `balance.max_per_cell` rows per category x setting, and no category
   above `balance.max_share` of its setting's rows (`balanced_out`).
The stats end with the shallow-separability report of the kept rows (`clariedge.construct`): how well a
bag-of-words model on the last turn alone tells each category from the rest (0.5 = chance).

Inputs:  candidate examples (parquet, `Example` rows), e.g. data/candidates.parquet.
Outputs: filtered examples (parquet, sorted), rejects JSONL, stats JSON (counts per category/setting in
         and out, rejects by reason).
Params:  `filter.*` (see `FilterConfig`), top-level `seed` (balancing samples).
"""

from __future__ import annotations

import logging
import random
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field, ValidationError

from clariedge.config import StageConfig
from clariedge.io import Rejects, describe_validation_error, read_table, write_json, write_records
from clariedge.llm import OpenAIConfig, TransformersConfig
from clariedge.schema import Example
from clariedge.text import FUNCTION_WORDS, number_tokens

log = logging.getLogger(__name__)

EmbedFn = Callable[[Sequence[str]], np.ndarray]


class LengthConfig(StageConfig):
    min_turn_chars: int = Field(ge=1)
    max_turn_chars: int = Field(ge=1)
    min_clarification_chars: int = Field(ge=1)
    max_clarification_chars: int = Field(ge=1)
    max_dialog_messages: int = Field(ge=1)
    max_dialog_chars: int = Field(ge=1, description="all messages together")


class LeakageConfig(StageConfig):
    enabled: bool
    shingle: int = Field(ge=3, description="words in a run copied from a document that counts as an answer")
    numbers: bool = Field(description="a number absent from turn/dialog/interpretations counts as an answer")


class DedupConfig(StageConfig):
    enabled: bool
    threshold: float = Field(gt=0.0, le=1.0, description="cosine similarity from which rows are near-dups")
    cache: str | None = Field(description="this stage's MiniLM embedding cache, a DVC out (null: no cache)")


class BalanceConfig(StageConfig):
    max_per_cell: int | None = Field(ge=1, description="rows per category x setting at most")
    max_share: float | None = Field(gt=0.0, le=1.0, description="a category's share of a setting at most")


class JudgeConfig(StageConfig):
    enabled: bool
    backend: Literal["openai", "transformers"]
    prompt: str
    cache: str
    on_error: Literal["keep", "drop"]
    max_invalid_retries: int = Field(ge=0)
    openai: OpenAIConfig = Field(description="the judge's OpenAI-compatible endpoint (backend openai)")
    transformers: TransformersConfig = Field(description="the judge's local model (backend transformers)")


class FilterConfig(StageConfig):
    length: LengthConfig
    leakage: LeakageConfig
    dedup: DedupConfig
    balance: BalanceConfig
    judge: JudgeConfig
    separability: bool = Field(description="bag-of-words AUC on the kept rows' last turns, per category")


class FilterError(RuntimeError):
    pass


# ---------------------------------------------------------------------------------------------
# 1. schema and evidence
# ---------------------------------------------------------------------------------------------
def validate_rows(raw: Sequence[dict[str, Any]], rejects: Rejects) -> list[Example]:
    out = []
    for i, row in enumerate(raw):
        where = f"row {i} ({row.get('id') if isinstance(row, dict) else '?'})"
        try:
            clean = {k: v for k, v in row.items() if v is not None or k in _NULLABLE}
            ex = Example.model_validate(clean)
        except ValidationError as err:
            rejects.add("invalid_row", where, describe_validation_error(err), row)
            continue
        except (TypeError, AttributeError) as err:
            rejects.add("invalid_row", where, f"not a record: {err}", row)
            continue
        if ex.id != ex.compute_id():
            rejects.add("id_mismatch", where, f"id {ex.id} is not the content hash {ex.compute_id()}", row)
            continue
        problem = evidence_problem(ex)
        if problem:
            rejects.add(problem[0], where, problem[1], row)
            continue
        out.append(ex)
    return out


_NULLABLE = {k for k, f in Example.model_fields.items() if not f.is_required() and f.default is None}


def evidence_problem(ex: Example) -> tuple[str, str] | None:
    if ex.needs_clarification and "?" not in (ex.clarification or ""):
        return "clarification_not_question", f"{ex.category} clarification is not a question: {ex.clarification!r}"
    if ex.category == "hard_negative" and not ex.resolution:
        return "missing_evidence", "a hard negative needs its resolution (the standalone question it resolves to)"
    if ex.category == "ambiguous_documents" and len(ex.interpretations) < 2:
        return "missing_evidence", f"ambiguous_documents needs >= 2 interpretations, has {len(ex.interpretations)}"
    if ex.category == "hard_negative" and _norm(ex.resolution or "") == _norm(ex.last_turn):
        return "missing_evidence", "the resolution repeats the turn: nothing shows the turn needed resolving"
    if ex.category == "ambiguous_documents":
        doc_words = set().union(*(_content(d.title + " " + d.text) for d in ex.documents))
        shared = set.intersection(*(_content(i) for i in ex.interpretations))
        # what tells an interpretation apart ("Arizona, NFL" in "Cardinals (Arizona, NFL)") must be in a document
        unsupported = [i for i in ex.interpretations if not ((_content(i) - shared) or _content(i)) & doc_words]
        if unsupported:
            return "unsupported_interpretation", f"no document mentions {unsupported[0]!r}"
    return None


def _content(text: str) -> set[str]:
    return {t for t in number_tokens(text) if len(t) > 2 and not t.isdigit()} - FUNCTION_WORDS


# ---------------------------------------------------------------------------------------------
# 2. length bounds
# ---------------------------------------------------------------------------------------------
def length_problem(ex: Example, cfg: LengthConfig) -> tuple[str, str] | None:
    turn = len(ex.last_turn)
    if turn < cfg.min_turn_chars:
        return "too_short", f"last turn has {turn} chars < {cfg.min_turn_chars}"
    if turn > cfg.max_turn_chars:
        return "too_long", f"last turn has {turn} chars > {cfg.max_turn_chars}"
    if ex.clarification is not None:
        n = len(ex.clarification)
        if n < cfg.min_clarification_chars:
            return "too_short", f"clarification has {n} chars < {cfg.min_clarification_chars}"
        if n > cfg.max_clarification_chars:
            return "too_long", f"clarification has {n} chars > {cfg.max_clarification_chars}"
    if len(ex.messages) > cfg.max_dialog_messages:
        return "too_long", f"dialog has {len(ex.messages)} messages > {cfg.max_dialog_messages}"
    chars = sum(len(m.content) for m in ex.messages)
    if chars > cfg.max_dialog_chars:
        return "too_long", f"dialog has {chars} chars > {cfg.max_dialog_chars}"
    return None


# ---------------------------------------------------------------------------------------------
# 3. a clarification must not answer the question it asks about
# ---------------------------------------------------------------------------------------------
_NUMBER = re.compile(r"\d")


def _shingles(tokens: Sequence[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)}


def answers_itself(ex: Example, cfg: LeakageConfig) -> str | None:
    """Why the clarification gives the answer away, or None.

    Concrete checks: (a) it copies `cfg.shingle` consecutive words from a retrieved document that the
    question side (dialog, turn, interpretations) does not contain; (b) it states a number (year,
    amount, count) that the question side does not contain.
    """
    if not ex.clarification:
        return None
    clar = number_tokens(ex.clarification)
    asked = " ".join([*(m.content for m in ex.messages), *ex.interpretations])
    asked_tokens = number_tokens(asked)
    if ex.documents:
        mine = _shingles(clar, cfg.shingle) - _shingles(asked_tokens, cfg.shingle)
        for d in ex.documents:
            copied = mine & _shingles(number_tokens(d.text), cfg.shingle)
            if copied:
                return f"copies {' '.join(sorted(copied)[0])!r} from document {d.doc_id}"
    if cfg.numbers:
        known = set(asked_tokens)
        numbers = sorted({t for t in clar if _NUMBER.search(t)} - known)
        if numbers:
            return f"states {', '.join(numbers)} that the question does not mention"
    return None


# ---------------------------------------------------------------------------------------------
# 4. duplicates
# ---------------------------------------------------------------------------------------------
def _norm(text: str) -> str:
    return " ".join(number_tokens(text))


def visible_key(ex: Example) -> tuple[Any, ...]:
    """What the model sees (dialog, documents) and must output: equal keys are exact duplicates."""
    return (
        ex.setting,
        tuple((m.role, _norm(m.content)) for m in ex.messages),
        tuple(d.doc_id for d in ex.documents),
        _norm(ex.clarification or "CLEAR"),
    )


def dedup_text(ex: Example) -> str:
    return f"{ex.last_turn} || {ex.clarification or 'CLEAR'}"


def drop_duplicates(rows: list[Example], rejects: Rejects) -> list[Example]:
    seen_id: set[str] = set()
    seen_key: dict[tuple[Any, ...], str] = {}
    out = []
    for ex in rows:
        if ex.id in seen_id:
            rejects.add("duplicate", ex.id, "same id as an earlier row")
            continue
        key = visible_key(ex)
        if key in seen_key:
            rejects.add("duplicate", ex.id, f"same dialog, documents and target as {seen_key[key]}")
            continue
        seen_id.add(ex.id)
        seen_key[key] = ex.id
        out.append(ex)
    return out


def drop_near_duplicates(
    rows: list[Example], cfg: DedupConfig, rejects: Rejects, embed_fn: EmbedFn | None = None
) -> tuple[list[Example], int]:
    """Greedy within each category x setting: a row closer than the threshold to a kept one is dropped."""
    if not rows:
        return rows, 0
    if embed_fn is None:
        from clariedge.embed import embed

        def embed_fn(texts: Sequence[str]) -> np.ndarray:
            return embed(texts, cache_path=cfg.cache)

    vecs = embed_fn([dedup_text(r) for r in rows])
    cells: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        cells[(r.category, r.setting)].append(i)
    drop: set[int] = set()
    for idx in cells.values():
        kept: list[int] = []
        for i in idx:
            if kept:
                sims = vecs[kept] @ vecs[i]
                j = int(np.argmax(sims))
                if sims[j] >= cfg.threshold:
                    drop.add(i)
                    rejects.add(
                        "near_duplicate",
                        rows[i].id,
                        f"cosine {float(sims[j]):.3f} >= {cfg.threshold} with {rows[kept[j]].id}",
                        dedup_text(rows[i]),
                    )
                    continue
            kept.append(i)
    return [r for i, r in enumerate(rows) if i not in drop], len(rows)


# ---------------------------------------------------------------------------------------------
# 5. optional LLM judge (calls clariedge.llm only when enabled)
# ---------------------------------------------------------------------------------------------
def judge(
    rows: list[Example], cfg: JudgeConfig, rejects: Rejects, *, seed: int, api_key: str | None = None
) -> tuple[list[Example], dict[str, Any]]:
    """Ask the judge prompt about every ambiguous row's clarification; drop those it rejects."""
    from clariedge import llm
    from clariedge.prompts import get_prompt

    prompt = get_prompt(cfg.prompt)
    openai_cfg, tf_cfg = cfg.openai, cfg.transformers
    backend = llm.make_backend(cfg.backend, openai_cfg=openai_cfg, transformers_cfg=tf_cfg, api_key=api_key)
    todo = [r for r in rows if r.needs_clarification]
    with llm.LLMCache(cfg.cache) as cache:
        runner = llm.Runner(
            backend,
            cache,
            concurrency=openai_cfg.concurrency,
            max_invalid_retries=cfg.max_invalid_retries,
            temperature=openai_cfg.temperature if cfg.backend == "openai" else tf_cfg.temperature,
            max_tokens=openai_cfg.max_tokens if cfg.backend == "openai" else tf_cfg.max_tokens,
        )
        outcomes = runner.run_many([llm.judge_job(r, prompt, seed=seed) for r in todo], desc="judge")
    verdicts: Counter[str] = Counter()
    dropped: set[str] = set()
    for out in outcomes:
        ex_id = out.job.where
        if not out.ok:
            verdicts["error"] += 1
            if cfg.on_error == "drop":
                rejects.add("judge_error", ex_id, f"{out.reason}: {out.detail}", out.raw)
                dropped.add(ex_id)
            continue
        value = out.value or {}
        if not value.get("is_clarification"):
            verdicts["not_clarification"] += 1
            rejects.add("judge_not_clarification", ex_id, str(value.get("reason", "")), out.raw)
            dropped.add(ex_id)
        elif value.get("answers_question"):
            verdicts["answers_question"] += 1
            rejects.add("judge_answers_question", ex_id, str(value.get("reason", "")), out.raw)
            dropped.add(ex_id)
        else:
            verdicts["accepted"] += 1
    stats = {
        "judged": len(todo),
        "verdicts": dict(sorted(verdicts.items())),
        "usage": runner.usage_dict(),
        "prompt": cfg.prompt,
        "backend": cfg.backend,
    }
    return [r for r in rows if r.id not in dropped], stats


# ---------------------------------------------------------------------------------------------
# 6. balancing
# ---------------------------------------------------------------------------------------------
def balance(rows: list[Example], cfg: BalanceConfig, rejects: Rejects, *, rng: random.Random) -> list[Example]:
    cells: dict[tuple[str, str], list[Example]] = defaultdict(list)
    for r in rows:
        cells[(r.setting, r.category)].append(r)
    keep: dict[tuple[str, str], list[Example]] = {}
    for key in sorted(cells):
        group = sorted(cells[key], key=lambda e: e.id)
        if cfg.max_per_cell is not None and len(group) > cfg.max_per_cell:
            group = sorted(rng.sample(group, cfg.max_per_cell), key=lambda e: e.id)
        keep[key] = group
    if cfg.max_share is not None:
        for setting in sorted({s for s, _ in keep}):
            keys = [k for k in sorted(keep) if k[0] == setting and keep[k]]
            if len(keys) < 2:
                continue
            share = cfg.max_share
            # shrink the largest categories until none exceeds `share` of the setting
            for _ in range(len(keys)):
                total = sum(len(keep[k]) for k in keys)
                big = max(keys, key=lambda k: (len(keep[k]), k))
                others = total - len(keep[big])
                cap = int(share * others / (1 - share)) if share < 1 else len(keep[big])
                if len(keep[big]) <= max(cap, 1) or len(keep[big]) <= share * total:
                    break
                keep[big] = sorted(rng.sample(keep[big], max(cap, 1)), key=lambda e: e.id)
    kept_ids = {e.id for group in keep.values() for e in group}
    for r in rows:
        if r.id not in kept_ids:
            rejects.add("balanced_out", r.id, f"{r.category}/{r.setting} over its cap")
    return [r for r in rows if r.id in kept_ids]


# ---------------------------------------------------------------------------------------------
# The stage
# ---------------------------------------------------------------------------------------------
def _cell_counts(rows: Sequence[Example]) -> dict[str, int]:
    return dict(sorted(Counter(f"{r.category}/{r.setting}" for r in rows).items()))


def transform(
    raw: Sequence[dict[str, Any]],
    cfg: FilterConfig,
    *,
    rng: random.Random,
    seed: int = 0,
    embed_fn: EmbedFn | None = None,
    api_key: str | None = None,
) -> tuple[list[Example], Rejects, dict[str, Any]]:
    """Pure core (apart from the embedding cache and the optional judge): raw rows -> kept rows, rejects, stats."""
    rejects = Rejects()
    rows = validate_rows(raw, rejects)
    rows.sort(key=lambda e: (e.category, e.setting, e.id))
    valid_in = _cell_counts(rows)

    kept = []
    for ex in rows:
        problem = length_problem(ex, cfg.length)
        if problem is None and cfg.leakage.enabled:
            leak = answers_itself(ex, cfg.leakage)
            problem = ("clarification_answers", leak) if leak else None
        if problem:
            rejects.add(problem[0], ex.id, problem[1], ex.clarification or ex.last_turn)
            continue
        kept.append(ex)
    kept = drop_duplicates(kept, rejects)
    if cfg.dedup.enabled:
        kept, _ = drop_near_duplicates(kept, cfg.dedup, rejects, embed_fn)
    judge_stats: dict[str, Any] = {"enabled": False}
    if cfg.judge.enabled:
        kept, judge_stats = judge(kept, cfg.judge, rejects, seed=seed, api_key=api_key)
        judge_stats["enabled"] = True
    kept = balance(kept, cfg.balance, rejects, rng=rng)
    kept.sort(key=lambda e: (e.conversation_id, e.id))

    stats: dict[str, Any] = {
        "rows_in": len(raw),
        "rows_valid": len(rows),
        "rows_out": len(kept),
        "in_by_category_setting": valid_in,
        "out_by_category_setting": _cell_counts(kept),
        "out_by_category": dict(sorted(Counter(r.category for r in kept).items())),
        "out_needs_clarification_share": round(sum(r.needs_clarification for r in kept) / len(kept), 4) if kept else 0,
        "near_duplicate_threshold": cfg.dedup.threshold if cfg.dedup.enabled else None,
        "judge": judge_stats,
        "rejected": len(rejects),
    }
    stats.update(rejects.counts())
    if cfg.separability:
        from clariedge.construct import shallow_separability

        stats["shallow_separability"] = shallow_separability(kept)
    return kept, rejects, stats


def run(
    in_path: str | Path,
    out_path: str | Path,
    rejects_path: str | Path | None,
    stats_path: str | Path | None,
    cfg: FilterConfig,
    *,
    seed: int,
    api_key: str | None = None,
) -> dict[str, Any]:
    raw = read_table(in_path)
    if not raw:
        raise FilterError(f"{in_path}: no candidate rows (did synthesize produce any?)")
    missing = [name for name, f in Example.model_fields.items() if f.is_required() and name not in raw[0]]
    if missing:
        raise FilterError(f"{in_path}: missing column(s) {', '.join(missing)}: not a table of Example rows")
    if cfg.dedup.cache:  # this stage's own cache file, a DVC out (persist): present even when nothing is embedded
        from clariedge.embed import ensure_cache

        ensure_cache(cfg.dedup.cache)
    kept, rejects, stats = transform(raw, cfg, rng=random.Random(seed), seed=seed, api_key=api_key)
    for r in rejects.rows:  # a row-level reject names the input file too
        if r["where"].startswith("row "):
            r["where"] = f"{in_path} {r['where']}"
    for reason, n in rejects.counts().items():
        log.info("filter: %s %d", reason, n)
    if not kept:
        raise FilterError(f"{in_path}: every row was filtered out ({rejects.counts()}); nothing written")
    write_records(out_path, kept)
    if rejects_path:
        rejects.write(rejects_path)
    if stats_path:
        write_json(stats_path, stats)
    log.info("filter: %d of %d rows kept", stats["rows_out"], stats["rows_in"])
    return stats
