"""End to end: `dvc repro` of the whole pipeline in a fresh copy of the project on a tiny params profile
(real stages, real models, few training steps), then the no-op re-run, a training-only change, and a
`dvc exp run -S` experiment read back through `dvc exp show`."""

from __future__ import annotations

import csv
import io
import json
import subprocess
from pathlib import Path

import pytest

from bench.pipeline_run import copy_project, env, ran_stages, repro, run_cmd, set_params

ROOT = Path(__file__).resolve().parents[1]

# Few rows and steps: the point is that every stage runs and wires into the next, not model quality.
TINY = {
    "train.max_steps": 2,
    "train.batch_size": 4,
    "train.max_length": 192,
    "train.save_every": 1,
    "evaluate.max_rows": 12,
    "evaluate.baselines.max_rows": 4,
    "evaluate.baselines.few_shot_k": 1,
    "evaluate.max_new_tokens": 24,
}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    proj = copy_project(tmp_path_factory.mktemp("e2e"))
    set_params(proj, TINY)
    subprocess.run(
        ["git", "commit", "-qam", "tiny params"],
        cwd=proj,
        check=True,
        env={
            **env(),
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@t",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t",
        },
    )
    return proj


@pytest.mark.slow
def test_cold_repro_noop_and_training_only_change(project: Path) -> None:
    # 1. a cold run builds everything
    _, out = repro(project)
    stages = set(ran_stages(out))
    assert {
        "ingest",
        "synthesize",
        "filter",
        "review",
        "clean",
        "publish",
        "base_model",
        "train@default",
        "train@no_hard_negatives",
        "evaluate",
        "ablation",
    } <= stages
    from datasets import load_from_disk

    dd = load_from_disk(str(project / "data" / "clariedge"))
    assert set(dd) == {"train", "validation", "test"} and all(len(dd[s]) > 0 for s in dd)
    ev = json.loads((project / "metrics" / "eval.json").read_text())
    adapter = ev["systems"]["adapter"]  # the adapter was scored on every test row, consistently
    c = adapter["confusion"]
    assert adapter["n"] == c["tp"] + c["fp"] + c["tn"] + c["fn"] > 0
    assert adapter["accuracy"] == pytest.approx((c["tp"] + c["tn"]) / adapter["n"], abs=1e-4)
    assert (project / "metrics" / "ablation.json").exists()
    assert (project / "models" / "default" / "adapter_config.json").exists()

    # 2. nothing changed: nothing reruns
    _, out = repro(project)
    assert ran_stages(out) == []

    # 3. a training-only param: only training, evaluation (own split and external sets) and the ablation rerun
    set_params(project, {"train.lr": 0.0002})
    _, out = repro(project)
    assert set(ran_stages(out)) == {"train@default", "train@no_hard_negatives", "evaluate", "ablation", "external"}

    # 4. an experiment: `dvc exp run -S` on the LoRA rank (default adapter + evaluate only), shown by `dvc exp show`
    code, _, _, out = run_cmd(
        ["dvc", "exp", "run", "-n", "rank4", "-S", "train.lora.r=4", "-S", "train.lora.alpha=8", "evaluate"], project
    )
    assert code == 0, out[-3000:]
    assert set(ran_stages(out)) == {"train@default", "evaluate"}
    code, _, _, shown = run_cmd(["dvc", "exp", "show", "--csv"], project)
    assert code == 0, shown[-3000:]
    rows = list(csv.DictReader(io.StringIO(shown)))
    exp = next(r for r in rows if r["Experiment"] == "rank4")
    assert exp["train.lora.r"] == "4" and exp["train.lora.alpha"] == "8"
    # the experiment's own evaluation is in the table (per-category cells may be empty on 12 tiny rows)
    assert 0.0 <= float(exp["systems.adapter.accuracy"]) <= 1.0
    assert 0 < float(exp["systems.adapter.n"]) <= TINY["evaluate.max_rows"]
