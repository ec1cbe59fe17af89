"""Benchmark: LoRA training throughput and memory of `clariedge train` on this machine.

Trains `--steps` optimizer steps on rows of a split (default: the published train split; else
examples built from the bundled sample with the construct backend) and prints tokens/s, seconds per
step, peak RAM and the process's CPU seconds (on a busy shared machine, tokens per CPU-second x cores
estimates the unloaded speed). Also times first-token classification (the evaluate path) on the same rows.

    .venv/bin/python -m bench.bench_train --steps 6 --batch-size 8 --max-length 256
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import tempfile
import time
from pathlib import Path

import clariedge.training  # noqa: F401  (sets OMP_WAIT_POLICY=PASSIVE before torch loads)


def _rows(split: Path | None, n: int) -> list:
    from clariedge.training.data import load_examples

    if split and split.exists():
        rows = load_examples(split)
    else:
        from clariedge.config import load_section
        from clariedge.construct import ConstructConfig, construct
        from clariedge.ingest import transform

        seeds, _, _ = transform(["data/sample"])
        rows, _, _ = construct(
            seeds, load_section("params.yaml", "synthesize.construct", ConstructConfig), rng=random.Random(0)
        )
    random.Random(0).shuffle(rows)
    return rows[:n]


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split", type=Path, default=Path("data/clariedge-parquet/train.parquet"))
    ap.add_argument("--base", type=Path, default=Path("models/base"))
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--classify-rows", type=int, default=32)
    ap.add_argument("--top-layers", type=int, default=15, help="adapters in the top N layers (0: all), as params.yaml")
    ap.add_argument("--params", type=Path, default=Path("params.yaml"), help="the train section (other keys)")
    args = ap.parse_args()

    import torch

    from clariedge.config import load_section
    from clariedge.training.infer import Clarifier
    from clariedge.training.train import LoraSettings, TrainConfig, train

    rows = _rows(args.split, args.steps * args.batch_size)
    lora = load_section(args.params, "train.lora", LoraSettings, top_layers=args.top_layers or None)
    cfg = load_section(
        args.params,
        "train",
        TrainConfig,
        max_steps=args.steps,
        epochs=100,
        batch_size=args.batch_size,
        max_length=args.max_length,
        save_every=10_000,
        lora=lora,
    )
    with tempfile.TemporaryDirectory() as tmp:
        cfg = cfg.model_copy(update={"checkpoint_dir": str(Path(tmp) / "ckpt")})
        cpu0 = _cpu_s()
        m = train(rows, args.base, Path(tmp) / "adapter", cfg, seed=0, progress=True)
        cpu_train = _cpu_s() - cpu0
        items = [(r.messages, r.documents or None) for r in rows[: args.classify_rows]]
        clar = Clarifier(Path(tmp) / "adapter", base=args.base, batch_size=args.batch_size)
        t0, cpu1 = time.perf_counter(), _cpu_s()
        clar.p_clear(items)
        cls_s, cls_cpu = time.perf_counter() - t0, _cpu_s() - cpu1
    cores = torch.get_num_threads()
    report = {
        "rows": len(rows),
        "steps": m["steps"],
        "batch_size": args.batch_size,
        "max_length": args.max_length,
        "mean_row_tokens": m["mean_length"],
        "tokens": m["tokens"],
        "wall_s": m["wall_s"],
        "s_per_step": round(m["wall_s"] / max(1, m["steps"]), 2),
        "tokens_per_s": m["tokens_per_s"],
        "cpu_s": round(cpu_train, 1),
        "tokens_per_cpu_s_x_threads": round(m["tokens"] / cpu_train * cores, 1) if cpu_train else None,
        "torch_threads": cores,
        "cpu_count": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "peak_ram_mb": m["peak_ram_mb"],
        "classify_rows_per_s": round(len(items) / cls_s, 2),
        "classify_cpu_s": round(cls_cpu, 1),
        "loss_first_last": [m["first_loss"], m["final_loss"]],
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
