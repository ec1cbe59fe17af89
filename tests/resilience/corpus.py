"""A corpus of bad inputs across the stages, each run through the real `clariedge` CLI in its own folder.

Every case builds its files in a temporary folder (nothing large is committed): good rows mixed with one
kind of bad input, a `params.yaml` (the project's own, with the case's overrides), and, for a fatal case,
an output that already exists. `run_case` runs `clariedge <stage> ...` as a subprocess with that folder
as its working directory and checks what a user would see:

- the exit code: 0 with a reject when the problem is one row; 1 when it is fatal (a params typo, a
  missing file, a file that is not a table of the stage's records);
- no Python traceback on stdout or stderr;
- the error or the reject names the place (file and line, file + row + field, or the params key);
- no good row lost: every good row mixed in is in the output; after a fatal error every output that
  existed before is byte-identical.

The filter runs with `filter.dedup.enabled: false` (no MiniLM load) except in one case, and with
`filter.balance.max_share: 1.0`, so that balancing (a drop by design) cannot remove a good row.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from clariedge.io import write_records
from clariedge.schema import EXAMPLE_SCHEMA, Example, SeedTurn

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "data" / "sample"

# a recognisable fake API key: the scenarios put it in the environment, the key scan looks for it
SECRET = "sk-resilience-LEAKCHECK-" + "7f3a9c" * 4

# overrides of the project's params.yaml for every case (see the module docstring)
BASE_OVERRIDES: dict[str, Any] = {"filter": {"dedup": {"enabled": False}, "balance": {"max_share": 1.0}}}


def cli_command() -> list[str]:
    """The installed console script beside this interpreter (`.venv/bin/clariedge`), else `python -m`."""
    exe = Path(sys.executable).parent / "clariedge"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "clariedge.cli"]


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def base_params() -> dict[str, Any]:
    params = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    return deep_merge(params, BASE_OVERRIDES)


# ---------------------------------------------------------------------------------------------
# Good rows: hand-written dialogs in every input format, and real Example rows the filter keeps
# ---------------------------------------------------------------------------------------------
def conversation(cid: str, n_user: int = 2, domain: str = "wiki") -> dict[str, Any]:
    """A good conversation in the project's JSONL format; its seed turns are `cid::1..n_user`."""
    turns: list[dict[str, Any]] = []
    for i in range(1, n_user + 1):
        doc = {"doc_id": f"{cid}-d{i}", "title": f"Topic {i}", "text": f"Passage {i} of {cid}: facts about topic {i}."}
        turns.append({"role": "user", "content": f"what about topic {i} in {cid}", "documents": [doc]})
        turns.append({"role": "assistant", "content": f"Topic {i} in {cid} is well documented."})
    return {"conversation_id": cid, "domain": domain, "turns": turns[:-1]}


def conv_ids(*convs: dict[str, Any]) -> set[str]:
    return {f"{c['conversation_id']}::{n}" for c in convs for n in range(1, len(c["turns"]) // 2 + 2)}


def mtrag_task(conv: str, turn: int = 2, **over: Any) -> dict[str, Any]:
    """A good MTRAG generation-task row (its seed turn is `conv::turn`)."""
    row = {
        "task_id": f"{conv}<::>{turn}",
        "Collection": "mt-rag-clapnq-elser-512-100-20240503",
        "input": [
            {"speaker": "user", "text": f"who wrote the book {conv}"},
            {"speaker": "agent", "text": "It was written by a novelist."},
            {"speaker": "user", "text": "when was it published"},
        ],
        "contexts": [{"document_id": f"{conv}-doc", "title": "The book", "text": "The book came out in 1999."}],
    }
    row.update(over)
    return row


def bundle(tasks: list[dict[str, Any]]) -> dict[str, Any]:
    docs = [{"document_id": "bd1", "title": "Bridges", "text": "The bridge opened in 1937 and is 2.7 km long."}]
    return {"documents": docs, "tasks": tasks}


def bundle_task(conv: str, doc_id: str = "bd1") -> dict[str, Any]:
    return {
        "task_id": f"{conv}<::>1",
        "input": [{"speaker": "user", "text": f"how long is the bridge in {conv}"}],
        "contexts": [{"document_id": doc_id}],
    }


def jl(*rows: Any) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)


@dataclass
class Pools:
    """Real rows made once per session: seed turns (ingest of the sample) and candidates the filter keeps."""

    seeds: list[SeedTurn]
    examples: list[Example]

    @property
    def good(self) -> list[Example]:
        return self.examples[:10]

    @property
    def spare(self) -> list[Example]:
        return self.examples[10:]


def make_pools() -> Pools:
    """Ingest the bundled sample, run the construct backend on 100 seed turns, keep what the filter keeps."""
    from clariedge import filter as F
    from clariedge import ingest, synthesize

    seeds, _, _ = ingest.transform([SAMPLE])
    rows, _, _ = synthesize.transform(
        seeds,
        synthesize.SynthesizeConfig.model_validate({**base_params()["synthesize"], "max_seeds": 100}),
        rng=random.Random(1),
    )
    # the project's own filter, near-duplicates included (no cache file): the good rows must survive any case's
    # params, also those that switch de-duplication back on
    project = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))["filter"]
    dedup = {**project["dedup"], "enabled": True, "cache": None}
    fcfg = F.FilterConfig.model_validate({**project, "dedup": dedup, "separability": False})
    kept, _, _ = F.transform([r.model_dump(mode="json") for r in rows], fcfg, rng=random.Random(1))
    kept = sorted(kept, key=lambda e: e.id)
    if len(kept) < 14:
        raise RuntimeError(f"the filter kept only {len(kept)} constructed rows; the corpus needs 14")
    return Pools(seeds=seeds, examples=kept)


