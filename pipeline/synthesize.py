"""Stage `synthesize`: candidate examples of the four categories, in both settings, from seed turns.

Inputs:  seed turns parquet (`SeedTurn` rows, from `ingest`); the prompt files in generation_prompts/
         (LLM backends); the LLM cache `cache/llm.sqlite` (read and extended; a DVC out, persist).
Outputs: candidate examples parquet (`Example` rows, sorted by id), rejects JSONL (every job that gave
         no row: reason, where = `seed_id/category/setting/variant`, detail, raw model output), stats
         JSON (rows by category/setting, drops by reason, LLM usage: requests, completions, cache hits,
         tokens, retries; the prompt files' hashes).
Params:  `seed` (top level); `synthesize.backend` (construct | openai | transformers), `synthesize.max_seeds`,
         `synthesize.counts` (rows per seed and category, LLM backends), `synthesize.settings`,
         `synthesize.prompts` (category -> `<id>.<version>`), `synthesize.clarification_pass`,
         `synthesize.max_invalid_retries`, `synthesize.max_documents`, `synthesize.max_doc_chars`,
         `synthesize.openai.*`, `synthesize.transformers.*` (see `clariedge.llm`), `synthesize.construct.*`
         (see `clariedge.construct`).

The LLM path: for each sampled seed and category, `counts[category]` jobs; each job's setting is drawn
(seeded) from the settings the seed allows (post_retrieval needs documents; ambiguous_documents is
post_retrieval only) and recorded on the row (`provenance.template`, a JSON of the drawn values). A job
renders its category's prompt with the seed's dialog, turn, rewrite and (post-retrieval) documents; the
validated answer becomes an `Example` with provenance (generator, model, prompt id, version, hash of
the rendered messages, seed id). A job that yields no valid row is a reject, never a crash.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import warnings
from collections import Counter
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator

from clariedge.config import StageConfig
from clariedge.construct import ConstructConfig, construct
from clariedge.io import Rejects, describe_validation_error, read_records, write_json, write_records
from clariedge.llm import (
    Backend,
    Job,
    LLMCache,
    OpenAIConfig,
    Outcome,
    Runner,
    TransformersConfig,
    make_backend,
    prompt_documents,
)
from clariedge.prompts import Prompt, get_prompt
from clariedge.schema import CATEGORIES, Category, Example, Message, Provenance, SeedTurn, Setting

log = logging.getLogger(__name__)

PROMPT_TASKS = ("ambiguous_dialog", "ambiguous_documents", "clear", "hard_negative", "clarification")


# `construct` shadows pydantic's deprecated `BaseModel.construct` classmethod: harmless, the name is the
# params key (`synthesize.construct`); silence pydantic's warning about it.
warnings.filterwarnings("ignore", message='Field name "construct"', category=UserWarning)


class SynthesizeConfig(StageConfig):
    backend: Literal["construct", "openai", "transformers"]
    max_seeds: int | None = Field(ge=1, description="sample this many seed turns (seeded); null = all")
    counts: dict[Category, float] = Field(
        description="LLM backends: rows per seed turn and category; a fraction is a seeded chance of one more",
    )
    settings: list[Setting] = Field(min_length=1)
    prompts: dict[str, str] = Field(description="task -> prompt file <id>.<version>, one for every task")
    clarification_pass: bool = Field(description="reword ambiguous rows' questions with the clarification prompt")
    max_invalid_retries: int = Field(ge=0, description="re-asks after an answer that is not valid JSON / schema")
    max_documents: int = Field(ge=1)
    max_doc_chars: int = Field(ge=50)
    openai: OpenAIConfig
    transformers: TransformersConfig
    construct: ConstructConfig

    @field_validator("counts")
    @classmethod
    def _counts(cls, v: dict[str, float]) -> dict[str, float]:
        bad = {k: n for k, n in v.items() if n < 0}
        if bad:
            raise ValueError(f"counts must be >= 0, got {bad}")
        return v

    @field_validator("prompts")
    @classmethod
    def _prompts(cls, v: dict[str, str]) -> dict[str, str]:
        unknown = set(v) - set(PROMPT_TASKS)
        if unknown:
            raise ValueError(f"unknown task(s) {sorted(unknown)} (known: {', '.join(sorted(PROMPT_TASKS))})")
        missing = [t for t in PROMPT_TASKS if t not in v]
        if missing:
            raise ValueError(f"no prompt for task(s) {missing}: name a prompt file for every task")
        return v


# ---------------------------------------------------------------------------------------------
# Planning: which seed, category, setting and variant get generated (seeded, recorded on the row)
# ---------------------------------------------------------------------------------------------
def sample_seeds(seeds: list[SeedTurn], max_seeds: int | None, rng: random.Random) -> list[SeedTurn]:
    ordered = sorted(seeds, key=lambda s: (s.conversation_id, s.turn))
    if max_seeds is None or max_seeds >= len(ordered):
        return ordered
    picked = sorted(rng.sample(range(len(ordered)), max_seeds))
    return [ordered[i] for i in picked]


def job_seed(base: int, *parts: object) -> int:
    """A sampling seed derived from the run's seed and the job's identity (stable when others change)."""
    digest = hashlib.sha256(json.dumps([base, *parts]).encode()).hexdigest()
    return int(digest[:8], 16)


def allowed_settings(seed: SeedTurn, category: str, settings: list[Setting]) -> list[Setting]:
    allowed = [s for s in settings if s == "pre_retrieval" or seed.documents]
    if category == "ambiguous_documents":
        allowed = [s for s in allowed if s == "post_retrieval"]
    return allowed


def prompt_inputs(seed: SeedTurn, setting: Setting, cfg: SynthesizeConfig) -> dict[str, Any]:
    docs = seed.documents if setting == "post_retrieval" else []
    return {
        "domain": seed.domain,
        "dialog": [m.model_dump() for m in seed.messages[:-1]],
        "last_turn": seed.last_turn,
        "rewrite": seed.rewrite,
        "documents": prompt_documents(docs, cfg.max_documents, cfg.max_doc_chars),
    }


def plan_jobs(
    seeds: list[SeedTurn], cfg: SynthesizeConfig, prompts: dict[str, Prompt], *, rng: random.Random, base_seed: int
) -> tuple[list[tuple[Job, SeedTurn, str, Setting, dict[str, Any]]], Counter[str]]:
    """Every job to run, in a fixed order; the drawn values go to `provenance.template`."""
    plan = []
    skipped: Counter[str] = Counter()
    for seed in seeds:
        for category in CATEGORIES:
            wanted = cfg.counts.get(category, 0)
            n = int(wanted)
            if wanted > n and rng.random() < wanted - n:  # drawn only for fractional counts
                n += 1
            for variant in range(n):
                allowed = allowed_settings(seed, category, cfg.settings)
                if not allowed:
                    skipped["skipped_no_documents"] += 1
                    continue
                setting = rng.choice(allowed)
                prompt = prompts[category]
                inputs = {k: v for k, v in prompt_inputs(seed, setting, cfg).items() if k in prompt.inputs}
                js = job_seed(base_seed, seed.id, category, variant)
                drawn = {"setting": setting, "variant": variant, "seed": js}
                where = f"{seed.id}/{category}/{setting}/{variant}"
                plan.append((Job(where, prompt, inputs, js), seed, category, setting, drawn))
    return plan, skipped


# ---------------------------------------------------------------------------------------------
# Answers -> examples
# ---------------------------------------------------------------------------------------------
def to_example(
    seed: SeedTurn,
    category: str,
    setting: Setting,
    value: dict[str, Any],
    outcome: Outcome,
    backend: Backend,
    drawn: dict[str, Any],
) -> Example:
    prompt = outcome.job.prompt
    ambiguous = category in ("ambiguous_dialog", "ambiguous_documents")
    turn = " ".join(str(value["turn"]).split())
    messages = [*seed.messages[:-1], Message(role="user", content=turn)]
    return Example(
        conversation_id=seed.conversation_id,
        domain=seed.domain,
        setting=setting,
        category=category,  # type: ignore[arg-type]
        messages=messages,
        documents=seed.documents if setting == "post_retrieval" else [],
        needs_clarification=ambiguous,
        clarification=" ".join(str(value["clarification"]).split()) if ambiguous else None,
        interpretations=[str(x).strip() for x in value.get("interpretations", [])] if ambiguous else [],
        resolution=str(value["resolution"]).strip() if category == "hard_negative" else None,
        provenance=Provenance(
            generator=backend.name,
            model=backend.model,
            method=category,
            prompt_id=prompt.id,
            prompt_version=prompt.version,
            prompt_hash=outcome.prompt_hash,
            seed_id=seed.id,
            template=json.dumps(drawn, sort_keys=True, separators=(",", ":")),
        ),
    )


def _reject(rejects: Rejects, outcome: Outcome) -> None:
    raw = {"output": outcome.raw, "attempts": outcome.attempts, "prompt": outcome.job.prompt.name}
    rejects.add(outcome.reason or "unknown", outcome.job.where, outcome.detail, raw)


def transform_llm(
    seeds: list[SeedTurn],
    cfg: SynthesizeConfig,
    runner: Runner,
    *,
    rng: random.Random,
    base_seed: int,
    progress: bool = False,
) -> tuple[list[Example], Rejects, dict[str, Any]]:
    """The LLM path: plan jobs, run them (cached, concurrent), validate, turn answers into examples."""
    prompts = {task: get_prompt(name) for task, name in cfg.prompts.items()}
    for category in CATEGORIES:
        if prompts[category].id != category and cfg.counts.get(category, 0):
            log.info("category %s uses prompt %s", category, prompts[category].name)
    plan, skipped = plan_jobs(seeds, cfg, prompts, rng=rng, base_seed=base_seed)
    log.info("%d jobs for %d seed turns (backend %s)", len(plan), len(seeds), runner.backend.name)
    outcomes = runner.run_many([p[0] for p in plan], progress=progress, desc="synthesize")
    rejects = Rejects()
    ready: list[tuple[SeedTurn, str, Setting, dict[str, Any], Outcome, dict[str, Any]]] = []
    for (_job, seed, category, setting, drawn), outcome in zip(plan, outcomes, strict=True):
        if not outcome.ok:
            _reject(rejects, outcome)
            continue
        ready.append((seed, category, setting, dict(outcome.value or {}), outcome, drawn))
    if cfg.clarification_pass:
        ready = _clarification_pass(ready, cfg, prompts["clarification"], runner, rejects, progress=progress)
    examples: dict[str, Example] = {}
    for seed, category, setting, value, outcome, drawn in ready:
        try:
            ex = to_example(seed, category, setting, value, outcome, runner.backend, drawn)
        except ValidationError as err:
            rejects.add("invalid_example", outcome.job.where, describe_validation_error(err), value)
            continue
        if ex.id in examples:
            rejects.add("duplicate", outcome.job.where, f"same content as {ex.id} (another variant)", value)
            continue
        examples[ex.id] = ex
    stats: dict[str, Any] = dict(skipped)
    stats["jobs"] = len(plan)
    stats["llm"] = runner.usage_dict()
    used = [prompts[c] for c in CATEGORIES if cfg.counts.get(c, 0)]
    if cfg.clarification_pass:
        used.append(prompts["clarification"])
    stats["prompts"] = {p.name: p.file_hash for p in sorted(used, key=lambda p: p.name)}
    return [examples[k] for k in sorted(examples)], rejects, stats


def _clarification_pass(
    ready: list[tuple[SeedTurn, str, Setting, dict[str, Any], Outcome, dict[str, Any]]],
    cfg: SynthesizeConfig,
    prompt: Prompt,
    runner: Runner,
    rejects: Rejects,
    *,
    progress: bool,
) -> list[tuple[SeedTurn, str, Setting, dict[str, Any], Outcome, dict[str, Any]]]:
    """Second pass: the clarification prompt rewords each ambiguous row's question."""
    idx = [i for i, r in enumerate(ready) if r[1] in ("ambiguous_dialog", "ambiguous_documents")]
    jobs = []
    for i in idx:
        seed, _category, setting, value, outcome, drawn = ready[i]
        inputs = {
            "dialog": [m.model_dump() for m in seed.messages[:-1]],
            "turn": value["turn"],
            "interpretations": value.get("interpretations", []),
            "documents": prompt_inputs(seed, setting, cfg)["documents"],
        }
        jobs.append(Job(f"{outcome.job.where}/clarification", prompt, inputs, drawn["seed"] + 1000))
    results = runner.run_many(jobs, progress=progress, desc="clarification")
    drop: set[int] = set()
    for i, res in zip(idx, results, strict=True):
        if not res.ok:
            _reject(rejects, res)
            drop.add(i)
            continue
        seed, category, setting, value, outcome, drawn = ready[i]
        value["clarification"] = (res.value or {})["clarification"]
        drawn = {**drawn, "clarification_prompt": prompt.name, "clarification_hash": res.prompt_hash}
        ready[i] = (seed, category, setting, value, outcome, drawn)
    return [r for i, r in enumerate(ready) if i not in drop]


