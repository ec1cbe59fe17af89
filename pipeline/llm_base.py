"""The LLM interface the backends and the runner share: a backend answers `generate(messages, **gen) -> str`
and `agenerate` (async, with token usage as a `Completion`); a failed call raises `LLMCallError` (a
per-row reject) or `LLMConfigError` (stop the stage). Backends: `clariedge.llm_openai`,
`clariedge.llm_transformers`; the cache and runner: `clariedge.llm`."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Protocol


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


def short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
