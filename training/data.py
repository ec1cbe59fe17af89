"""Turning examples into token ids for training and inference, with the same chat format and length caps.

The chat comes from `clariedge.chat_format.build_messages` (system instruction + documents + dialog);
the answer always starts with the fixed prefix `{"clarification": "`, which inference puts into the
prompt itself. The prefix and the rest of the answer are tokenised separately, so the tokens the
model is trained on are exactly the tokens it continues from at inference.

Length caps, in order, until the prompt fits `max_length - answer tokens`:
1. shorten every document's text proportionally (to 60 characters at least): documents are the bulk
   of a post-retrieval prompt;
2. shorten the earlier dialog messages (long assistant answers first) to a cap that falls from 400 to
   100 characters: a referent named many turns back stays visible;
3. drop the oldest dialog messages (the last user turn is always kept);
4. drop the last documents, keeping two;
5. cut the middle of what is left: the whole system instruction stays, then the end of the rest.

The prompt budget is the same for every row, in training and at inference: `max_length - ANSWER_ROOM`
(`prompt_budget`). A budget that shrank with each row's answer would let prompt length tell a
question row from a CLEAR row in training, a cue that does not exist at inference.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clariedge.chat_format import CLEAR, SYSTEM_PROMPT, build_messages, target_json

ANSWER_PREFIX = '{"clarification": "'
ANSWER_ROOM = 48  # tokens kept free for the answer after the prompt (longer answers take more, see encode_example)


MESSAGE_CAPS = (400, 240, 160, 100)  # characters per earlier dialog message, tried in turn (step 2 below)


def prompt_budget(max_length: int) -> int:
    """Prompt tokens allowed for a row of `max_length` tokens (the answer gets `ANSWER_ROOM`)."""
    return max(16, max_length - ANSWER_ROOM)


def _get(obj: Any, key: str, default: Any = None) -> Any:
    return obj.get(key, default) if isinstance(obj, dict) else getattr(obj, key, default)


def _as_dicts(messages: Sequence[Any]) -> list[dict[str, str]]:
    return [{"role": _get(m, "role"), "content": _get(m, "content")} for m in messages]


def _docs_as_dicts(documents: Sequence[Any] | None) -> list[dict[str, str]]:
    return [
        {"doc_id": _get(d, "doc_id", "") or "", "title": _get(d, "title", "") or "", "text": _get(d, "text", "") or ""}
        for d in documents or []
    ]


def _chat_text(tok: Any, chat: list[dict[str, str]], system_suffix: str = "") -> str:
    if system_suffix:
        chat = [{**chat[0], "content": chat[0]["content"] + "\n\n" + system_suffix}, *chat[1:]]
    return tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) + ANSWER_PREFIX


def _chat_ids(tok: Any, chat: list[dict[str, str]], system_suffix: str = "") -> list[int]:
    return tok(_chat_text(tok, chat, system_suffix), add_special_tokens=False)["input_ids"]


def _instruction_len(tok: Any, chat: list[dict[str, str]]) -> int:
    """Tokens from the start of the prompt to the end of the system instruction (what a middle cut keeps)."""
    text = _chat_text(tok, chat)
    end = text.find(SYSTEM_PROMPT)
    if end < 0:  # a chat template that rewrites the system message: keep nothing special
        return 0
    return len(tok(text[: end + len(SYSTEM_PROMPT)], add_special_tokens=False)["input_ids"])


@dataclass
class PromptInfo:
    ids: list[int]
    truncated_docs: bool = False
    shortened_messages: bool = False
    dropped_messages: int = 0
    dropped_documents: int = 0
    cut_middle: bool = False


def encode_prompt(
    tok: Any,
    messages: Sequence[Any],
    documents: Sequence[Any] | None,
    max_prompt: int,
    min_doc_chars: int = 60,
    system_suffix: str = "",
) -> PromptInfo:
    """Prompt ids (chat template + generation prompt + answer prefix) of at most `max_prompt` tokens."""
    msgs = _as_dicts(messages)
    docs = _docs_as_dicts(documents)
    info = PromptInfo(ids=_chat_ids(tok, build_messages(msgs, docs), system_suffix))
    # 1. shorten the documents, proportionally to how far over the budget the prompt is
    for _ in range(8):
        if len(info.ids) <= max_prompt or not docs:
            break
        total = sum(len(d["text"]) for d in docs)
        if total <= min_doc_chars * len(docs):
            break
        over = len(info.ids) - max_prompt
        # ~3.5 characters per token on English text; cut a little more than needed
        cut = int(over * 4 * 1.1) + 8
        keep_total = max(min_doc_chars * len(docs), total - cut)
        ratio = keep_total / total
        docs = [
            {**d, "text": d["text"][: max(min_doc_chars, int(len(d["text"]) * ratio))].rstrip() + " ..."} for d in docs
        ]
        info.truncated_docs = True
        info.ids = _chat_ids(tok, build_messages(msgs, docs), system_suffix)
    # 2. shorten the earlier messages, the longest first (the last user turn stays whole)
    for cap in MESSAGE_CAPS:
        if len(info.ids) <= max_prompt:
            break
        short = [
            m if len(m["content"]) <= cap else {**m, "content": m["content"][:cap].rstrip() + " ..."} for m in msgs[:-1]
        ]
        if short == msgs[:-1]:
            continue
        msgs = [*short, msgs[-1]]
        info.shortened_messages = True
        info.ids = _chat_ids(tok, build_messages(msgs, docs), system_suffix)
    # 3. drop the oldest messages, keeping the last user turn
    while len(info.ids) > max_prompt and len(msgs) > 1:
        msgs = msgs[1:]
        while len(msgs) > 1 and msgs[0]["role"] != "user":
            msgs = msgs[1:]
            info.dropped_messages += 1
        info.dropped_messages += 1
        info.ids = _chat_ids(tok, build_messages(msgs, docs), system_suffix)
    # 4. drop the last documents (two stay: enough to show competing readings)
    while len(info.ids) > max_prompt and len(docs) > 2:
        docs = docs[:-1]
        info.dropped_documents += 1
        info.ids = _chat_ids(tok, build_messages(msgs, docs), system_suffix)
    # 5. cut the middle: the instruction stays whole when that leaves at least a quarter for the rest
    if len(info.ids) > max_prompt:
        head = _instruction_len(tok, build_messages(msgs, docs))
        if head > max_prompt * 3 // 4:
            head = max_prompt // 4
        info.ids = info.ids[:head] + info.ids[len(info.ids) - (max_prompt - head) :]
        info.cut_middle = True
    return info


def answer_ids(tok: Any, clarification: str) -> list[int]:
    """Tokens after the answer prefix: the value, the closing `"}` and the end-of-turn token."""
    rest = target_json({"needs_clarification": clarification != CLEAR, "clarification": clarification})
    if not rest.startswith(ANSWER_PREFIX):
        raise ValueError(f"target JSON does not start with the answer prefix: {rest[:40]!r}")
    ids = tok(rest[len(ANSWER_PREFIX) :], add_special_tokens=False)["input_ids"]
    return ids + [tok.eos_token_id]


@dataclass
class Encoded:
    input_ids: list[int]
    labels: list[int]
    info: PromptInfo


def encode_example(tok: Any, example: Any, max_length: int, max_answer: int = 96) -> Encoded:
    """Prompt + answer ids for one example, at most `max_length`; labels are -100 on the prompt (loss on the answer).

    The answer prefix is part of the prompt, so the loss covers exactly what inference generates. The
    prompt gets `prompt_budget(max_length)` tokens, as at inference; only an answer longer than
    `ANSWER_ROOM` (a rare long question) takes its extra tokens from that row's prompt.
    """
    target = _get(example, "clarification") if _get(example, "needs_clarification") else CLEAR
    ans = answer_ids(tok, target)
    if len(ans) > max_answer:
        ans = ans[: max_answer - 1] + [tok.eos_token_id]
    budget = min(prompt_budget(max_length), max_length - len(ans))
    info = encode_prompt(tok, _get(example, "messages"), _get(example, "documents"), budget)
    return Encoded(info.ids + ans, [-100] * len(info.ids) + ans, info)


def common_prefix_len(rows: Sequence[Sequence[int]], min_len: int = 16) -> int:
    """Length of the token prefix shared by every row (0 if shorter than `min_len`); each row keeps >= 1 token."""
    if len(rows) < 2:
        return 0
    limit = min(len(r) for r in rows) - 1
    first = rows[0]
    n = 0
    while n < limit and all(r[n] == first[n] for r in rows[1:]):
        n += 1
    return n if n >= min_len else 0


def collate(
    batch: Sequence[Encoded], pad_id: int, share_prefix: bool = True, decision_weight: float = 1.0
) -> dict[str, Any]:
    """A training batch: the shared prompt prefix once, the rest left-padded, the answer labels at the end.

    Every row starts with the same system instruction, so it is computed once per batch (its keys and
    values are broadcast to the rows; gradients flow through them exactly). Left padding lines the
    answers up at the end, so only the last `K` positions need the vocabulary projection.
    `decision_weight` weights the loss of each row's first answer token (the one that decides CLEAR
    or ask) against 1 for the other answer tokens.
    """
    import torch

    p = common_prefix_len([e.input_ids for e in batch]) if share_prefix else 0
    rest = [e.input_ids[p:] for e in batch]
    width = max(len(r) for r in rest)
    answer = max(sum(x != -100 for x in e.labels) for e in batch)
    keep = min(width, answer + 1)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    labels = torch.full((len(batch), keep), -100, dtype=torch.long)
    weights = torch.zeros((len(batch), keep), dtype=torch.float32)
    for i, e in enumerate(batch):
        n = len(rest[i])
        ids[i, width - n :] = torch.tensor(rest[i])
        mask[i, width - n :] = 1
        labels[i] = torch.tensor(e.labels[len(e.labels) - keep :])
        answer_pos = (labels[i] != -100).nonzero().flatten()
        weights[i, answer_pos] = 1.0
        weights[i, answer_pos[0]] = decision_weight
    return {
        "prefix_ids": torch.tensor([batch[0].input_ids[:p]], dtype=torch.long),
        "input_ids": ids,
        "attention_mask": mask,
        "labels": labels,
        "weights": weights,
    }


def forward_tail(model: Any, prefix_ids: Any, input_ids: Any, attention_mask: Any, keep: int) -> Any:
    """Logits of the last `keep` positions of each (left-padded) row, with the shared prefix computed once."""
    import torch
    from transformers import DynamicCache

    b, p = input_ids.shape[0], prefix_ids.shape[1]
    cache = None
    if p:
        pre = model(input_ids=prefix_ids, use_cache=True, logits_to_keep=1)
        kv = [(layer.keys.expand(b, -1, -1, -1), layer.values.expand(b, -1, -1, -1)) for layer in pre.cache.layers]
        cache = DynamicCache(ddp_cache_data=kv, config=model.config)
        attention_mask = torch.cat(
            [torch.ones((b, p), dtype=attention_mask.dtype, device=attention_mask.device), attention_mask], dim=1
        )
    pos = (attention_mask[:, p:].cumsum(-1) - 1).clamp(min=0) + p
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=pos,
        cache=cache,
        use_cache=False,
        logits_to_keep=keep,
    )
    return out.logits


def answer_loss(model: Any, batch: dict[str, Any]) -> Any:
    """Weighted mean cross-entropy over the answer tokens of a `collate` batch (plain mean when all weights are 1)."""
    keep = batch["labels"].shape[1]
    return answer_ce(forward_tail(model, batch["prefix_ids"], batch["input_ids"], batch["attention_mask"], keep), batch)


def answer_ce(logits: Any, batch: dict[str, Any]) -> Any:
    """`answer_loss` on the logits of the batch's last `labels.shape[1]` positions."""
    import torch

    labels = batch["labels"]
    ce = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
        labels[:, 1:].reshape(-1),
        ignore_index=-100,
        reduction="none",
    )
    w = batch["weights"][:, 1:].reshape(-1).to(ce.dtype)
    return (ce * w).sum() / w.sum().clamp(min=1e-6)


