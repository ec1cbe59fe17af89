"""Training: config and variants, row selection, batching, encoding with length caps, the shared-prefix
loss (checked against a plain forward), and a real few-step LoRA run that lowers the loss, resumes from
its checkpoint and saves an adapter that answers contract JSON."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from conftest import params_section

from clariedge.schema import Document, Example, Message, Provenance
from clariedge.training.train import (
    LoraSettings,
    TrainConfig,
    VariantSettings,
    length_grouped_batches,
    select_rows,
)

# The few-step training test's loss bound was set with adapters on every layer's attention only and an
# unweighted first answer token (the code's former defaults); it keeps them instead of params.yaml's.
SMALL_LORA = {"target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"], "top_layers": None}


def train_cfg(**overrides) -> TrainConfig:
    return params_section("train", **overrides)


def lora_cfg(**overrides) -> LoraSettings:
    return params_section("train.lora", **overrides)


def _ex(
    i: int,
    category: str,
    turn: str,
    question: str | None = None,
    docs: list[Document] | None = None,
    history: list[Message] | None = None,
) -> Example:
    return Example(
        conversation_id=f"c{i}",
        domain="wiki",
        setting="post_retrieval" if docs else "pre_retrieval",
        category=category,
        messages=[*(history or []), Message(role="user", content=turn)],
        documents=docs or [],
        needs_clarification=category in ("ambiguous_dialog", "ambiguous_documents"),
        clarification=question,
        provenance=Provenance(generator="human", seed_id=f"c{i}::1"),
    )


TOY = [
    _ex(1, "clear", "how far is mercury from the sun"),
    _ex(2, "ambiguous_dialog", "how much does it cost?", "Which product do you mean?"),
    _ex(3, "clear", "who wrote hamlet"),
    _ex(4, "ambiguous_dialog", "when does this plan renew?", "Which plan do you mean?"),
]


@pytest.fixture(scope="module")
def tok(base_model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(base_model_dir)


# ---- pure parts ------------------------------------------------------------------------------------
def test_variant_overrides_and_unknown_names() -> None:
    cfg = train_cfg(variants={"default": VariantSettings(), "nohn": VariantSettings(drop_categories=["hard_negative"])})
    assert cfg.for_variant("default").drop_categories == []
    assert cfg.for_variant("nohn").drop_categories == ["hard_negative"]
    with pytest.raises(ValueError, match="no variant 'x'"):
        cfg.for_variant("x")
    bad = train_cfg(variants={"v": VariantSettings(drop_categories=["hard_negatives"])})
    with pytest.raises(ValueError, match="unknown categories"):
        bad.for_variant("v")


def test_select_rows_drops_categories_and_caps() -> None:
    rows = TOY + [_ex(10 + i, "hard_negative", f"does it support json {i}?") for i in range(4)]
    kept, stats = select_rows(rows, train_cfg(drop_categories=["hard_negative"]), random.Random(0))
    assert {r.category for r in kept} == {"clear", "ambiguous_dialog"} and stats["dropped_categories"] == 4
    kept, stats = select_rows(rows, train_cfg(max_rows=4), random.Random(0))
    assert len(kept) == 4 and stats["dropped_max_rows"] == 4
    assert {r.category for r in kept} == {"clear", "ambiguous_dialog", "hard_negative"}


def test_length_grouped_batches_cover_every_row_once_and_repeat() -> None:
    lengths = [random.Random(i).randint(5, 300) for i in range(50)]
    a = length_grouped_batches(lengths, 8, seed=1, epoch=0)
    assert sorted(i for b in a for i in b) == list(range(50))
    assert a == length_grouped_batches(lengths, 8, seed=1, epoch=0)
    assert a != length_grouped_batches(lengths, 8, seed=1, epoch=1)


# ---- encoding ----------------------------------------------------------------------------------------
def test_encode_example_labels_only_the_answer(tok) -> None:
    from clariedge.training.data import ANSWER_PREFIX, encode_example

    enc = encode_example(tok, TOY[1], max_length=384)
    answer = [t for t in enc.labels if t != -100]
    assert tok.decode(answer, skip_special_tokens=True) == 'Which product do you mean?"}'
    assert answer[-1] == tok.eos_token_id
    prompt = tok.decode(enc.input_ids[: len(enc.input_ids) - len(answer)])
    assert prompt.endswith("assistant\n" + ANSWER_PREFIX) and "how much does it cost?" in prompt


def test_length_cap_shortens_documents_first_and_keeps_the_last_turn(tok) -> None:
    from clariedge.training.data import encode_example

    long_docs = [Document(doc_id=f"d{i}", title=f"Doc {i}", text=("word " * 600).strip()) for i in range(3)]
    history = [
        Message(role="user", content="earlier question " * 20),
        Message(role="assistant", content="answer " * 40),
    ]
    ex = _ex(5, "clear", "and what about the second one?", docs=long_docs, history=history)
    enc = encode_example(tok, ex, max_length=300)
    assert len(enc.input_ids) <= 300
    assert enc.info.truncated_docs
    text = tok.decode(enc.input_ids)
    assert "and what about the second one?" in text and "Doc 2" in text
    # tighter still: documents cannot shrink further, so older messages go; the last turn stays
    enc = encode_example(tok, ex, max_length=240)
    assert len(enc.input_ids) <= 240 and "and what about the second one?" in tok.decode(enc.input_ids)


def test_length_cap_shortens_long_answers_before_dropping_turns(tok) -> None:
    """The referent named in the first turn survives: the long assistant answers are cut, not the dialog's start."""
    from clariedge.training.data import encode_example

    history = [
        Message(role="user", content="Tell me about the Hubble Space Telescope."),
        Message(role="assistant", content="It is a telescope in low Earth orbit. " + "More detail follows. " * 80),
        Message(role="user", content="When was it launched?"),
        Message(role="assistant", content="It was launched in 1990. " + "Further detail follows. " * 80),
    ]
    ex = _ex(9, "hard_negative", "and how big is its mirror?", history=history)
    enc = encode_example(tok, ex, max_length=256)
    text = tok.decode(enc.input_ids)
    assert enc.info.shortened_messages and enc.info.dropped_messages == 0 and not enc.info.cut_middle
    assert "Hubble Space Telescope" in text and "It was launched in 1990." in text and "how big is its mirror?" in text
    assert len(enc.input_ids) <= 256