def write_table(path: Path, rows: list[dict[str, Any]], schema: pa.Schema | None = EXAMPLE_SCHEMA) -> None:
    """Rows as they are (not validated), with the Example schema unless another is given."""
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(rows, schema=schema) if schema is not None else pa.Table.from_pylist(rows)
    pq.write_table(table, path)


def dump(ex: Example, **over: Any) -> dict[str, Any]:
    return {**ex.model_dump(mode="json"), **over}


def with_last_turn(ex: Example, text: str) -> dict[str, Any]:
    msgs = [m.model_dump() for m in ex.messages]
    msgs[-1] = {"role": "user", "content": text}
    return dump(ex, messages=msgs, id="")


# ---------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------
@dataclass
class Setup:
    """What one case runs and what it expects."""

    args: list[str]
    place: list[str]  # every string must appear in the reject file / the error output
    output: str | None = None  # the output whose rows are checked (relative to the case folder)
    record: str = "seed"  # how output rows are identified: seed | example | publish
    good: set[str] = field(default_factory=set)  # ids that must be in the output
    rejects: str | None = None
    reason: str | None = None  # a reject with this reason must exist (per-row cases)
    params: dict[str, Any] = field(default_factory=dict)  # overrides of base_params()
    params_text: str | None = None  # a params.yaml written as is (a broken file)
    keep: list[str] = field(default_factory=list)  # fatal: outputs that exist before and must not change
    env: dict[str, str] = field(default_factory=dict)
    count_good: Callable[[Path], tuple[int, int]] | None = None  # custom (good, lost) accounting


@dataclass(frozen=True)
class Case:
    id: str
    stage: str
    kind: str
    fatal: bool
    build: Callable[[Path, Pools, contextlib.ExitStack], Setup]
    what: str = ""


CASES: list[Case] = []


def case(stage: str, kind: str, *, fatal: bool = False, what: str = "") -> Callable:
    def register(fn: Callable[[Path, Pools, contextlib.ExitStack], Setup]) -> Callable:
        CASES.append(Case(fn.__name__.removeprefix("c_").replace("_", "-"), stage, kind, fatal, fn, what))
        return fn

    return register


def _ingest(inp: str = "in.jsonl", *extra: str) -> list[str]:
    return ["ingest", inp, "-o", "seeds.parquet", "--rejects", "rejects.jsonl", "--stats", "ingest.json", *extra]


def _ingest_setup(place: list[str], good: set[str], reason: str, inp: str = "in.jsonl") -> Setup:
    return Setup(_ingest(inp), place, "seeds.parquet", "seed", good, "rejects.jsonl", reason)


G1, G2 = conversation("good-a", 3), conversation("good-b", 2, domain="govt")
GOOD_IDS = conv_ids(G1, G2)


