"""The OpenAI-compatible backend: the `openai` client (AsyncOpenAI) against any OpenAI-compatible base URL
(OpenAI, vLLM, Ollama, llama.cpp server...). The client's own retries are off (`max_retries=0`): this
module retries 429 / 5xx / 408 / timeouts / connection errors / unreadable bodies with exponential backoff
and jitter, honouring `Retry-After`, at most `max_retries` times, and counts every retry. The API key is
passed in by the caller (the CLI reads it from the env var named in params); it is never logged, never
cached, and scrubbed from any error text that is recorded.

Params: `synthesize.openai.*` (the filter's and evaluate's judges reuse the section's shape).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import random
import time
from collections import Counter
from typing import Any

from pydantic import Field

from clariedge.config import StageConfig
from clariedge.llm_base import Completion, LLMCallError, LLMConfigError, short

log = logging.getLogger(__name__)

_JITTER = random.SystemRandom()  # backoff jitter only: it never affects what is generated


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
                detail = self._redact(f"HTTP {status}: {short(str(err.message), 300)}")
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
                reason, detail = "bad_response", self._redact(f"unreadable response body: {short(str(err), 200)}")
            else:
                completion = _completion_from(resp)
                if completion is not None:
                    return completion
                reason, detail = "bad_response", f"not a chat completion: {short(repr(resp), 200)}"
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
