"""Stage `train`: a LoRA adapter (peft) on the chat-formatted examples, one per named variant.

A plain PyTorch loop driven by `accelerate.Accelerator`: the same code runs on CPU, on one GPU
(bf16 where the GPU supports it) and on several GPUs under `accelerate launch`. The loss covers the
answer tokens only (the contract JSON after the chat prompt); batches are padded to their longest
row and grouped by length; prompts are capped at `max_length` (documents are shortened first, the
last user turn is always kept). A checkpoint (adapter weights, optimizer, scheduler, RNG, loss
curve) is written every `save_every` optimizer steps under `checkpoint_dir/<variant>/`; a re-run
with the same data and params resumes from it.

Inputs:  the train split (parquet, `Example` rows), the base model folder (`models/base`).
Outputs: `models/<variant>/` (adapter, tokenizer, `clariedge_adapter.json`), `metrics/train_<variant>.json`
         (loss curve, steps, tokens/s, wall time, peak RAM).
Params:  `train.*` (LoRA r/alpha/dropout/target_modules, lr, epochs, batch_size, grad_accum, max_length,
         max_steps, max_rows, save_every, precision, threads) with the overrides of `train.variants.<name>`
         (e.g. `drop_categories: [hard_negative]`), and the top-level `seed`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field, model_validator

from clariedge.chat_format import FORMAT_VERSION
from clariedge.config import StageConfig
from clariedge.io import write_json
from clariedge.schema import CATEGORIES, Example
from clariedge.training.data import Encoded, encode_example, load_examples, stratified_sample
from clariedge.training.frozen import collate_rows
from clariedge.training.infer import Precision, use_bf16_for
from clariedge.training.loop import (
    AnswerLossModel,
    Checkpoint,
    Run,
    frozen_bottom,
    peak_ram_mb,
    run_steps,
    save_adapter,
)

log = logging.getLogger(__name__)


class LoraSettings(StageConfig):
    r: int = Field(ge=1)
    alpha: int = Field(ge=1)
    dropout: float = Field(ge=0.0, lt=1.0)
    target_modules: list[str] = Field(min_length=1)
    # adapters in the last N decoder layers only (None: every layer): backward then stops N layers down,
    # a third less compute at N = half the layers; `layers_to_transform` names the layers instead
    top_layers: int | None = Field(ge=1)
    layers_to_transform: list[int] | None

    @model_validator(mode="after")
    def _one_layer_choice(self) -> LoraSettings:
        if self.top_layers is not None and self.layers_to_transform is not None:
            raise ValueError("set either top_layers or layers_to_transform, not both")
        return self

    def layers(self, num_layers: int) -> list[int] | None:
        """The layer indices that get adapters in a model of `num_layers` decoder layers (None: all)."""
        if self.layers_to_transform is not None:
            bad = [i for i in self.layers_to_transform if not 0 <= i < num_layers]
            if bad:
                raise ValueError(f"train.lora.layers_to_transform: {bad} out of range for {num_layers} layers")
            return list(self.layers_to_transform)
        if self.top_layers is None or self.top_layers >= num_layers:
            return None
        return list(range(num_layers - self.top_layers, num_layers))


class VariantSettings(StageConfig):
    """What a named variant may change (everything else comes from the `train` section). These are
    overrides, not defaults: a key left out (None) keeps the `train` section's value."""

    drop_categories: list[str] | None = None
    lr: float | None = None
    epochs: float | None = None
    max_steps: int | None = None
    max_rows: int | None = None


class TrainConfig(StageConfig):
    lora: LoraSettings
    lr: float = Field(gt=0)
    weight_decay: float = Field(ge=0)
    warmup_ratio: float = Field(ge=0, lt=1)
    epochs: float = Field(gt=0)
    max_steps: int | None = Field(ge=1, description="cap on optimizer steps (a time budget)")
    batch_size: int = Field(ge=1)
    grad_accum: int = Field(ge=1)
    max_length: int = Field(ge=32)
    max_rows: int | None = Field(ge=1, description="cap on training rows (stratified by category)")
    decision_weight: float = Field(ge=0, description="loss weight of the first answer token (CLEAR vs ask)")
    frozen_cache: bool = Field(
        description="run the adapter-free bottom layers once per row and reuse their output every epoch"
    )
    calibrate: bool = Field(description="pick the decision threshold on the validation split after training")
    calibrate_rows: int | None = Field(ge=1, description="validation rows used for calibration (None: all)")
    calibrate_metric: Literal["accuracy", "balanced_accuracy"] = Field(
        description="what the threshold maximises on the validation split"
    )
    calibrate_target: Literal["validation", "real_turns"] = Field(
        description="validation: the threshold best on the validation split; real_turns: the one that asks on "
        "unlabelled real turns (--calibrate-turns) as often as the train split needs a question"
    )
    drop_categories: list[str]
    save_every: int = Field(ge=1, description="checkpoint every N optimizer steps")
    checkpoint_dir: str
    precision: Precision
    threads: int | None = Field(ge=1, description="torch CPU threads (None: all cores)")
    log_every: int = Field(ge=1)
    variants: dict[str, VariantSettings] = Field(min_length=1)

    def for_variant(self, name: str) -> TrainConfig:
        """This config with the named variant's overrides applied."""
        if name not in self.variants:
            raise ValueError(f"train.variants has no variant {name!r} (known: {', '.join(sorted(self.variants))})")
        over = {k: v for k, v in self.variants[name].model_dump().items() if v is not None}
        bad = set(over.get("drop_categories", [])) - set(CATEGORIES)
        if bad:
            raise ValueError(f"train.variants.{name}.drop_categories: unknown categories {sorted(bad)}")
        return self.model_copy(update=over)


