"""LLM calls behind one small interface: backends, a persistent cache, retries and bounded concurrency.

A backend answers `generate(messages, **gen) -> str` (and `agenerate`, its async variant, which also
reports token usage; the interface is `clariedge.llm_base`). Two backends, picked by `make_backend`:
`OpenAIBackend` (`clariedge.llm_openai`: any OpenAI-compatible server, with bounded, counted retries)
and `TransformersBackend` (`clariedge.llm_transformers`: a local causal LM, SmolLM2 by default).

`Runner` ties a backend to prompts (`clariedge.prompts`): it renders a job's prompt, looks the call up
in the SQLite cache (`LLMCache`, keyed by a hash of backend, model, prompt id+version, rendered
messages, sampling params and attempt number), calls the backend under an asyncio semaphore when
missing, stores the answer as soon as it arrives (a killed run loses no finished call), parses it
with `json.loads`, validates it against the prompt's schema, and retries an invalid answer (bounded)
with a new sampling seed before giving up with a reason. `Usage` counts requests, completions, cache
hits, tokens, retries and invalid answers for the stage's metrics.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clariedge.llm_base import Backend, Completion, LLMCallError, LLMConfigError  # noqa: F401 - re-exported
from clariedge.llm_openai import OpenAIBackend, OpenAIConfig
from clariedge.llm_transformers import TransformersBackend, TransformersConfig, smollm2_dir  # noqa: F401 - re-exported
from clariedge.prompts import Prompt, messages_hash, parse_answer
from clariedge.schema import Document, Example


def make_backend(kind: str, *, openai_cfg: OpenAIConfig, transformers_cfg: TransformersConfig, api_key: str | None):
    """The backend named by params (`openai` | `transformers`)."""
    if kind == "openai":
        return OpenAIBackend(openai_cfg, api_key)
    if kind == "transformers":
        return TransformersBackend(transformers_cfg)
    raise ValueError(f"unknown LLM backend {kind!r} (known: openai, transformers)")


# ---------------------------------------------------------------------------------------------
# Persistent cache
# ---------------------------------------------------------------------------------------------
def cache_key(backend: str, model: str, prompt: str, messages: list[dict[str, str]], gen: dict[str, Any]) -> str:
    blob = json.dumps(
        {"backend": backend, "model": model, "prompt": prompt, "messages": messages, "gen": gen},
        sort_keys=True,
        ensure_ascii=False,
        separators=(",", ":"),
    )
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class LLMCache:
    """SQLite file of finished calls; each answer is committed the moment it arrives (WAL mode)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # a committed row survives kill -9 of the process
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS calls (key TEXT PRIMARY KEY, backend TEXT, model TEXT, prompt TEXT, "
            "response TEXT NOT NULL, prompt_tokens INTEGER, completion_tokens INTEGER, created REAL)"
        )
        self._mutex = threading.Lock()

    def get(self, key: str) -> Completion | None:
        with self._mutex:
            row = self._db.execute(
                "SELECT response, prompt_tokens, completion_tokens FROM calls WHERE key = ?", (key,)
            ).fetchone()
        return Completion(row[0], row[1] or 0, row[2] or 0) if row else None

    def put(self, key: str, backend: str, model: str, prompt: str, completion: Completion) -> None:
        with self._mutex:
            self._db.execute(
                "INSERT OR REPLACE INTO calls VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    key,
                    backend,
                    model,
                    prompt,
                    completion.text,
                    completion.prompt_tokens,
                    completion.completion_tokens,
                    time.time(),
                ),
            )

    def __len__(self) -> int:
        with self._mutex:
            return int(self._db.execute("SELECT COUNT(*) FROM calls").fetchone()[0])

    def close(self) -> None:
        with self._mutex:
            try:
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            finally:
                self._db.close()

    def __enter__(self) -> LLMCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------
# Runner: prompt -> cached, validated JSON answer, many at a time
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Job:
    """One prompt call: `where` names it in rejects; `seed` is the sampling seed (attempt n uses seed+n)."""

    where: str
    prompt: Prompt
    inputs: dict[str, Any]
    seed: int


@dataclass
class Outcome:
    job: Job
    value: dict[str, Any] | None
    reason: str | None = None
    detail: str = ""
    raw: str | None = None
    prompt_hash: str = ""
    attempts: int = 0

    @property
    def ok(self) -> bool:
        return self.value is not None


@dataclass
class Usage:
    completions: int = 0
    cache_hits: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0
    cached_completion_tokens: int = 0
    invalid: Counter[str] = field(default_factory=Counter)

    def as_dict(self, backend_stats: Counter[str]) -> dict[str, int]:
        out = {k: v for k, v in self.__dict__.items() if k != "invalid"}
        out["requests"] = int(backend_stats.get("requests", 0))
        for k, v in sorted(backend_stats.items()):
            if k != "requests":
                out[k] = int(v)
        for k, v in sorted(self.invalid.items()):
            out[f"invalid_{k}"] = int(v)
        return dict(sorted(out.items()))


