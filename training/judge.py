"""The optional LLM judge of the `evaluate` stage: an OpenAI-compatible model rates the adapter's generated
clarification questions 1-5 against the reference (off by default: `evaluate.llm_judge.enabled`).

Answers are cached in the judge's own LLM cache (never synthesize's); a failure is counted, never fatal.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from pydantic import Field

from clariedge.chat_format import CLEAR
from clariedge.config import StageConfig
from clariedge.llm import OpenAIConfig
from clariedge.prompts import parse_answer
from clariedge.schema import Example
from clariedge.training import metrics as M

log = logging.getLogger(__name__)


class JudgeSettings(StageConfig):
    """Optional LLM judge of clarification quality through an OpenAI-compatible endpoint (off by default)."""

    enabled: bool
    openai: OpenAIConfig = Field(description="the judge's OpenAI-compatible endpoint")
    max_rows: int = Field(ge=1)
    cache: str = Field(description="the judge's own LLM cache (never synthesize's)")


# the judge's answer, validated as the generator's answers are
_RATING = {
    "type": "object",
    "required": ["rating"],
    "properties": {"rating": {"type": "number", "minimum": 1, "maximum": 5}},
}


def llm_judge(rows: Sequence[Example], questions: dict[int, str | None], cfg: JudgeSettings) -> dict[str, Any]:
    """Mean 1-5 rating of generated questions by an LLM judge (OpenAI-compatible), cached; None if nothing to judge."""
    import os

    from clariedge.llm import Completion, LLMCache, OpenAIBackend, cache_key

    backend = OpenAIBackend(cfg.openai, os.environ.get(cfg.openai.api_key_env))
    pairs = [(i, q) for i, q in sorted(questions.items()) if q and q != CLEAR and rows[i].needs_clarification]
    pairs = pairs[: cfg.max_rows]
    ratings: list[float] = []
    failed = 0
    with LLMCache(cfg.cache) as cache:
        for i, q in pairs:
            r = rows[i]
            dialog = "\n".join(f"{m.role}: {m.content}" for m in r.messages[-4:])
            msgs = [
                {"role": "system", "content": 'You rate clarification questions. Reply with JSON {"rating": 1-5}.'},
                {
                    "role": "user",
                    "content": (
                        f"Dialog:\n{dialog}\n\nInterpretations: {'; '.join(r.interpretations) or '(not given)'}\n"
                        f"Reference question: {r.clarification}\nCandidate question: {q}\n\n"
                        "Rate the candidate from 1 (useless) to 5 (asks exactly what must be clarified, naming the options)."
                    ),
                },
            ]
            key = cache_key("openai", cfg.openai.model, "clariedge.eval_judge/1", msgs, {"temperature": 0})
            hit = cache.get(key)
            try:
                text = hit.text if hit else backend.generate(msgs, temperature=0)
                value, reason, detail = parse_answer(text, _RATING)
                if value is None:
                    raise ValueError(f"{reason}: {detail}")
                rating = float(value["rating"])
                if not hit:  # only answers that parse are cached, so a bad one is asked again next run
                    cache.put(key, "openai", cfg.openai.model, "clariedge.eval_judge/1", Completion(text=text))
                ratings.append(rating)
            except Exception as err:  # a judge failure is counted, never fatal
                log.warning("judge failed on row %d: %s", i, err)
                failed += 1
    return {"rows": len(pairs), "failed": failed, "mean_rating": M.mean(ratings)}