# ---------------------------------------------------------------------------------------------
# Data selection and batching
# ---------------------------------------------------------------------------------------------
def select_rows(rows: Sequence[Example], cfg: TrainConfig, rng: random.Random) -> tuple[list[Example], dict[str, int]]:
    """Drop the configured categories, then cap to `max_rows` keeping the category mix."""
    drop = set(cfg.drop_categories)
    kept = [r for r in rows if r.category not in drop]
    stats = {"rows_in": len(rows), "dropped_categories": len(rows) - len(kept)}
    if cfg.max_rows and len(kept) > cfg.max_rows:
        kept = stratified_sample(kept, cfg.max_rows, rng, key=lambda r: r.category)
        stats["dropped_max_rows"] = len(rows) - stats["dropped_categories"] - len(kept)
    stats["rows_used"] = len(kept)
    return sorted(kept, key=lambda r: r.id), stats


def length_grouped_batches(lengths: Sequence[int], batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """Shuffled batches of similar lengths (less padding): shuffle, sort within windows of 16 batches."""
    rng = random.Random(f"{seed}:{epoch}")
    order = list(range(len(lengths)))
    rng.shuffle(order)
    window = batch_size * 16
    batches: list[list[int]] = []
    for i in range(0, len(order), window):
        chunk = sorted(order[i : i + window], key=lambda j: lengths[j])
        batches.extend(chunk[k : k + batch_size] for k in range(0, len(chunk), batch_size))
    rng.shuffle(batches)
    return batches


class _EpochSampler:
    """A batch sampler whose order depends on (seed, epoch) only, so a resumed run sees the same batches."""

    def __init__(self, lengths: Sequence[int], batch_size: int, seed: int) -> None:
        self.lengths, self.batch_size, self.seed, self.epoch = list(lengths), batch_size, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[list[int]]:
        return iter(length_grouped_batches(self.lengths, self.batch_size, self.seed, self.epoch))

    def __len__(self) -> int:
        return math.ceil(len(self.lengths) / self.batch_size)


def _fingerprint(cfg: TrainConfig, rows: Sequence[Example], base_dir: Path, use_bf16: bool) -> str:
    """What a checkpoint must match to be resumed: params, rows, base model and the precision used
    (resolved: `auto` is bf16 on one machine and fp32 on another)."""
    blob = json.dumps(
        [
            cfg.model_dump(exclude={"variants", "threads", "log_every", "checkpoint_dir", "precision"}),
            [r.id for r in rows],
            str(base_dir),
            "bf16" if use_bf16 else "fp32",
            FORMAT_VERSION,
        ],
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# The steps of a run
# ---------------------------------------------------------------------------------------------
def start(cfg: TrainConfig, seed: int) -> tuple[Any, bool]:
    """Seed first, then threads, device and precision: the `Accelerator`, and whether it runs in bf16."""
    from accelerate import Accelerator

    random.seed(seed)
    torch.manual_seed(seed)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    use_bf16 = use_bf16_for(cfg.precision)
    accelerator = Accelerator(gradient_accumulation_steps=cfg.grad_accum, mixed_precision="bf16" if use_bf16 else "no")
    return accelerator, use_bf16


def encode_rows(tok: Any, rows: Sequence[Example], max_length: int) -> tuple[list[Encoded], dict[str, Any]]:
    """Each row encoded within `max_length`; the mean and longest length, and how many rows each way of
    shortening touched."""
    encoded = [encode_example(tok, r, max_length) for r in rows]
    lengths = [len(e.input_ids) for e in encoded]
    trunc: Counter[str] = Counter()
    for e in encoded:
        trunc["truncated_documents"] += e.info.truncated_docs
        trunc["shortened_messages_rows"] += e.info.shortened_messages
        trunc["dropped_messages_rows"] += e.info.dropped_messages > 0
        trunc["cut_middle"] += e.info.cut_middle
        trunc["dropped_documents_rows"] += e.info.dropped_documents > 0
    stats = {"mean_length": round(sum(lengths) / len(lengths), 1), "max_length": max(lengths)}
    return encoded, stats | dict(sorted(trunc.items()))


def prepare(
    accelerator: Any, base_dir: Path, cfg: TrainConfig, sampler: _EpochSampler, collate_fn: Any, ckpt: Checkpoint
) -> Run:
    """The base model (fp32) with LoRA adapters in the answer-loss wrapper, AdamW with a linear warmup and
    decay over the run's optimizer steps, the batches, all through `accelerator.prepare`."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, get_linear_schedule_with_warmup

    lm = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    lm.config.use_cache = False
    lcfg = LoraConfig(
        r=cfg.lora.r,
        lora_alpha=cfg.lora.alpha,
        lora_dropout=cfg.lora.dropout,
        target_modules=list(cfg.lora.target_modules),
        layers_to_transform=cfg.lora.layers(lm.config.num_hidden_layers),
        task_type="CAUSAL_LM",
    )
    model = AnswerLossModel(get_peft_model(lm, lcfg))
    params = [p for p in model.parameters() if p.requires_grad]
    steps_per_epoch = math.ceil(len(sampler) / cfg.grad_accum)
    total_steps = max(1, math.ceil(steps_per_epoch * cfg.epochs))
    if cfg.max_steps:
        total_steps = min(total_steps, cfg.max_steps)
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(cfg.warmup_ratio * total_steps), total_steps)
    loader = torch.utils.data.DataLoader(range(len(sampler.lengths)), batch_sampler=sampler, collate_fn=collate_fn)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    trainable = sum(p.numel() for p in params)
    return Run(accelerator, model, optimizer, scheduler, loader, sampler, steps_per_epoch, total_steps, trainable, ckpt)


def cache_bottom(
    run: Run, cfg: TrainConfig, encoded: Sequence[Encoded], pad_id: int, collate_fn: Any, progress: bool
) -> dict[str, Any]:
    """With `frozen_cache` and no adapter in the bottom layers, run those layers once per row (`frozen_bottom`,
    checked on the first batch) and train the top layers on their cached output; what was done."""
    lm = run.unwrapped.lm
    adapter_layers = cfg.lora.layers(lm.config.num_hidden_layers)
    start_layer = min(adapter_layers) if adapter_layers else 0
    if not (cfg.frozen_cache and start_layer > 0):
        return {"used": False}
    check_batch = collate_fn(next(iter(run.sampler)))
    run.unwrapped.bottom, frozen = frozen_bottom(
        lm,
        start_layer,
        encoded,
        pad_id,
        cfg.batch_size,
        check_batch,
        autocast=run.accelerator.autocast,
        progress=progress,
    )
    return frozen


def train_metrics(
    run: Run,
    rows: Sequence[Example],
    cfg: TrainConfig,
    *,
    variant: str,
    lengths: dict[str, Any],
    precision: str,
    wall: float,
    frozen: dict[str, Any],
) -> dict[str, Any]:
    """The run's metrics: rows, steps, lengths, throughput, memory, the loss curve."""
    done, processes, curve = run.progress, run.accelerator.num_processes, run.progress.curve
    metrics: dict[str, Any] = {
        "variant": variant,
        "rows": len(rows),
        "rows_by_category": dict(sorted(Counter(r.category for r in rows).items())),
        "steps": done.step,
        "epochs": round(done.step / run.steps_per_epoch, 3),
        "batch_size": cfg.batch_size,
        "grad_accum": cfg.grad_accum,
        "processes": processes,
        "trainable_parameters": run.trainable,
        **lengths,
        "tokens": done.tokens,
        "tokens_per_s": round(done.run_tokens * processes / wall, 1) if wall > 0 else None,
        "wall_s": round(done.prior_wall + wall, 1),
        "peak_ram_mb": peak_ram_mb(),
        "first_loss": curve[0]["loss"] if curve else None,
        "final_loss": round(sum(c["loss"] for c in curve[-5:]) / len(curve[-5:]), 5) if curve else None,
        "device": str(run.accelerator.device),
        "precision": precision,
        "frozen_cache": frozen,
        "loss_curve": curve,
    }
    if torch.cuda.is_available():
        metrics["peak_gpu_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return metrics


# ---------------------------------------------------------------------------------------------
# A run
# ---------------------------------------------------------------------------------------------
def train(
    rows: Sequence[Example],
    base_dir: str | Path,
    out_dir: str | Path,
    cfg: TrainConfig,
    *,
    seed: int,
    variant: str = "default",
    progress: bool = True,
    stop_after: int | None = None,
) -> dict[str, Any]:
    """Train a LoRA adapter on `rows`, save it (with the tokenizer) to `out_dir`; returns the train metrics.

    `stop_after`: leave after this many optimizer steps of this run with a checkpoint written (no adapter
    saved; `{"interrupted": True, ...}` returned); the next call resumes from it. For split or tested runs.
    """
    from transformers import AutoTokenizer

    # ---- seed first, threads, device and precision -------------------------------------------
    accelerator, use_bf16 = start(cfg, seed)
    base_dir, out_dir = Path(base_dir), Path(out_dir)
    precision = "bf16" if use_bf16 else "fp32"
    log.info(
        "train %s: %d rows, device %s, precision %s, config %s",
        variant,
        len(rows),
        accelerator.device,
        precision,
        cfg.model_dump(exclude={"variants"}),
    )
    if not rows:
        raise ValueError("no training rows left after selection")

    # ---- tokenizer, encoding, batches ---------------------------------------------------------------
    tok = AutoTokenizer.from_pretrained(base_dir)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    encoded, lengths = encode_rows(tok, rows, cfg.max_length)
    sampler = _EpochSampler([len(e.input_ids) for e in encoded], cfg.batch_size, seed)
    collate_fn = collate_rows(encoded, tok.pad_token_id, cfg.decision_weight)

    # ---- model + LoRA, optimizer, schedule; resume from a checkpoint of the same run ------------------------
    fp = _fingerprint(cfg, rows, base_dir, use_bf16)
    ckpt = Checkpoint(Path(cfg.checkpoint_dir) / variant, fp)
    run = prepare(accelerator, base_dir, cfg, sampler, collate_fn, ckpt)
    run.resume()
    if run.progress.step:
        log.info("resumed %s from %s at step %d/%d", variant, run.checkpoint.file, run.progress.step, run.total_steps)

    # ---- the frozen bottom layers, once per row (in the wall time); the loop ------------------------------------
    show = progress and accelerator.is_main_process
    run.model.train()
    run.progress.t0 = time.perf_counter()
    frozen = cache_bottom(run, cfg, encoded, tok.pad_token_id, collate_fn, show)
    finished = run_steps(
        run,
        grad_accum=cfg.grad_accum,
        log_every=cfg.log_every,
        save_every=cfg.save_every,
        stop_after=stop_after,
        desc=f"train {variant}",
        progress=show,
    )
    if not finished:
        return {"interrupted": True, "steps": run.progress.step, "loss_curve": run.progress.curve}
    wall = run.progress.wall()

    # ---- metrics; the adapter, the tokenizer and the metadata -------------------------------------------------------
    accelerator.wait_for_everyone()
    metrics = train_metrics(
        run, rows, cfg, variant=variant, lengths=lengths, precision=precision, wall=wall, frozen=frozen
    )
    if accelerator.is_main_process:
        meta = {"variant": variant, "max_length": cfg.max_length, "seed": seed, "fingerprint": fp}
        save_adapter(run.unwrapped.lm, tok, base_dir, out_dir, meta | {"config": cfg.model_dump(exclude={"variants"})})
        run.checkpoint.remove()
    return metrics


def run(
    train_path: str | Path,
    base_dir: str | Path,
    out_dir: str | Path,
    metrics_path: str | Path | None,
    cfg: TrainConfig,
    *,
    seed: int,
    variant: str = "default",
    progress: bool = True,
    validation_path: str | Path | None = None,
    calibrate_turns: str | Path | None = None,
) -> dict[str, Any]:
    """Read the split, select the variant's rows, train, calibrate the decision threshold, write the metrics."""
    vcfg = cfg.for_variant(variant)
    if vcfg.calibrate and vcfg.calibrate_target == "real_turns" and calibrate_turns is None:
        raise ValueError("train.calibrate_target real_turns needs --calibrate-turns (unlabelled real dialogs)")
    rows, sel = select_rows(load_examples(train_path), vcfg, random.Random(seed))
    metrics = train(rows, base_dir, out_dir, vcfg, seed=seed, variant=variant, progress=progress)
    metrics["selection"] = sel
    if vcfg.calibrate and validation_path is not None:
        from clariedge.training.calibrate import calibrate

        metrics["calibration"] = calibrate(
            out_dir,
            base_dir,
            validation_path,
            vcfg.calibrate_rows,
            seed=seed,
            precision=vcfg.precision,
            metric=vcfg.calibrate_metric,
            turns=calibrate_turns if vcfg.calibrate_target == "real_turns" else None,
            ask_share=sum(r.needs_clarification for r in rows) / max(1, len(rows)),
        )
    if metrics_path:
        write_json(metrics_path, metrics)
    return metrics
