"""The parts of a run of stage `train`: the answer-loss module, the frozen bottom layers' cache (checked
against the plain forward), the checkpoint, the optimizer-step loop and the adapter's saving.

`training/train.py` wires them together; the module docstring there lists the stage's inputs, outputs
and params.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from clariedge.chat_format import FORMAT_VERSION
from clariedge.training.data import ADAPTER_META, Encoded, answer_ce, answer_loss
from clariedge.training.frozen import FrozenBottom

log = logging.getLogger(__name__)


class AnswerLossModel(torch.nn.Module):
    """The LM with the answer-only loss as its forward, so DDP sees one forward per step.

    With `bottom` (a filled `FrozenBottom`), only the layers above the cached ones run.
    """

    def __init__(self, lm: Any) -> None:
        super().__init__()
        self.lm = lm
        self.bottom: FrozenBottom | None = None

    def forward(self, batch: dict[str, Any]) -> Any:
        if self.bottom is not None:
            return answer_ce(self.bottom.tail_logits(batch), batch)
        return answer_loss(self.lm, batch)


def peak_ram_mb() -> float:
    """Peak resident memory of this process (MB)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024, 1)


def frozen_bottom(
    lm: Any,
    start: int,
    encoded: Sequence[Encoded],
    pad_id: int,
    batch_size: int,
    check_batch: dict[str, Any],
    *,
    autocast: Any,
    progress: bool,
) -> tuple[FrozenBottom | None, dict[str, Any]]:
    """Cache the bottom `start` layers' output for every row, then check on one batch (eval mode) that
    the top-layer path gives the plain forward's loss; when it does not (an architecture
    `frozen.run_layers` does not cover), warn and train with the plain forward."""
    t0 = time.perf_counter()
    bottom = FrozenBottom(lm, start)
    bottom.fill(encoded, pad_id, batch_size, autocast=autocast, progress=progress)
    dev = next(lm.parameters()).device
    batch = {k: v.to(dev) for k, v in check_batch.items()}
    lm.eval()
    with torch.no_grad(), autocast():
        plain = float(answer_loss(lm, batch))
        cached = float(answer_ce(bottom.tail_logits(batch), batch))
    lm.train()
    info = {
        "used": abs(plain - cached) <= 1e-2 * max(1.0, abs(plain)),
        "layers": start,
        "rows": len(encoded),
        "mb": round(sum(s.numel() for s in bottom.states) * 4 / 2**20, 1),
        "seconds": round(time.perf_counter() - t0, 1),
        "check_loss": {"plain": round(plain, 5), "cached": round(cached, 5)},
    }
    if not info["used"]:
        log.warning(
            "frozen_cache: the top-layer path gives loss %.5f against %.5f: using the plain forward", cached, plain
        )
        return None, info
    return bottom, info


@dataclass
class Progress:
    """Where a run stands: restored from a checkpoint, advanced by the loop, saved in the next checkpoint."""

    step: int = 0
    curve: list[dict[str, Any]] = field(default_factory=list)
    tokens: int = 0  # tokens seen by every run so far
    prior_wall: float = 0.0  # seconds of the earlier runs
    run_tokens: int = 0  # tokens seen by this run
    t0: float = 0.0  # when this run's timed part began

    def wall(self) -> float:
        """Seconds of this run so far."""
        return time.perf_counter() - self.t0


