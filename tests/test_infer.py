"""Inference: the answer parser on junk, the input readers (MTRAG tasks, project JSONL, split parquet), and
`clariedge predict` end to end with a real (briefly trained) adapter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import params_section
from typer.testing import CliRunner

from clariedge.chat_format import parse_answer
from clariedge.cli import app
from clariedge.training.infer import read_inputs


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"clarification": "CLEAR"}', "CLEAR"),
        ('{"clarification": "clear"}', "CLEAR"),
        ('Sure! {"clarification": "Do you mean A or B?"} Hope that helps.', "Do you mean A or B?"),
        ('{"other": 1} then {"clarification": "Which plan?"}', "Which plan?"),
        ('{"clarification": "Do you mean the Arizona Cardinals or', "Do you mean the Arizona Cardinals or"),
        ('{"clarification": "CLEAR', "CLEAR"),
        ('{"clarification": "Which \\"plan\\" do you mean?"}', 'Which "plan" do you mean?'),
        ("CLEAR", "CLEAR"),
        ("  `CLEAR`.", "CLEAR"),
        ("Which product do you mean?", "Which product do you mean?"),
        ("", None),
        ("   ", None),
        (None, None),
        ("I cannot help with that", None),
        ('{"clarification": ""}', None),
        ('{"clarification": 42}', None),
        ('{"clarification": "', None),
        ("{{{{", None),
        ('{"clarification": "?!"}', "?!"),  # a complete object is taken as it is
        ('{"clarification": "?!', None),  # a truncated one needs letters
    ],
)
def test_parse_answer(text: str | None, expected: str | None) -> None:
    assert parse_answer(text) == expected


def test_read_inputs_mtrag_tasks_and_project_jsonl(mtrag_dir: Path, sample_dir: Path) -> None:
    rows, rejects = read_inputs([mtrag_dir / "taskb_input.jsonl"])
    assert len(rows) == 10 and not len(rejects)
    assert all("::" in r["id"] and r["messages"][-1].role == "user" for r in rows)
    assert any(r["documents"] for r in rows)
    rows, _ = read_inputs([mtrag_dir / "taskb_input.jsonl"], documents=False)
    assert not any(r["documents"] for r in rows)
    rows, _ = read_inputs([sample_dir / "dialogs.jsonl"])
    assert len(rows) > 20 and len({r["id"] for r in rows}) == len(rows)


def test_read_inputs_reports_bad_lines(tmp_path: Path) -> None:
    f = tmp_path / "in.jsonl"
    good = {
        "conversation_id": "x",
        "task_id": "x::1",
        "turn": 1,
        "input": [{"speaker": "user", "text": "hi there"}],
        "contexts": [],
    }
    f.write_text(json.dumps(good) + "\n{not json\n", encoding="utf-8")
    rows, rejects = read_inputs([f])
    assert [r["id"] for r in rows] == ["x::1"] and rejects.counts() == {"dropped_malformed_json": 1}


def test_predict_in_chunks_keeps_order_shows_progress_and_rows_per_s(capsys: pytest.CaptureFixture[str]) -> None:
    from clariedge.training.infer import predict

    class Stub:  # check_batch's contract without a model: CLEAR for turns that say "clear"
        batch_size = 2
        unparseable = 0
        calls: list[int] = []

        def check_batch(self, items):
            self.calls.append(len(items))
            return [{"clarification": "CLEAR" if "clear" in m[-1]["content"] else "Which one?"} for m, _ in items]

    rows = [
        {"id": f"r{i}", "messages": [{"role": "user", "content": "clear" if i % 3 else "it?"}], "documents": []}
        for i in range(37)
    ]
    stub = Stub()
    preds, stats = predict(stub, rows, progress=True)
    assert [p["id"] for p in preds] == [r["id"] for r in rows]
    assert [p["clarification"] == "CLEAR" for p in preds] == [bool(i % 3) for i in range(37)]
    assert stub.calls == [16, 16, 5]  # chunks of 8 batches
    assert stats["rows"] == 37 and stats["clarify"] == 13 and stats["rows_per_s"] > 0
    assert "37/37" in capsys.readouterr().err  # the progress bar


@pytest.mark.slow
def test_predict_cli_end_to_end(base_model_dir: Path, tmp_path: Path) -> None:
    from clariedge.schema import Example, Message, Provenance
    from clariedge.training.train import train

    def ex(i: int, turn: str, q: str | None) -> Example:
        return Example(
            conversation_id=f"c{i}",
            domain="wiki",
            setting="pre_retrieval",
            category="ambiguous_dialog" if q else "clear",
            messages=[Message(role="user", content=turn)],
            needs_clarification=bool(q),
            clarification=q,
            provenance=Provenance(generator="human", seed_id=f"c{i}::1"),
        )

    rows = [ex(1, "who wrote hamlet", None), ex(2, "how much does it cost?", "Which product do you mean?")]
    small_lora = {"target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"], "top_layers": None}
    cfg = params_section(
        "train",
        lr=2e-3,
        epochs=10,
        max_steps=2,
        batch_size=2,
        max_length=200,
        warmup_ratio=0.0,
        decision_weight=1.0,
        checkpoint_dir=str(tmp_path / "ckpt"),
        lora=params_section("train.lora", r=4, alpha=8, dropout=0.0, **small_lora),
    )
    adapter = tmp_path / "adapter"
    train(rows, base_model_dir, adapter, cfg, seed=1, progress=False)

    tasks = tmp_path / "tasks.jsonl"
    with tasks.open("w", encoding="utf-8") as fh:
        fh.write(
            json.dumps(
                {
                    "conversation_id": "t",
                    "task_id": "t::1",
                    "turn": 1,
                    "input": [{"speaker": "user", "text": "when does this plan renew?"}],
                    "contexts": [],
                }
            )
            + "\n"
        )
        fh.write(
            json.dumps(
                {
                    "conversation_id": "t",
                    "task_id": "t::2",
                    "turn": 2,
                    "input": [{"speaker": "user", "text": "what is the capital of peru"}],
                    "contexts": [{"document_id": "d1", "title": "Peru", "text": "Lima is the capital of Peru."}],
                }
            )
            + "\n"
        )
    out = tmp_path / "preds.jsonl"
    res = CliRunner().invoke(
        app,
        [
            "predict",
            "--adapter",
            str(adapter),
            "--base",
            str(base_model_dir),
            "--input",
            str(tasks),
            "--output",
            str(out),
            "--max-new-tokens",
            "16",
        ],
    )
    assert res.exit_code == 0, res.output
    preds = [json.loads(line) for line in out.read_text().splitlines()]
    assert [p["id"] for p in preds] == ["t::1", "t::2"]
    for p in preds:  # a question, CLEAR, or null with the raw text (counted, never a crash)
        assert isinstance(p["clarification"], str) or (p["clarification"] is None and "raw" in p)
    assert "rows=2" in res.output and "unparseable=" in res.output and "rows/s" in res.output

    bad = CliRunner().invoke(
        app, ["predict", "--adapter", str(adapter), "--input", str(tasks), "--output", str(out), "--precision", "fp16"]
    )
    assert bad.exit_code == 1 and "precision 'fp16'" in bad.output
    assert len(out.read_text().splitlines()) == 2  # the good predictions are still there

    import torch

    from clariedge.training.infer import Clarifier

    items = [([{"role": "user", "content": "how much does it cost?"}], None)]
    c32 = Clarifier(adapter, base=base_model_dir, precision="fp32")
    c16 = Clarifier(adapter, base=base_model_dir, precision="bf16")
    assert c32.model.dtype == torch.float32 and c16.model.dtype == torch.bfloat16
    assert c32.p_clear(items)[0] == pytest.approx(c16.p_clear(items)[0], abs=0.1)  # bf16 rounding, same model
