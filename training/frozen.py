"""The frozen bottom of the model, run once per training row and reused every epoch.

With adapters in the top layers only (`train.lora.top_layers`), the layers below carry no trainable
weight and no dropout, so what they output for a row is the same in every epoch. `FrozenBottom`
runs them once over all training rows before the first step and keeps each row's hidden states at
the first adapter layer (fp32, in memory: rows x tokens x hidden size, ~0.2 GB for the sample).
Each step then runs only the top layers on the cached states (`tail_logits`), which saves the
bottom layers' forward pass in every epoch after the first pre-pass: about a quarter of a step.

The top layers are run by hand over the decoder's own modules (embeddings, rotary embeddings,
decoder layers, final norm, output head), with the batch's shared prompt prefix computed once and
its keys and values broadcast to the rows, as `data.forward_tail` does through the model's forward.
That is the Llama layout (SmolLM2, Llama, Qwen2, Mistral, ...). `train` compares the two on its
first batch and falls back to the plain forward when they disagree (another architecture).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from clariedge.training.data import Encoded, collate

log = logging.getLogger(__name__)


class _PrefixKV:
    """A minimal cache for the decoder layers: the prefix pass stores each layer's keys and values,
    the rows' pass gets them prepended (broadcast to the batch)."""

    def __init__(self) -> None:
        self.kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int, **_: Any) -> tuple[torch.Tensor, ...]:
        if layer_idx not in self.kv:
            self.kv[layer_idx] = (keys, values)
            return keys, values
        pk, pv = self.kv[layer_idx]
        b = keys.shape[0]
        return (
            torch.cat([pk.expand(b, -1, -1, -1), keys], dim=2),
            torch.cat([pv.expand(b, -1, -1, -1), values], dim=2),
        )


def unwrap_peft(lm: Any) -> Any:
    """The transformers model under a peft wrapper (the model itself when it is not wrapped)."""
    return lm.get_base_model() if hasattr(lm, "get_base_model") else lm


def run_layers(
    decoder: Any, layers: Sequence[Any], prefix_h: torch.Tensor, rows_h: torch.Tensor, attention_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run `layers` over a shared prefix (1, p, d) and left-padded rows (b, w, d) that attend to it.

    Positions and masks are those of `data.forward_tail`: the prefix at 0..p-1, each row's real tokens
    from p on, padding masked out (a padded position attends to itself only, so it stays finite).
    Returns the prefix's and the rows' hidden states after the last of `layers`.
    """
    b, w = attention_mask.shape
    p = prefix_h.shape[1]
    sdpa = getattr(decoder.config, "_attn_implementation", "sdpa") == "sdpa"
    dev = rows_h.device

    def as_mask(allowed: torch.Tensor) -> torch.Tensor:
        if sdpa:
            return allowed
        return torch.zeros(allowed.shape, device=dev).masked_fill(~allowed, torch.finfo(torch.float32).min)

    cache = _PrefixKV()
    if p:
        pos = torch.arange(p, device=dev)[None]
        emb = decoder.rotary_emb(prefix_h, position_ids=pos)
        mask = as_mask(torch.ones((p, p), dtype=torch.bool, device=dev).tril()[None, None])
        for layer in layers:
            prefix_h = layer(prefix_h, attention_mask=mask, position_ids=pos, cache=cache, position_embeddings=emb)
    real = attention_mask.bool()
    pos = (attention_mask.cumsum(-1) - 1).clamp(min=0) + p
    emb = decoder.rotary_emb(rows_h, position_ids=pos)
    causal = torch.ones((w, w), dtype=torch.bool, device=dev).tril()
    allowed = (causal[None] & real[:, None, :]) | torch.eye(w, dtype=torch.bool, device=dev)[None]
    allowed = torch.cat([torch.ones((b, w, p), dtype=torch.bool, device=dev), allowed], dim=2)[:, None]
    mask = as_mask(allowed)
    for layer in layers:
        rows_h = layer(rows_h, attention_mask=mask, position_ids=pos, cache=cache, position_embeddings=emb)
    return prefix_h, rows_h


class FrozenBottom:
    """Each training row's hidden states at decoder layer `start` (the first one with an adapter)."""

    def __init__(self, lm: Any, start: int) -> None:
        self.lm, self.start = lm, start
        # the decoder stack (`embed_tokens`, `layers`, `rotary_emb`, `norm`) and the output head
        self.decoder = unwrap_peft(lm).get_decoder()
        self.head = unwrap_peft(lm).get_output_embeddings()
        self.states: list[torch.Tensor] = []

    @torch.no_grad()
    def fill(
        self, encoded: Sequence[Encoded], pad_id: int, batch_size: int, *, autocast: Any, progress: bool = True
    ) -> None:
        """Run the bottom layers over every row (batches of similar length, shared prefix once per batch)."""
        from tqdm.auto import tqdm

        dec = self.decoder
        bottom = dec.layers[: self.start]
        order = sorted(range(len(encoded)), key=lambda i: (len(encoded[i].input_ids), i))
        self.states = [torch.empty(0)] * len(encoded)
        dev = dec.embed_tokens.weight.device
        for k in tqdm(range(0, len(order), batch_size), desc="bottom layers", disable=not progress):
            idx = order[k : k + batch_size]
            batch = collate([encoded[i] for i in idx], pad_id)
            mask = batch["attention_mask"].to(dev)
            with autocast():
                pre, rows = run_layers(
                    dec,
                    bottom,
                    dec.embed_tokens(batch["prefix_ids"].to(dev)),
                    dec.embed_tokens(batch["input_ids"].to(dev)),
                    mask,
                )
            for j, i in enumerate(idx):
                n = int(mask[j].sum())
                self.states[i] = torch.cat([pre[0], rows[j, rows.shape[1] - n :]]).float().clone()
        mb = sum(s.numel() for s in self.states) * 4 / 2**20
        log.info("cached the bottom %d layers' output for %d rows (%.0f MB)", self.start, len(encoded), mb)

    def tail_logits(self, batch: dict[str, Any]) -> torch.Tensor:
        """What `data.forward_tail` returns for a `collate` batch of cached rows (`batch["rows"]`), top layers only."""
        dec = self.decoder
        rows, mask = batch["rows"].tolist(), batch["attention_mask"]
        b, w = mask.shape
        p = batch["prefix_ids"].shape[1]
        first = self.states[rows[0]]
        rows_h = first.new_zeros((b, w, first.shape[-1]))
        for j, i in enumerate(rows):
            rest = self.states[i][p:]
            rows_h[j, w - rest.shape[0] :] = rest
        _, out = run_layers(dec, dec.layers[self.start :], first[:p][None], rows_h, mask)
        keep = batch["labels"].shape[1]
        return self.head(dec.norm(out[:, w - keep :]))


def collate_rows(encoded: Sequence[Encoded], pad_id: int, decision_weight: float) -> Any:
    """A DataLoader collate function over row indices: `data.collate` plus the indices (`rows`) for the cache."""

    def fn(idx: Sequence[int]) -> dict[str, Any]:
        batch = collate([encoded[i] for i in idx], pad_id, decision_weight=decision_weight)
        batch["rows"] = torch.tensor(list(idx), dtype=torch.long)
        return batch

    return fn