@dataclass
class Checkpoint:
    """`<dir>/state.pt`: adapter weights, optimizer, scheduler, RNG and `Progress`; resumed only by a run
    with the same `fingerprint` (params, rows, base model, precision)."""

    dir: Path
    fingerprint: str

    @property
    def file(self) -> Path:
        return self.dir / "state.pt"

    def remove(self) -> None:
        """Delete the checkpoint folder (a finished run)."""
        if self.file.exists():
            shutil.rmtree(self.dir, ignore_errors=True)

    def load(self, lm: Any, optimizer: Any, scheduler: Any) -> Progress:
        """Restore the weights, optimizer, scheduler and RNG from a matching checkpoint; the progress made."""
        from peft import set_peft_model_state_dict

        if not self.file.exists():
            return Progress()
        state = torch.load(self.file, map_location="cpu", weights_only=False)
        if state.get("fingerprint") != self.fingerprint:
            log.warning("ignoring checkpoint %s: it belongs to other data or params", self.file)
            return Progress()
        set_peft_model_state_dict(lm, state["adapter"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["torch_rng"])
        return Progress(step=state["step"], curve=state["curve"], tokens=state["tokens"], prior_wall=state["wall_s"])

    def save(self, lm: Any, optimizer: Any, scheduler: Any, progress: Progress) -> None:
        """Write the checkpoint atomically."""
        from peft import get_peft_model_state_dict

        self.dir.mkdir(parents=True, exist_ok=True)
        state = {
            "fingerprint": self.fingerprint,
            "adapter": get_peft_model_state_dict(lm),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "step": progress.step,
            "curve": progress.curve,
            "tokens": progress.tokens,
            "wall_s": progress.prior_wall + progress.wall(),
        }
        tmp = self.file.with_suffix(".tmp")
        torch.save(state, tmp)
        os.replace(tmp, self.file)


@dataclass
class Run:
    """One run's prepared parts (`accelerator.prepare`d model, optimizer, loader, scheduler), its length in
    optimizer steps, its checkpoint and its progress."""

    accelerator: Any
    model: Any
    optimizer: Any
    scheduler: Any
    loader: Any
    sampler: Any
    steps_per_epoch: int
    total_steps: int
    trainable: int
    checkpoint: Checkpoint
    progress: Progress = field(default_factory=Progress)

    @property
    def unwrapped(self) -> AnswerLossModel:
        return self.accelerator.unwrap_model(self.model)

    def resume(self) -> None:
        """Continue from the checkpoint when it belongs to this run."""
        self.progress = self.checkpoint.load(self.unwrapped.lm, self.optimizer, self.scheduler)

    def save(self) -> None:
        """Write the checkpoint (the main process only)."""
        if self.accelerator.is_main_process:
            self.checkpoint.save(self.unwrapped.lm, self.optimizer, self.scheduler, self.progress)


def run_steps(
    run: Run, *, grad_accum: int, log_every: int, save_every: int, stop_after: int | None, desc: str, progress: bool
) -> bool:
    """Optimizer steps from `run.progress.step` to `run.total_steps` (True), checkpointing every `save_every`
    steps; or, with `stop_after`, leave after that many steps of this run with a checkpoint written (False).
    A resumed run skips the batches its epoch has already seen (the sampler's order depends on the epoch)."""
    from tqdm.auto import tqdm

    acc, done, total = run.accelerator, run.progress, run.total_steps
    start_step = done.step
    epoch = done.step // run.steps_per_epoch
    window_loss, window_n = 0.0, 0
    bar = tqdm(total=total, initial=done.step, desc=desc, disable=not progress)
    while done.step < total:
        run.sampler.set_epoch(epoch)
        skip = (done.step - epoch * run.steps_per_epoch) * grad_accum
        for batch in acc.skip_first_batches(run.loader, skip) if skip else run.loader:
            with acc.accumulate(run.model):
                loss_t = run.model(batch)
                acc.backward(loss_t)
                run.optimizer.step()
                run.scheduler.step()
                run.optimizer.zero_grad()
            n_tok = int(batch["attention_mask"].sum()) + batch["prefix_ids"].shape[1] * batch["input_ids"].shape[0]
            done.run_tokens += n_tok
            done.tokens += n_tok
            window_loss += float(loss_t.detach())
            window_n += 1
            if not acc.sync_gradients:
                continue
            done.step += 1
            bar.update(1)
            loss = window_loss / max(1, window_n)
            window_loss, window_n = 0.0, 0
            done.curve.append({"step": done.step, "loss": round(loss, 5), "lr": float(run.scheduler.get_last_lr()[0])})
            bar.set_postfix(loss=f"{loss:.4f}")
            if done.step % log_every == 0:
                log.info("step %d/%d loss %.4f", done.step, total, loss)
            if done.step % save_every == 0 and done.step < total:
                run.save()
            if stop_after is not None and done.step - start_step >= stop_after and done.step < total:
                run.save()
                bar.close()
                return False
            if done.step >= total:
                break
        epoch += 1
    bar.close()
    return True


def save_adapter(lm: Any, tok: Any, base_dir: Path, out_dir: Path, meta: dict[str, Any]) -> None:
    """Write the adapter, the tokenizer and `clariedge_adapter.json` (`meta`, the base model and the format
    version) to `out_dir` atomically (a sibling `.tmp` folder, then rename); `adapter_config.json` names the
    base model as `clariedge_adapter.json` does."""
    meta = meta | {"base_model": _portable(base_dir, out_dir), "format_version": FORMAT_VERSION}
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    lm.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / ADAPTER_META).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", encoding="utf-8")

    def point_at_base(acfg: dict[str, Any]) -> bool:
        acfg["base_model_name_or_path"] = meta["base_model"]
        if isinstance(acfg.get("target_modules"), list):  # peft keeps a set: its order follows the hash seed
            acfg["target_modules"] = sorted(acfg["target_modules"])
        return True

    _rewrite_json(tmp / "adapter_config.json", point_at_base, sort_keys=True)
    # `local_files_only` says how the tokenizer was loaded (HF_HUB_OFFLINE), not what it is
    _rewrite_json(
        tmp / "tokenizer_config.json", lambda t: t.pop("local_files_only", None) is not None, ensure_ascii=False
    )
    if out_dir.exists():
        shutil.rmtree(out_dir)
    tmp.rename(out_dir)


def _rewrite_json(path: Path, change: Callable[[dict[str, Any]], bool], **dump: Any) -> None:
    """Read the JSON object at `path`, let `change` edit it in place, and write it back (indented) if it says
    it changed something."""
    obj = json.loads(path.read_text(encoding="utf-8"))
    if change(obj):
        path.write_text(json.dumps(obj, indent=2, **dump) + "\n", encoding="utf-8")


def _portable(base_dir: Path, out_dir: Path) -> str:
    """The base model path as written in the adapter: relative to the adapter folder when it is a local folder."""
    if base_dir.exists():
        return os.path.relpath(base_dir.resolve(), out_dir.resolve())
    return str(base_dir)