def test_prompt_budget_does_not_depend_on_the_answer(tok) -> None:
    """A CLEAR row and a question row with the same dialog get the same prompt (no length cue to the label)."""
    from clariedge.training.data import encode_example, prompt_budget

    docs = [Document(doc_id=f"d{i}", title=f"Doc {i}", text=("word " * 300).strip()) for i in range(3)]
    turn = "and what about the second one?"
    clear = _ex(6, "hard_negative", turn, docs=docs)
    ask = _ex(7, "ambiguous_dialog", turn, "Do you mean the second document or the second plan in the first one?", docs)
    a, b = encode_example(tok, clear, max_length=256), encode_example(tok, ask, max_length=256)
    prompt = [len([t for t in e.labels if t == -100]) for e in (a, b)]
    assert prompt[0] == prompt[1] <= prompt_budget(256)
    assert a.input_ids[: prompt[0]] == b.input_ids[: prompt[1]]


def test_middle_cut_keeps_the_whole_instruction(tok) -> None:
    from clariedge.chat_format import SYSTEM_PROMPT
    from clariedge.training.data import encode_example

    ex = _ex(8, "clear", "tell me about " + "the long winding history of the river " * 60 + "in one line")
    enc = encode_example(tok, ex, max_length=192)
    assert enc.info.cut_middle and len(enc.input_ids) <= 192
    text = tok.decode(enc.input_ids)
    assert SYSTEM_PROMPT in text and text.rstrip().endswith('"}<|im_end|>') and "in one line" in text


def test_lora_layer_choice() -> None:
    from clariedge.config import ConfigError

    assert lora_cfg(top_layers=None).layers(30) is None
    assert lora_cfg(top_layers=10).layers(30) == list(range(20, 30))
    assert lora_cfg(top_layers=40).layers(30) is None
    assert lora_cfg(top_layers=None, layers_to_transform=[0, 5]).layers(30) == [0, 5]
    with pytest.raises(ValueError, match="out of range"):
        lora_cfg(top_layers=None, layers_to_transform=[31]).layers(30)
    with pytest.raises(ConfigError, match="not both"):
        lora_cfg(top_layers=2, layers_to_transform=[1])