# ---------------------------------------------------------------------------------------------
# The stage
# ---------------------------------------------------------------------------------------------
def transform(
    seeds: list[SeedTurn],
    cfg: SynthesizeConfig,
    *,
    rng: random.Random,
    base_seed: int = 0,
    runner: Runner | None = None,
    progress: bool = False,
) -> tuple[list[Example], Rejects, dict[str, Any]]:
    """Seeds -> (examples sorted by id, rejects, stats); `runner` is required for the LLM backends."""
    picked = sample_seeds(seeds, cfg.max_seeds, rng)
    if cfg.backend == "construct":
        rows, rejects, extra = construct(picked, cfg.construct, rng=rng)
        rows = sorted(rows, key=lambda e: e.id)
    else:
        if runner is None:
            raise ValueError(f"backend {cfg.backend!r} needs an LLM runner")
        rows, rejects, extra = transform_llm(picked, cfg, runner, rng=rng, base_seed=base_seed, progress=progress)
    stats: dict[str, Any] = {
        "backend": cfg.backend,
        "seeds_in": len(seeds),
        "seeds_used": len(picked),
        "rows_out": len(rows),
        "rejected": len(rejects),
        **{k: v for k, v in extra.items() if k not in ("backend",)},
    }
    stats.update(rejects.counts())
    by_cat = Counter(e.category for e in rows)
    by_set = Counter(e.setting for e in rows)
    by_both = Counter(f"{e.category}/{e.setting}" for e in rows)
    stats["by_category"] = {c: by_cat.get(c, 0) for c in CATEGORIES}
    stats["by_setting"] = dict(sorted(by_set.items()))
    stats["by_category_setting"] = dict(sorted(by_both.items()))
    return rows, rejects, stats