# --- ingest: per-row problems (exit 0, a reject naming file and line) ---------------------------
@case("ingest", "malformed JSONL", what="a line cut off mid-object between good lines")
def c_ingest_malformed_jsonl(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    (d / "in.jsonl").write_text(jl(G1, '{"conversation_id": "broken", "turns": [{"role": "us', G2))
    return _ingest_setup(["in.jsonl:2", "Unterminated string"], GOOD_IDS, "malformed_json")


@case("ingest", "JSON line not an object", what="a JSON array where a conversation object belongs")
def c_ingest_json_not_object(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    (d / "in.jsonl").write_text(jl(G1, ["good-c", "user", "hello"], G2))
    return _ingest_setup(["in.jsonl:2", "expected a JSON object, got list"], GOOD_IDS, "malformed_json")


@case("ingest", "wrong types", what="conversation_id is a number")
def c_ingest_wrong_types(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    bad = {**conversation("x"), "conversation_id": 42}
    (d / "in.jsonl").write_text(jl(G1, bad, G2))
    return _ingest_setup(["in.jsonl:2", "conversation_id: expected str, got int"], GOOD_IDS, "invalid_row")


@case("ingest", "empty dialog", what="a conversation with no turns")
def c_ingest_empty_dialog(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    bad = {"conversation_id": "empty", "domain": "wiki", "turns": []}
    (d / "in.jsonl").write_text(jl(G1, bad, G2))
    return _ingest_setup(["in.jsonl:2", "turns: the conversation has no turns"], GOOD_IDS, "invalid_row")


@case("ingest", "last turn not a user turn", what="a seed-turn line whose dialog ends with the assistant")
def c_ingest_not_user_turn(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    bad = {
        "conversation_id": "nu",
        "turn": 1,
        "domain": "wiki",
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello, how can I help?"}],
    }
    (d / "in.jsonl").write_text(jl(G1, bad, G2))
    return _ingest_setup(["in.jsonl:2", "messages", "must end with a user turn"], GOOD_IDS, "invalid_row")


@case("ingest", "last turn not a user turn", what="an MTRAG task whose input ends with the agent")
def c_ingest_mtrag_agent_last(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    bad = mtrag_task("mt-bad")
    bad["input"] = bad["input"][:2]
    (d / "tasks.jsonl").write_text(jl(mtrag_task("mt-a"), bad, mtrag_task("mt-b")))
    return _ingest_setup(
        ["tasks.jsonl:2", "must end with a user turn"], {"mt-a::2", "mt-b::2"}, "invalid_row", "tasks.jsonl"
    )


@case("ingest", "unknown speaker role", what="a turn with role `bot` in the middle of a conversation")
def c_ingest_unknown_role(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    bad = conversation("rolebad", 3)
    bad["turns"][3]["role"] = "bot"
    (d / "in.jsonl").write_text(jl(G1, bad, G2))
    # the turns before the broken one stay (rolebad::1 and ::2); the dialog after it cannot be trusted
    good = GOOD_IDS | {"rolebad::1", "rolebad::2"}
    return _ingest_setup(["in.jsonl:2 turns.3", "role: Input should be 'user' or 'assistant'"], good, "invalid_row")


@case("ingest", "document without text", what="a turn's retrieved document has no `text`")
def c_ingest_document_without_text(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    bad = conversation("notext", 2)
    del bad["turns"][2]["documents"][0]["text"]
    (d / "in.jsonl").write_text(jl(G1, bad, G2))
    good = GOOD_IDS | {"notext::1"}
    return _ingest_setup(["in.jsonl:2 turns.2", "documents.0.text: field required"], good, "invalid_row")


@case("ingest", "document without text", what="an MTRAG task context with no text")
def c_ingest_mtrag_context_without_text(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    bad = mtrag_task("mt-bad", contexts=[{"document_id": "d9", "title": "t"}])
    (d / "tasks.jsonl").write_text(jl(mtrag_task("mt-a"), bad, mtrag_task("mt-b")))
    return _ingest_setup(
        ["tasks.jsonl:2", "document 'd9' has no text"], {"mt-a::2", "mt-b::2"}, "invalid_row", "tasks.jsonl"
    )


@case("ingest", "malformed id", what="an MTRAG task id without a turn number")
def c_ingest_bad_task_id(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    bad = mtrag_task("mt-bad", task_id="no-turn-number-here")
    (d / "tasks.jsonl").write_text(jl(mtrag_task("mt-a"), bad, mtrag_task("mt-b")))
    return _ingest_setup(
        ["tasks.jsonl:2", "task id 'no-turn-number-here'"], {"mt-a::2", "mt-b::2"}, "invalid_row", "tasks.jsonl"
    )


@case("ingest", "duplicated ids", what="a BEIR lastturn file with the same `_id` twice")
def c_ingest_beir_duplicate_id(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    beir = d / "beir"
    beir.mkdir()
    (beir / "wiki_lastturn.jsonl").write_text(
        jl(
            {"_id": "bc1<::>2", "text": "|user|: how big is it"},
            {"_id": "bc1<::>2", "text": "|user|: how heavy is it"},
            {"_id": "bc2<::>3", "text": "|user|: and the second one"},
        )
    )
    (beir / "wiki_rewrite.jsonl").write_text(
        jl({"_id": "bc1<::>2", "text": "|user|: how big is a cat"}, {"_id": "bc2<::>3", "text": "|user|: and the dog"})
    )
    return _ingest_setup(
        ["beir/wiki_lastturn.jsonl:2", "already seen at line 1"], {"bc1::2", "bc2::3"}, "duplicate_id", "beir"
    )


@case("ingest", "duplicated ids", what="the same conversation_id on two lines with different dialogs")
def c_ingest_duplicate_conversation(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    other = {**conversation("other", 3), "conversation_id": "good-a"}
    other["turns"][0]["content"] = "a different dialog under a reused id"
    (d / "in.jsonl").write_text(jl(G1, G2, other))
    return _ingest_setup(["in.jsonl:3", "good-a", "line 1"], GOOD_IDS, "duplicate_id")


@case("ingest", "non-UTF-8 bytes", what="a Latin-1 byte on line 2 of 3")
def c_ingest_non_utf8(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    bad = json.dumps(conversation("latin", 1)).replace("topic 1", "caf\u00e9").encode("latin-1")
    (d / "in.jsonl").write_bytes(jl(G1).encode() + bad + b"\n" + jl(G2).encode())
    return _ingest_setup(["in.jsonl:2", "byte 0xe9", "not UTF-8"], GOOD_IDS, "not_utf8")


@case("ingest", "empty file", what="an empty .jsonl beside a good one")
def c_ingest_empty_file(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    (d / "in").mkdir()
    (d / "in" / "a.jsonl").write_text(jl(G1, G2))
    (d / "in" / "b.jsonl").write_text("")
    return _ingest_setup(["in/b.jsonl", "the file is empty"], GOOD_IDS, "empty_file", "in")


@case("ingest", "truncated JSON", what="an MTRAG bundle .json cut in half beside a good file")
def c_ingest_truncated_bundle(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    (d / "in").mkdir()
    (d / "in" / "a.jsonl").write_text(jl(G1, G2))
    text = json.dumps(bundle([bundle_task("b1"), bundle_task("b2")]), indent=1)
    (d / "in" / "bundle.json").write_text(text[: len(text) // 2])
    return _ingest_setup(["in/bundle.json:", "truncated?"], GOOD_IDS, "malformed_json", "in")


@case("ingest", "unknown document id", what="an MTRAG bundle task citing a document the bundle lacks")
def c_ingest_bundle_unknown_document(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    (d / "bundle.json").write_text(json.dumps(bundle([bundle_task("b1"), bundle_task("b2", "nope-404")])))
    return _ingest_setup(
        ["bundle.json:tasks[1]", "document 'nope-404' is not in the bundle's documents"],
        {"b1::1"},
        "invalid_row",
        "bundle.json",
    )


@case("ingest", "BEIR rewrite without lastturn", what="a domain with only <domain>_rewrite.jsonl")
def c_ingest_beir_rewrite_only(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    beir = d / "beir"
    beir.mkdir()
    (beir / "wiki_lastturn.jsonl").write_text(jl({"_id": "bc1<::>2", "text": "|user|: how big is it"}))
    (beir / "wiki_rewrite.jsonl").write_text(jl({"_id": "bc1<::>2", "text": "|user|: how big is a cat"}))
    (beir / "govt_rewrite.jsonl").write_text(jl({"_id": "gv1<::>3", "text": "|user|: how do I renew a passport"}))
    return _ingest_setup(["beir/govt_rewrite.jsonl:1", "govt_lastturn.jsonl"], {"bc1::2"}, "unpaired", "beir")


@case("ingest", "unknown format", what="a .jsonl whose rows have none of the known keys")
def c_ingest_unknown_format(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    (d / "in").mkdir()
    (d / "in" / "a.jsonl").write_text(jl(G1, G2))
    (d / "in" / "other.jsonl").write_text(jl({"question": "what?", "answer": "that"}))
    return _ingest_setup(["in/other.jsonl", "cannot tell the format"], GOOD_IDS, "unknown_format", "in")


# --- fatal problems: exit 1, one line naming the place, the previous output untouched ------------
def _fatal(args: list[str], place: list[str], keep: list[str], **kw: Any) -> Setup:
    return Setup(args, place, keep=keep, **kw)


def _seed_output(d: Path, pools: Pools) -> None:
    write_records(d / "seeds.parquet", pools.seeds[:5])


@case("ingest", "params typo", fatal=True, what="`ingest.strcit: true` (unknown key)")
def c_ingest_params_typo(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    (d / "in.jsonl").write_text(jl(G1, G2))
    _seed_output(d, pools)
    return _fatal(
        _ingest(), ["params.yaml", "ingest.strcit: unknown key"], ["seeds.parquet"], params={"ingest": {"strcit": True}}
    )


@case("ingest", "missing input file", fatal=True, what="the input path does not exist")
def c_ingest_missing_input(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    _seed_output(d, pools)
    return _fatal(_ingest("missing.jsonl"), ["missing.jsonl", "no such file"], ["seeds.parquet"])


@case("ingest", "params file not YAML", fatal=True, what="an unclosed bracket in params.yaml")
def c_ingest_params_not_yaml(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    (d / "in.jsonl").write_text(jl(G1, G2))
    _seed_output(d, pools)
    text = "seed: 1\ningest:\n  source: paths\n  paths: [data/sample\n"
    return _fatal(_ingest(), ["params.yaml", "not valid YAML", "line 4"], ["seeds.parquet"], params_text=text)


@case("ingest", "output path blocked", fatal=True, what="the rejects path goes through a file (`seeds.parquet/...`)")
def c_ingest_output_path_blocked(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    (d / "in.jsonl").write_text(jl(G1, G2))
    _seed_output(d, pools)
    args = ["ingest", "in.jsonl", "-o", "seeds.parquet", "--rejects", "seeds.parquet/rejects.jsonl"]
    return _fatal(args, ["cannot read or write seeds.parquet"], ["seeds.parquet"])


# --- synthesize ----------------------------------------------------------------------------------
def _synth(*extra: str, seeds: str = "seeds.parquet") -> list[str]:
    return ["synthesize", seeds, "-o", "candidates.parquet", "--rejects", "rejects.jsonl", "--stats",
            "synthesize.json", "--cache", "cache/llm.sqlite", "--no-progress", *extra]  # fmt: skip


def _candidates_output(d: Path, pools: Pools) -> None:
    write_records(d / "candidates.parquet", pools.good)


@case("synthesize", "not a parquet file", fatal=True, what="the seeds file is plain text")
def c_synthesize_seeds_not_parquet(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    (d / "seeds.parquet").write_text("conversation_id,turn\nx,1\n")
    _candidates_output(d, pools)
    return _fatal(_synth(), ["seeds.parquet", "Parquet"], ["candidates.parquet"])


@case("synthesize", "missing column", fatal=True, what="seed turns without the `last_turn` column")
def c_synthesize_seeds_missing_column(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    write_records(d / "full.parquet", pools.seeds[:6])
    pq.write_table(pq.read_table(d / "full.parquet").drop_columns(["last_turn"]), d / "seeds.parquet")
    _candidates_output(d, pools)
    return _fatal(_synth(), ["seeds.parquet", "row 0", "last_turn: field required"], ["candidates.parquet"])


@case("synthesize", "wrong param type", fatal=True, what="`synthesize.max_seeds: many`")
def c_synthesize_wrong_param_type(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    write_records(d / "seeds.parquet", pools.seeds[:6])
    _candidates_output(d, pools)
    return _fatal(
        _synth(), ["synthesize.max_seeds", "valid integer"], ["candidates.parquet"],
        params={"synthesize": {"max_seeds": "many"}},
    )  # fmt: skip


@case("synthesize", "LLM answer not JSON", what="the OpenAI-compatible server answers prose for one category")
def c_synthesize_llm_not_json(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    from openai_stub import Behaviour, OpenAIStub

    stub = stack.enter_context(OpenAIStub())
    stub.rule = lambda n, body: (
        Behaviour.ok("Sure! Here is a hard negative: it depends.") if "HARD NEGATIVE" in body["messages"][0]["content"]
        else None
    )  # fmt: skip
    write_records(d / "seeds.parquet", pools.seeds)
    _candidates_output(d, pools)
    params = {
        "synthesize": {
            "backend": "openai",
            "max_seeds": 5,
            "max_invalid_retries": 1,
            "openai": {"base_url": stub.base_url, "model": "stub-model", "max_retries": 1, "backoff_base_s": 0.01},
        }
    }

    def count(dd: Path) -> tuple[int, int]:
        stats = json.loads((dd / "synthesize.json").read_text())
        rows = pq.read_table(dd / "candidates.parquet").to_pylist()
        good_jobs = stats["jobs"] - 5  # one hard_negative job per seed turn
        made = sum(1 for r in rows if r["category"] != "hard_negative")
        return good_jobs, max(0, good_jobs - made)

    return Setup(
        _synth(),
        ["/hard_negative/", "invalid_json", "Expecting value"],
        "candidates.parquet",
        "example",
        rejects="rejects.jsonl",
        params=params,
        env={"OPENAI_API_KEY": SECRET},
        count_good=count,
    )


def _llm_params(base_url: str) -> dict[str, Any]:
    openai = {"base_url": base_url, "model": "stub-model", "max_retries": 1, "backoff_base_s": 0.01, "timeout_s": 5}
    return {"synthesize": {"backend": "openai", "max_seeds": 3, "openai": openai}}


@case("synthesize", "LLM server unreachable", fatal=True, what="nothing listens at synthesize.openai.base_url")
def c_synthesize_llm_unreachable(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    import socket

    with socket.socket() as sock:  # a port that was free a moment ago: connection refused
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    write_records(d / "seeds.parquet", pools.seeds)
    _candidates_output(d, pools)
    return _fatal(
        _synth(), [url, "llm_connection_error", "candidates.parquet not written"], ["candidates.parquet"],
        params=_llm_params(url), env={"OPENAI_API_KEY": SECRET},
    )  # fmt: skip


@case("synthesize", "API key refused", fatal=True, what="the server answers HTTP 401 to every call")
def c_synthesize_llm_key_refused(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    from openai_stub import Behaviour, OpenAIStub

    stub = stack.enter_context(OpenAIStub())
    stub.rule = lambda n, body: Behaviour.server_error(401)
    write_records(d / "seeds.parquet", pools.seeds)
    _candidates_output(d, pools)
    return _fatal(
        _synth(), [stub.base_url, "HTTP 401", "the API key was refused"], ["candidates.parquet"],
        params=_llm_params(stub.base_url), env={"OPENAI_API_KEY": SECRET},
    )  # fmt: skip


# --- filter: per-row problems in a candidates parquet --------------------------------------------
def _filter(inp: str = "candidates.parquet") -> list[str]:
    return ["filter", inp, "-o", "filtered.parquet", "--rejects", "rejects.jsonl", "--stats", "filter.json"]


BAD_AT = 3  # the bad row's index in the candidates table


def _filter_setup(d: Path, pools: Pools, bad: dict[str, Any], place: list[str], reason: str, **kw: Any) -> Setup:
    rows = [dump(e) for e in pools.good]
    rows.insert(BAD_AT, bad)
    write_table(d / "candidates.parquet", rows)
    good = {e.id for e in pools.good}
    return Setup(_filter(), place, "filtered.parquet", "example", good, "rejects.jsonl", reason, **kw)


def _spare(pools: Pools, ambiguous: bool | None = None, setting: str | None = None) -> Example:
    for e in pools.spare:
        if (ambiguous is None or e.needs_clarification == ambiguous) and (setting is None or e.setting == setting):
            return e
    raise LookupError("no spare row of that kind in the pool")


@case("filter", "label contradicts category", what="an ambiguous_dialog row with needs_clarification false")
def c_filter_label_contradicts_category(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    bad = dump(_spare(pools, ambiguous=True), needs_clarification=False)
    place = [f"candidates.parquet row {BAD_AT}", "needs_clarification=False contradicts category"]
    return _filter_setup(d, pools, bad, place, "invalid_row")


@case("filter", "huge field", what="a 5 MB last turn (MiniLM de-duplication on for this case)")
def c_filter_huge_turn(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    ex = _spare(pools)
    bad = with_last_turn(ex, "word " * 1_000_000 + "?")
    bad_id = Example.model_validate(bad).id
    params = {"filter": {"dedup": {"enabled": True}}}
    return _filter_setup(d, pools, bad, [bad_id, "last turn has 5000001 chars > 600"], "too_long", params=params)


@case("filter", "duplicated ids", what="the same row twice (the first copy must stay)")
def c_filter_duplicate_row(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    twin = pools.good[5]
    return _filter_setup(d, pools, dump(twin), [twin.id, "same id as an earlier row"], "duplicate")


@case("filter", "empty dialog", what="a row whose messages list is empty")
def c_filter_empty_dialog(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    bad = dump(_spare(pools), messages=[])
    return _filter_setup(
        d, pools, bad, [f"candidates.parquet row {BAD_AT}", "messages", "at least one message"], "invalid_row"
    )


@case("filter", "last turn not a user turn", what="a row whose dialog ends with the assistant")
def c_filter_not_user_turn(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    ex = _spare(pools)
    msgs = [*(m.model_dump() for m in ex.messages), {"role": "assistant", "content": "Anything else?"}]
    bad = dump(ex, messages=msgs, id="x")
    return _filter_setup(
        d, pools, bad, [f"candidates.parquet row {BAD_AT}", "must end with a user turn"], "invalid_row"
    )


@case("filter", "document without text", what="a post-retrieval row with an empty document text")
def c_filter_document_without_text(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    ex = _spare(pools, setting="post_retrieval")
    docs = [dd.model_dump() for dd in ex.documents]
    docs[0]["text"] = ""
    bad = dump(ex, documents=docs)
    return _filter_setup(d, pools, bad, [f"candidates.parquet row {BAD_AT}", "documents.0.text"], "invalid_row")


@case("filter", "null required field", what="conversation_id is null")
def c_filter_null_conversation(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    bad = dump(_spare(pools), conversation_id=None)
    return _filter_setup(
        d, pools, bad, [f"candidates.parquet row {BAD_AT}", "conversation_id: field required"], "invalid_row"
    )


@case("filter", "id not the content hash", what="a row edited after its id was computed")
def c_filter_id_mismatch(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    ex = _spare(pools)
    bad = {**with_last_turn(ex, ex.last_turn + " please"), "id": ex.id}
    return _filter_setup(
        d, pools, bad, [f"candidates.parquet row {BAD_AT}", ex.id, "is not the content hash"], "id_mismatch"
    )


# --- filter: fatal ---------------------------------------------------------------------------------
def _filtered_output(d: Path, pools: Pools) -> None:
    write_records(d / "filtered.parquet", pools.good)


@case("filter", "empty parquet", fatal=True, what="a candidates file with no rows")
def c_filter_empty_parquet(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    write_table(d / "candidates.parquet", [])
    _filtered_output(d, pools)
    return _fatal(_filter(), ["candidates.parquet", "no candidate rows"], ["filtered.parquet"])


@case("filter", "missing column", fatal=True, what="candidates without the `category` column")
def c_filter_missing_column(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    write_table(d / "full.parquet", [dump(e) for e in pools.good])
    pq.write_table(pq.read_table(d / "full.parquet").drop_columns(["category"]), d / "candidates.parquet")
    _filtered_output(d, pools)
    return _fatal(_filter(), ["candidates.parquet", "missing column", "category"], ["filtered.parquet"])


@case("filter", "not a parquet file", fatal=True, what="a JSONL file passed where the candidates parquet belongs")
def c_filter_jsonl_as_parquet(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    (d / "candidates.jsonl").write_text(jl(*(dump(e) for e in pools.good[:3])))
    _filtered_output(d, pools)
    return _fatal(_filter("candidates.jsonl"), ["candidates.jsonl", "Parquet"], ["filtered.parquet"])


@case("filter", "wrong param type", fatal=True, what="`filter.length.max_turn_chars: lots`")
def c_filter_wrong_param_type(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    write_records(d / "candidates.parquet", pools.good)
    _filtered_output(d, pools)
    params = {"filter": {"length": {"max_turn_chars": "lots"}}}
    return _fatal(_filter(), ["filter.length.max_turn_chars", "valid integer"], ["filtered.parquet"], params=params)


@case("filter", "params typo", fatal=True, what="`filter.dedup.treshold` (unknown nested key)")
def c_filter_params_typo(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    write_records(d / "candidates.parquet", pools.good)
    _filtered_output(d, pools)
    params = {"filter": {"dedup": {"treshold": 0.9}}}
    return _fatal(_filter(), ["filter.dedup.treshold: unknown key"], ["filtered.parquet"], params=params)


# --- review (offline modes) -------------------------------------------------------------------------
def _review(mode: str = "none") -> list[str]:
    return ["review", "run", "filtered.parquet", "-o", "reviewed.parquet", "--stats", "review.json", "--mode", mode]


@case("review", "broken export", fatal=True, what="mode import: the Argilla export's records.json is truncated")
def c_review_import_truncated_export(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    write_records(d / "filtered.parquet", pools.good)
    write_records(d / "reviewed.parquet", pools.good[:4])
    (d / "export").mkdir()
    (d / "export" / "records.json").write_text('[{"id": "0b0c", "fields": {"dialog": "hi"')
    return _fatal(
        _review("import"), ["export/records.json", "not valid JSON"], ["reviewed.parquet"],
        params={"review": {"import_path": "export"}},
    )  # fmt: skip


@case("review", "wrong param value", fatal=True, what="`review.incomplete: maybe` (not one of the choices)")
def c_review_wrong_param_value(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    write_records(d / "filtered.parquet", pools.good)
    write_records(d / "reviewed.parquet", pools.good[:4])
    params = {"review": {"incomplete": "maybe"}}
    return _fatal(_review(), ["review.incomplete", "keep_generator_label"], ["reviewed.parquet"], params=params)


@case("review", "missing column", fatal=True, what="examples without the `messages` column")
def c_review_missing_column(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    write_table(d / "full.parquet", [dump(e) for e in pools.good])
    pq.write_table(pq.read_table(d / "full.parquet").drop_columns(["messages"]), d / "filtered.parquet")
    write_records(d / "reviewed.parquet", pools.good[:4])
    return _fatal(_review(), ["filtered.parquet", "messages"], ["reviewed.parquet"])


# --- clean and publish --------------------------------------------------------------------------------
def _clean() -> list[str]:
    return ["clean", "reviewed.parquet", "-o", "cleaned.parquet", "--issues", "issues.csv", "--report", "issues.md",
            "--confusion", "confusion.png", "--stats", "clean.json", "--cache", "cache/embeddings.sqlite"]  # fmt: skip


def _publish() -> list[str]:
    return ["publish", "cleaned.parquet", "-o", "dataset", "--parquet-dir", "parquet", "--chat-dir", "chat",
            "--stats", "publish.json"]  # fmt: skip


def _wrong_type_table(path: Path, pools: Pools, column: str, value: Any) -> None:
    rows = [dump(e) for e in pools.good]
    rows[BAD_AT][column] = value
    fields = [pa.field(column, pa.string()) if f.name == column else f for f in EXAMPLE_SCHEMA]
    write_table(path, [{**r, column: str(r[column])} for r in rows], pa.schema(fields))


@case("clean", "wrong column type", fatal=True, what="`needs_clarification` stored as text, one row `maybe`")
def c_clean_wrong_column_type(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    _wrong_type_table(d / "reviewed.parquet", pools, "needs_clarification", "maybe")
    write_records(d / "cleaned.parquet", pools.good[:4])
    return _fatal(_clean(), ["reviewed.parquet", f"row {BAD_AT}", "needs_clarification"], ["cleaned.parquet"])


@case("clean", "empty parquet", fatal=True, what="a reviewed file with no rows")
def c_clean_empty_parquet(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    write_table(d / "reviewed.parquet", [])
    write_records(d / "cleaned.parquet", pools.good[:4])
    return _fatal(_clean(), ["reviewed.parquet", "no rows"], ["cleaned.parquet"])


@case("publish", "wrong column type", fatal=True, what="`setting` stored as text, one row `7`")
def c_publish_wrong_column_type(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    _wrong_type_table(d / "cleaned.parquet", pools, "setting", 7)
    _publish_output(d, pools)
    return _fatal(_publish(), ["cleaned.parquet", f"row {BAD_AT}", "setting"], ["parquet/train.parquet"])


@case("publish", "empty parquet", fatal=True, what="a cleaned file with no rows")
def c_publish_empty_parquet(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    write_table(d / "cleaned.parquet", [])
    _publish_output(d, pools)
    return _fatal(_publish(), ["cleaned.parquet", "no rows"], ["parquet/train.parquet"])


@case("publish", "wrong param value", fatal=True, what="split ratios that sum to 1.1")
def c_publish_bad_ratios(d: Path, pools: Pools, stack: contextlib.ExitStack) -> Setup:
    write_records(d / "cleaned.parquet", pools.good)
    _publish_output(d, pools)
    params = {"publish": {"ratios": {"train": 0.8, "validation": 0.15, "test": 0.15}}}
    return _fatal(_publish(), ["publish.ratios", "sum to 1"], ["parquet/train.parquet"], params=params)


def _publish_output(d: Path, pools: Pools) -> None:
    write_records(d / "parquet" / "train.parquet", pools.good[:4])


# ---------------------------------------------------------------------------------------------
# Running a case
# ---------------------------------------------------------------------------------------------
@dataclass
class CaseResult:
    id: str
    stage: str
    kind: str
    fatal: bool
    rc: int
    traceback: bool
    place_named: bool
    good_rows: int
    lost: int
    seconds: float
    message: str
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems


def output_ids(path: Path, record: str) -> set[str]:
    if record == "publish":
        return set().union(*(output_ids(path / f"{s}.parquet", "example") for s in ("train", "validation", "test")))
    if not path.exists():
        return set()
    rows = pq.read_table(path).to_pylist()
    if record == "seed":
        return {f"{r['conversation_id']}::{r['turn']}" for r in rows}
    return {r["id"] for r in rows}


def _rows(parquet_bytes: bytes) -> int:
    return pq.read_metadata(pa.BufferReader(parquet_bytes)).num_rows


def _reject_line(rejects_text: str, needle: str) -> str:
    """The first reject naming `needle`, as `where: reason: detail`."""
    for line in rejects_text.splitlines():
        r = json.loads(line)
        text = f"{r['where']}: {r['reason']}: {r['detail']}"
        if needle in text:
            return text
    return ""


def _first_line(text: str, needle: str) -> str:
    for line in text.splitlines():
        if needle in line:
            return line.strip()
    return text.strip().splitlines()[-1].strip() if text.strip() else ""


def run_case(c: Case, root: Path, pools: Pools, timeout: float = 300) -> CaseResult:
    d = root / c.id
    d.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        s = c.build(d, pools, stack)
        params_file = d / "params.yaml"
        if s.params_text is not None:
            params_file.write_text(s.params_text, encoding="utf-8")
        else:
            params_file.write_text(yaml.safe_dump(deep_merge(base_params(), s.params), sort_keys=False))
        before = {k: (d / k).read_bytes() for k in s.keep}
        env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
        env.update(s.env)
        t0 = time.perf_counter()
        proc = subprocess.run(cli_command() + s.args, cwd=d, env=env, capture_output=True, text=True, timeout=timeout)
        seconds = time.perf_counter() - t0
    (d / "stdout.log").write_text(proc.stdout)
    (d / "stderr.log").write_text(proc.stderr)
    problems: list[str] = []
    output = proc.stdout + proc.stderr
    traceback = "Traceback" in output
    if traceback:
        problems.append("a traceback was printed")
    rejects_text = (d / s.rejects).read_text() if s.rejects and (d / s.rejects).exists() else ""
    if c.fatal:
        if proc.returncode != 1:
            problems.append(f"exit code {proc.returncode}, expected 1 (a fatal error)")
        haystack = output
        message = _first_line(proc.stderr, "error:")
    else:
        if proc.returncode != 0:
            problems.append(f"exit code {proc.returncode}, expected 0 (a per-row problem)")
        reasons = {json.loads(line)["reason"] for line in rejects_text.splitlines() if line.strip()}
        if s.reason and s.reason not in reasons:
            problems.append(f"no reject with reason {s.reason!r} (got {sorted(reasons)})")
        haystack = rejects_text + output
        message = _reject_line(rejects_text, s.place[0]) or _first_line(output, s.place[0])
    missing = [p for p in s.place if p not in haystack]
    if missing:
        problems.append(f"the error/reject does not name {missing}")
    good = lost = 0
    if c.fatal:
        changed = [k for k, v in before.items() if not (d / k).exists() or (d / k).read_bytes() != v]
        if changed:
            problems.append(f"pre-existing output changed: {changed}")
        # the good rows here are those of the outputs that existed before the failed run
        good = sum(_rows(v) for v in before.values())
        lost = sum(_rows(before[k]) for k in changed)
    elif s.count_good is not None:
        if proc.returncode == 0:
            good, lost = s.count_good(d)
        else:
            good = lost = -1
    else:
        got = output_ids(d / s.output, s.record) if s.output else set()
        good, lost = len(s.good), len(s.good - got)
    if lost:
        problems.append(f"{lost} good rows lost")
    return CaseResult(
        c.id, c.stage, c.kind, c.fatal, proc.returncode, traceback, not missing, good, lost, round(seconds, 2),
        message[:200], problems,
    )  # fmt: skip