@pytest.mark.slow
def test_shared_prefix_loss_equals_plain_forward(base_model_dir: Path, tok) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from clariedge.training.data import answer_loss, collate, encode_example

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(base_model_dir, dtype=torch.float32)
    model = get_peft_model(
        model,
        LoraConfig(
            r=4,
            lora_alpha=8,
            lora_dropout=0.0,
            target_modules=["q_proj", "v_proj"],
            task_type="CAUSAL_LM",
            init_lora_weights=False,
        ),
    )
    enc = [encode_example(tok, e, max_length=256) for e in TOY[:3]]
    batch = collate(enc, tok.pad_token_id)
    # the system instruction (chat template + SYSTEM_PROMPT) is computed once for the batch
    from clariedge.chat_format import SYSTEM_PROMPT

    system_ids = tok.apply_chat_template([{"role": "system", "content": SYSTEM_PROMPT}], tokenize=False)
    assert batch["prefix_ids"].shape[1] >= len(tok(system_ids, add_special_tokens=False)["input_ids"]) - 2
    loss = answer_loss(model, batch)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad()
    # reference: right-padded full sequences, the model's own label-shifted loss
    width = max(len(e.input_ids) for e in enc)
    ids = torch.full((3, width), tok.pad_token_id)
    mask = torch.zeros((3, width), dtype=torch.long)
    labels = torch.full((3, width), -100)
    for i, e in enumerate(enc):
        n = len(e.input_ids)
        ids[i, :n], mask[i, :n], labels[i, :n] = torch.tensor(e.input_ids), 1, torch.tensor(e.labels)
    ref = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    ref.backward()
    assert loss.item() == pytest.approx(ref.item(), rel=1e-4)
    for n, p in model.named_parameters():
        if p.requires_grad:
            err = (p.grad - grads[n]).norm() / p.grad.norm()
            assert err < 1e-3, (n, err.item())


@pytest.mark.slow
def test_frozen_bottom_cache_equals_plain_forward(base_model_dir: Path, tok) -> None:
    """The cached bottom layers + hand-run top layers give the plain forward's loss and LoRA gradients."""
    import contextlib

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from clariedge.training.data import answer_ce, answer_loss, encode_example
    from clariedge.training.frozen import FrozenBottom, collate_rows

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(base_model_dir, dtype=torch.float32)
    start = model.config.num_hidden_layers - 6
    model = get_peft_model(
        model,
        LoraConfig(
            r=4,
            lora_alpha=8,
            lora_dropout=0.0,
            target_modules=["q_proj", "v_proj", "down_proj"],
            layers_to_transform=list(range(start, model.config.num_hidden_layers)),
            task_type="CAUSAL_LM",
            init_lora_weights=False,
        ),
    )
    enc = [encode_example(tok, e, max_length=256) for e in TOY]
    bottom = FrozenBottom(model, start)
    # filled in batches of 2 (other prefix splits and paddings than the training batch below)
    bottom.fill(enc, tok.pad_token_id, 2, autocast=contextlib.nullcontext, progress=False)
    assert [s.shape[0] for s in bottom.states] == [len(e.input_ids) for e in enc]
    assert all(not s.requires_grad for s in bottom.states)
    batch = collate_rows(enc, tok.pad_token_id, decision_weight=3.0)([3, 0, 2])
    assert batch["rows"].tolist() == [3, 0, 2] and batch["prefix_ids"].shape[1] > 0

    def loss_and_grads(loss_fn):
        model.zero_grad()
        loss = loss_fn()
        loss.backward()
        return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}

    ref, ref_grads = loss_and_grads(lambda: answer_loss(model, batch))
    got, grads = loss_and_grads(lambda: answer_ce(bottom.tail_logits(batch), batch))
    assert got == pytest.approx(ref, rel=1e-4)
    assert ref_grads and set(grads) == set(ref_grads)
    for n, g in ref_grads.items():
        assert g.norm() > 0, n
        assert ((grads[n] - g).norm() / g.norm()).item() < 1e-3, n
    # a wrong cut (states of layer `start` fed to fewer layers) changes the loss: the check in train has teeth
    bottom.start = start + 2
    assert answer_ce(bottom.tail_logits(batch), batch).item() != pytest.approx(ref, rel=1e-3)