def run(
    seeds_path: str | Path,
    out_path: str | Path,
    rejects_path: str | Path | None,
    stats_path: str | Path | None,
    cfg: SynthesizeConfig,
    *,
    seed: int,
    cache_path: str | Path,
    api_key: str | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Read seeds, synthesize, write examples / rejects / stats. The cache file always exists afterwards."""
    seeds = read_records(seeds_path, SeedTurn)
    log.info("synthesize: %d seed turns from %s; params %s", len(seeds), seeds_path, _loggable(cfg))
    rng = random.Random(seed)
    with LLMCache(cache_path) as cache:
        runner = None
        if cfg.backend != "construct":
            backend = make_backend(
                cfg.backend, openai_cfg=cfg.openai, transformers_cfg=cfg.transformers, api_key=api_key
            )
            gen = cfg.openai if cfg.backend == "openai" else cfg.transformers
            runner = Runner(
                backend,
                cache,
                concurrency=cfg.openai.concurrency if cfg.backend == "openai" else 1,
                max_invalid_retries=cfg.max_invalid_retries,
                temperature=gen.temperature,
                max_tokens=gen.max_tokens,
            )
        rows, rejects, stats = transform(seeds, cfg, rng=rng, base_seed=seed, runner=runner, progress=progress)
        if "llm" in stats:
            stats["llm"]["cache_entries"] = len(cache)
    if rejects_path:
        rejects.rows.sort(key=lambda r: (r["where"], r["reason"]))
        rejects.write(rejects_path)
    if not rows:  # e.g. the server is down or refuses the key: fail instead of passing on an empty table
        first = f"; first: {rejects.rows[0]['where']}: {rejects.rows[0]['detail']}" if rejects.rows else ""
        where = f" at {cfg.openai.base_url}" if cfg.backend == "openai" else ""
        raise ValueError(
            f"no candidate rows from {len(seeds)} seed turns (backend {cfg.backend}{where}): "
            f"{rejects.counts() or 'nothing generated'}{first}; {out_path} not written"
        )
    write_records(out_path, rows)
    if stats_path:
        write_json(stats_path, stats)
    log.info(
        "synthesize: %d rows (%s), %d rejects",
        len(rows),
        ", ".join(f"{k}={v}" for k, v in stats["by_category"].items()),
        len(rejects),
    )
    if "llm" in stats:
        log.info("llm usage: %s", stats["llm"])
    return stats


def _loggable(cfg: SynthesizeConfig) -> dict[str, Any]:
    """Resolved params for the log (they name the key's env var, never hold the key)."""
    data = cfg.model_dump(mode="json")
    for name in ("construct", "openai", "transformers"):
        if name != cfg.backend:
            data.pop(name, None)
    if cfg.backend == "construct":
        for key in ("counts", "prompts", "clarification_pass", "max_invalid_retries", "max_documents", "max_doc_chars"):
            data.pop(key, None)
    return data