class Runner:
    """Runs jobs through a backend with the cache, schema validation and bounded concurrency."""

    def __init__(
        self,
        backend: Backend,
        cache: LLMCache | None,
        *,
        concurrency: int = 8,
        max_invalid_retries: int = 2,
        temperature: float | None = None,
        max_tokens: int | None = None,
    ) -> None:
        self.backend = backend
        self.cache = cache
        self.concurrency = concurrency
        self.max_invalid_retries = max_invalid_retries
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.usage = Usage()
        self._sem: asyncio.Semaphore | None = None

    def gen_params(self, prompt: Prompt, seed: int) -> dict[str, Any]:
        """Sampling params of one call: params.yaml wins over the prompt file's defaults."""
        return {
            "temperature": self.temperature if self.temperature is not None else prompt.generation.get("temperature"),
            "max_tokens": self.max_tokens if self.max_tokens is not None else prompt.generation.get("max_tokens"),
            "seed": seed,
            "json": True,
        }

    async def arun(self, job: Job) -> Outcome:
        messages = job.prompt.render(job.inputs)
        outcome = Outcome(job=job, value=None, prompt_hash=messages_hash(messages))
        for attempt in range(self.max_invalid_retries + 1):
            gen = self.gen_params(job.prompt, job.seed + attempt)
            key = cache_key(self.backend.name, self.backend.model, job.prompt.name, messages, gen)
            completion = self.cache.get(key) if self.cache is not None else None
            if completion is not None:
                self.usage.cache_hits += 1
                self.usage.cached_prompt_tokens += completion.prompt_tokens
                self.usage.cached_completion_tokens += completion.completion_tokens
            else:
                if self._sem is None:  # arun called directly, outside arun_many
                    self._sem = asyncio.Semaphore(self.concurrency)
                try:
                    async with self._sem:
                        completion = await self.backend.agenerate(messages, **gen)
                except LLMCallError as err:
                    outcome.reason, outcome.detail = f"llm_{err.reason}", err.detail
                    outcome.attempts = attempt + 1
                    return outcome
                self.usage.completions += 1
                self.usage.prompt_tokens += completion.prompt_tokens
                self.usage.completion_tokens += completion.completion_tokens
                if self.cache is not None:
                    self.cache.put(key, self.backend.name, self.backend.model, job.prompt.name, completion)
            outcome.attempts = attempt + 1
            value, reason, detail = parse_answer(completion.text, job.prompt.response_schema)
            outcome.raw = completion.text
            if value is not None:
                outcome.value, outcome.reason, outcome.detail = value, None, ""
                return outcome
            self.usage.invalid[reason or "unknown"] += 1
            outcome.reason, outcome.detail = reason, f"{detail} (attempt {attempt + 1})"
        return outcome

    async def arun_many(self, jobs: list[Job], *, progress: bool = False, desc: str = "llm") -> list[Outcome]:
        self._sem = asyncio.Semaphore(self.concurrency)
        bar = None
        if progress and jobs:
            from tqdm import tqdm

            bar = tqdm(total=len(jobs), desc=desc, unit="call", leave=False)

        results: list[Outcome | None] = [None] * len(jobs)
        todo = iter(range(len(jobs)))  # shared by the workers (one event loop: no race)

        async def worker() -> None:
            # `concurrency` workers each render, look up and call one job at a time, so rendering and
            # parsing overlap other workers' network waits instead of all happening up front
            for i in todo:
                results[i] = await self.arun(jobs[i])
                if bar is not None:
                    bar.update(1)

        try:
            await asyncio.gather(*(worker() for _ in range(min(self.concurrency, len(jobs)))))
            return [r for r in results if r is not None]
        finally:
            if bar is not None:
                bar.close()
            await self.backend.aclose()

    def run_many(self, jobs: list[Job], *, progress: bool = False, desc: str = "llm") -> list[Outcome]:
        """Run every job (concurrently, at most `concurrency` in flight); results in the jobs' order."""
        return asyncio.run(self.arun_many(jobs, progress=progress, desc=desc))

    def usage_dict(self) -> dict[str, int]:
        return self.usage.as_dict(self.backend.stats)


# ---------------------------------------------------------------------------------------------
# Prompt inputs from records (shared by synthesize and the filter's judge)
# ---------------------------------------------------------------------------------------------
def prompt_documents(documents: list[Document], max_documents: int = 5, max_chars: int = 800) -> list[dict[str, str]]:
    """Documents as prompt inputs: the first `max_documents`, each text cut to `max_chars`."""
    out = []
    for d in documents[:max_documents]:
        text = d.text if len(d.text) <= max_chars else d.text[:max_chars].rsplit(" ", 1)[0] + " ..."
        out.append({"doc_id": d.doc_id, "title": d.title, "text": text})
    return out


def judge_job(example: Example, prompt: Prompt, *, seed: int, max_documents: int = 5, max_chars: int = 800) -> Job:
    """A `judge_clarification` job for an example: the reply judged is its clarification (or its target)."""
    reply = example.clarification or json.dumps(example.target, ensure_ascii=False)
    return Job(
        where=example.id,
        prompt=prompt,
        inputs={
            "dialog": [m.model_dump() for m in example.messages[:-1]],
            "turn": example.last_turn,
            "documents": prompt_documents(example.documents, max_documents, max_chars),
            "reply": reply,
        },
        seed=seed,
    )