def left_pad(rows: Sequence[Sequence[int]], pad_id: int) -> dict[str, Any]:
    """Left padding for batched generation / next-token scoring (the last position is the real last token)."""
    import torch

    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = torch.tensor(list(r))
        mask[i, width - len(r) :] = 1
    return {"input_ids": ids, "attention_mask": mask}


ADAPTER_META = "clariedge_adapter.json"  # what training records beside an adapter (threshold, window, base model)


def adapter_meta(adapter_dir: str | Path) -> dict[str, Any]:
    """An adapter's `clariedge_adapter.json`, or {} for an adapter trained elsewhere."""
    path = Path(adapter_dir) / ADAPTER_META
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def load_examples(path: Any) -> list[Any]:
    """Example rows from a split parquet file; columns the schema does not know (e.g. `target`) are ignored."""
    from clariedge.io import read_records
    from clariedge.schema import Example

    return read_records(path, Example, ignore_unknown=True)


def stratified_sample(rows: Sequence[Any], n: int | None, rng: Any, key: Any = None) -> list[Any]:
    """At most `n` rows keeping the mix of `key(row)` (default: category x setting); sorted by id, deterministic."""
    rows = sorted(rows, key=lambda r: _get(r, "id"))
    if not n or len(rows) <= n:
        return rows
    key = key or (lambda r: (_get(r, "category"), _get(r, "setting")))
    groups: dict[Any, list[Any]] = {}
    for r in rows:
        groups.setdefault(key(r), []).append(r)
    out: list[Any] = []
    # largest-remainder allocation, at least one row per group while n allows
    quotas = {g: n * len(v) / len(rows) for g, v in groups.items()}
    alloc = {g: int(q) for g, q in quotas.items()}
    rest = n - sum(alloc.values())
    for g in sorted(groups, key=lambda g: (-(quotas[g] - alloc[g]), str(g)))[:rest]:
        alloc[g] += 1
    for g in sorted(groups, key=str):
        group = list(groups[g])
        rng.shuffle(group)
        out.extend(group[: alloc[g]])
    return sorted(out, key=lambda r: _get(r, "id"))