@pytest.mark.slow
def test_few_steps_lower_the_loss_resume_and_reload(base_model_dir: Path, tmp_path: Path) -> None:
    from clariedge.chat_format import parse_answer
    from clariedge.training.infer import Clarifier
    from clariedge.training.train import train

    cfg = train_cfg(
        lr=2e-3,
        epochs=50,
        max_steps=6,
        batch_size=4,
        max_length=200,
        save_every=100,
        warmup_ratio=0.0,
        checkpoint_dir=str(tmp_path / "ckpt"),
        decision_weight=1.0,
        lora=lora_cfg(r=8, alpha=16, dropout=0.0, **SMALL_LORA),
    )
    out = tmp_path / "adapter"
    first = train(TOY, base_model_dir, out, cfg, seed=3, progress=False, stop_after=3)
    assert first["interrupted"] and first["steps"] == 3
    assert (tmp_path / "ckpt" / "default" / "state.pt").exists() and not out.exists()
    m = train(TOY, base_model_dir, out, cfg, seed=3, progress=False)  # resumes at step 3
    assert m["steps"] == 6 and len(m["loss_curve"]) == 6
    assert m["loss_curve"][:3] == first["loss_curve"]
    losses = [c["loss"] for c in m["loss_curve"]]
    assert losses[-1] < losses[0] * 0.7, losses
    assert not (tmp_path / "ckpt" / "default").exists()  # removed after a finished run
    assert m["tokens_per_s"] > 0 and m["peak_ram_mb"] > 100
    meta = json.loads((out / "clariedge_adapter.json").read_text())
    assert meta["max_length"] == 200 and (out / "adapter_config.json").exists()
    # the same training gives the same bytes: no set order, no load-time setting in the saved configs
    modules = json.loads((out / "adapter_config.json").read_text())["target_modules"]
    assert modules == sorted(modules) and len(modules) >= 2
    assert "local_files_only" not in json.loads((out / "tokenizer_config.json").read_text())

    from clariedge.io import write_records
    from clariedge.training.calibrate import calibrate

    write_records(tmp_path / "val.parquet", TOY)
    cal = calibrate(out, base_model_dir, tmp_path / "val.parquet", None, seed=0, precision="fp32", metric="accuracy")
    assert cal["rows"] == 4 and 0.0 <= cal["validation_accuracy"] <= 1.0
    assert cal["validation_accuracy"] >= cal["validation_accuracy_at_0.5"]
    assert json.loads((out / "clariedge_adapter.json").read_text())["decision_threshold"] == cal["threshold"]

    # calibrated on real, unlabelled turns instead: the threshold asks on the given share of them
    from clariedge import ingest

    turns_dir = Path(__file__).resolve().parents[1] / "data" / "sample"
    real = calibrate(
        out, base_model_dir, tmp_path / "val.parquet", None, seed=0, precision="fp32", metric="accuracy",
        turns=turns_dir, ask_share=0.25,
    )  # fmt: skip
    assert real["validation_threshold"] == cal["threshold"] and real["real_turns"]["turns"] > 20
    assert real["threshold"] == real["real_turns"]["threshold"]
    seeds, _, _ = ingest.transform([turns_dir])
    items = [(s.messages, s.documents or None) for s in seeds if any(m.role == "assistant" for m in s.messages[:-1])]
    asks = [p < real["threshold"] for p in Clarifier(out).p_clear(items)]
    assert abs(sum(asks) / len(asks) - 0.25) <= 0.05, sum(asks) / len(asks)
    cal = calibrate(out, base_model_dir, tmp_path / "val.parquet", None, seed=0, precision="fp32", metric="accuracy")

    clar = Clarifier(out, max_new_tokens=24)
    assert clar.threshold == cal["threshold"]
    decisions = clar.decide([(e.messages, None) for e in TOY])
    assert all(0.0 <= p <= 1.0 and needs == (p < clar.threshold) for p, needs in decisions)
    answer = clar.check([{"role": "user", "content": "how much does it cost?"}])
    assert set(answer) <= {"clarification", "raw"}
    raw = clar.generate([([{"role": "user", "content": "who wrote hamlet"}], None)])[0]
    value = parse_answer(raw)
    assert value is not None, raw  # valid contract JSON after a few steps on this format
    assert json.loads(json.dumps({"clarification": value}))["clarification"] == value


def test_precision_auto_follows_native_bf16() -> None:
    from clariedge.training.infer import native_bf16, use_bf16_for

    assert use_bf16_for("auto", native=True) is True
    assert use_bf16_for("auto", native=False) is False
    assert use_bf16_for("bf16", native=False) is True  # forced, even where it is emulated
    assert use_bf16_for("fp32", native=True) is False
    assert use_bf16_for("auto") is native_bf16()


def test_checkpoint_fingerprint_holds_the_resolved_precision() -> None:
    from clariedge.training.train import _fingerprint

    rows, base = TOY, Path("models/base")
    auto = train_cfg(precision="auto")
    # `auto` resolved to bf16 on one machine and to fp32 on another: no resume across them
    assert _fingerprint(auto, rows, base, use_bf16=True) != _fingerprint(auto, rows, base, use_bf16=False)
    # the same resolved precision however it was asked for
    assert _fingerprint(auto, rows, base, True) == _fingerprint(train_cfg(precision="bf16"), rows, base, True)
    assert _fingerprint(auto, rows, base, True) != _fingerprint(train_cfg(lr=5e-4), rows, base, True)
