"""The two-stage trainer on tiny Llama and Qwen3 models built from configs."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from train_helpers import tiny_config, write_samples

from memento_train.data import MementoCollator, packed_rows, tokenized_dataset
from memento_train.losses import completion_ce, restricted_positions, retention_kl
from memento_train.masking import MaskPolicy, attention_mask_for, expiry
from memento_train.train import build_trainer, run_training


def _losses(report):
    return [entry["loss"] for entry in report["log"]]


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_loss_decreases_in_both_stages(tmp_path, arch):
    data = write_samples(tmp_path / "data.jsonl", 24)
    stage1 = run_training(tiny_config(tmp_path, data, 1, arch, training={"max_steps": 20}))
    first, last = _losses(stage1)[:3], _losses(stage1)[-3:]
    assert sum(last) / 3 < 0.8 * sum(first) / 3, _losses(stage1)
    stage2 = run_training(tiny_config(tmp_path, data, 2, arch, init_from=str(tmp_path / "stage1"),
                                      training={"max_steps": 12}))  # fmt: skip
    losses = _losses(stage2)
    assert sum(losses[-3:]) < sum(losses[:3]), losses
    logged = stage2["log"][0]
    assert {"ce", "retention_kl", "masked_fraction", "padding_fraction", "tokens_per_s"} <= set(logged)
    assert 0 < logged["masked_fraction"] < 1
    for name in ("block_masking_config.json", "chat_template.jinja", "README.md", "memento_train.yaml",
                 "tokenizer.json", "config.json"):  # fmt: skip
        assert (tmp_path / "stage2" / name).exists(), name


def _batch(tmp_path, n=6, max_seq_len=1024, packing=True):
    data = write_samples(tmp_path / "data.jsonl", n)
    trainer, _ = build_trainer(tiny_config(tmp_path, data, 2))
    tokenizer = trainer.processing_class
    rows, _ = packed_rows(tokenized_dataset([str(data)], tokenizer), max_seq_len, packing)
    return trainer, rows


def _sum_ce(model, trainer, row_batch, policy):
    ids, labels = row_batch["input_ids"], row_batch["labels"]
    mask = attention_mask_for("sdpa", ids, trainer.tokens, policy, row_batch["document_ids"])
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=row_batch["position_ids"]).logits
    return completion_ce(logits, labels, num_items=1)


@pytest.mark.parametrize(
    "policy", [None, MaskPolicy(), MaskPolicy(keep_last_n_blocks=1, mask_delimiters=True)]
)
def test_packed_loss_equals_per_sample_losses(tmp_path, policy):
    trainer, rows = _batch(tmp_path)
    model = trainer.model.eval()
    collate = MementoCollator(trainer.processing_class.pad_token_id)
    packed_row = max(rows, key=lambda r: len(set(r["document_ids"])))
    assert len(set(packed_row["document_ids"])) >= 2, "the test needs a row with several documents"
    packed = _sum_ce(model, trainer, collate([packed_row]), policy)
    separate = 0.0
    for doc in sorted(set(packed_row["document_ids"])):
        keep = [i for i, d in enumerate(packed_row["document_ids"]) if d == doc]
        single = {k: [v[i] for i in keep] for k, v in packed_row.items()}
        single["document_ids"] = [0] * len(keep)
        separate += _sum_ce(model, trainer, collate([single]), policy)
    # the doc boundary token's label predicts across documents in the packed row: exclude it by construction
    torch.testing.assert_close(packed, separate, rtol=1e-4, atol=1e-3)


def test_stage2_isolation_and_the_memento_stream(tmp_path):
    """With one layer, editing an evicted block changes no stage-2 logit from its <|summary_end|>
    on, and does change stage-1 logits; with two layers stage-2 logits change too, through the
    memento's own KV (the paper's second information stream)."""
    data = write_samples(tmp_path / "data.jsonl", 2, n_blocks=3)
    for layers, expect_isolated in ((1, True), (2, False)):
        config = tiny_config(tmp_path, data, 2, model={"tiny": {"arch": "llama", "num_hidden_layers": layers,
                                                                "hidden_size": 64, "intermediate_size": 128,
                                                                "num_attention_heads": 4, "num_key_value_heads": 2}})  # fmt: skip
        trainer, _ = build_trainer(config)
        tokens, model = trainer.tokens, trainer.model.eval()
        rows, _ = packed_rows(tokenized_dataset([str(data)], trainer.processing_class), 1024, False)
        ids = torch.tensor([rows[0]["input_ids"]])
        first_block = (ids[0] == tokens.block_start).nonzero()[0].item()
        block_end = (ids[0] == tokens.block_end).nonzero()[0].item()
        summary_end = (ids[0] == tokens.summary_end).nonzero()[0].item()
        edited = ids.clone()
        edited[0, first_block + 1 : block_end] = torch.flip(ids[0, first_block + 1 : block_end], [0])
        assert not torch.equal(edited, ids)

        def logits(x, policy, tokens=tokens, model=model, summary_end=summary_end):
            mask = attention_mask_for("sdpa", x, tokens, policy)
            with torch.no_grad():
                return model(input_ids=x, attention_mask=mask).logits[0, summary_end:]

        stage2 = torch.allclose(logits(ids, MaskPolicy()), logits(edited, MaskPolicy()), atol=1e-6)
        stage1 = torch.allclose(logits(ids, None), logits(edited, None), atol=1e-6)
        assert stage2 == expect_isolated and not stage1


def test_retention_kl_is_zero_when_the_mask_is_causal():
    torch.manual_seed(0)
    logits = torch.randn(2, 12, 50)
    labels = torch.randint(0, 50, (2, 12))
    nothing_restricted = torch.zeros(2, 12, dtype=torch.bool)
    kl, count = retention_kl(logits, torch.randn(2, 12, 50), labels, nothing_restricted)
    assert kl.item() == 0 and count == 0
    everything = torch.ones(2, 12, dtype=torch.bool)
    kl, count = retention_kl(logits, logits.clone(), labels, everything)
    assert abs(kl.item()) < 1e-6 and count == 22
    kl, _ = retention_kl(logits, torch.randn(2, 12, 50), labels, everything)
    assert kl.item() > 0
    ids = torch.tensor([[10, 11, 12, 13]])  # no blocks: the memento mask is causal, nothing is restricted
    from trace_gen import TOK

    assert not restricted_positions(expiry(ids, TOK, MaskPolicy()), torch.zeros_like(ids)).any()


def test_frozen_teacher_and_zero_weight(tmp_path):
    data = write_samples(tmp_path / "data.jsonl", 8)
    frozen = run_training(tiny_config(tmp_path, data, 2, retention={"teacher": "frozen", "weight": 1.0},
                                      training={"max_steps": 3}))  # fmt: skip
    assert all(entry["retention_kl"] >= 0 for entry in frozen["log"])
    plain = run_training(tiny_config(tmp_path, data, 2, retention={"weight": 0.0}, training={"max_steps": 3}))
    assert all("retention_kl" not in entry and entry["loss"] == pytest.approx(entry["ce"], rel=1e-4)
               for entry in plain["log"])  # fmt: skip


RESUME_SCRIPT = textwrap.dedent("""
    import os, signal, sys, json
    sys.path.insert(0, {tests!r})
    from pathlib import Path
    from transformers import TrainerCallback
    from train_helpers import tiny_config
    from memento_train.train import build_trainer

    class KillAfterSave(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            if state.global_step == {k}:
                os.kill(os.getpid(), signal.SIGKILL)

    tmp = Path({tmp!r})
    training = {{"max_steps": {steps}, "save_strategy": "steps", "save_steps": {k}}}
    config = tiny_config(tmp / "{name}", Path({data!r}), 1, training=training, resume_from_checkpoint={resume!r})
    trainer, _ = build_trainer(config)
    if {kill}:
        trainer.add_callback(KillAfterSave())
    trainer.train(resume_from_checkpoint=True if {resume!r} == "latest" else None)
    print(json.dumps([e["loss"] for e in trainer.state.log_history if "loss" in e]))
""")


def _run(tmp_path, data, name, kill, resume, steps=8, k=4):
    script = RESUME_SCRIPT.format(tests=os.path.dirname(__file__), tmp=str(tmp_path), data=str(data), name=name,
                                  kill=kill, resume=resume, steps=steps, k=k)  # fmt: skip
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)


def test_resume_after_kill_reproduces_the_loss_log(tmp_path):
    data = write_samples(tmp_path / "data.jsonl", 16)
    reference = _run(tmp_path, data, "ref", kill=False, resume=None)
    assert reference.returncode == 0, reference.stderr[-2000:]
    killed = _run(tmp_path, data, "run", kill=True, resume=None)
    assert killed.returncode == -9, "the first run must die right after its checkpoint"
    resumed = _run(tmp_path, data, "run", kill=False, resume="latest")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    ref_log = json.loads(reference.stdout.strip().splitlines()[-1])
    state = json.loads((tmp_path / "run" / "stage1" / "checkpoint-8" / "trainer_state.json").read_text())
    resumed_log = [e["loss"] for e in state["log_history"] if "loss" in e]
    assert len(ref_log) == 8 and resumed_log == pytest.approx(ref_log, rel=1e-5)


def test_lora_saves_adapter_and_tag_rows_and_reloads(tmp_path):
    from memento_train.modeling import merge_adapter

    data = write_samples(tmp_path / "data.jsonl", 8)
    config = tiny_config(tmp_path, data, 2, lora={"enabled": True, "r": 4, "alpha": 8},
                         training={"max_steps": 3, "learning_rate": 1e-2})  # fmt: skip
    trainer, _ = build_trainer(config)
    trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert any("lora_" in n for n in trainable) and any(
        "token_adapter" in n or "trainable_tokens" in n for n in trainable
    ), trainable
    run_training(config)
    out = tmp_path / "stage2"
    assert (out / "adapter_config.json").exists() and (out / "adapter_model.safetensors").exists()
    merged = merge_adapter(out, tmp_path / "merged")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "merged")
    ids = torch.tensor([tokenizer.encode("<|block_start|> a = 3 <|block_end|>", add_special_tokens=False)])
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).logits, reloaded(input_ids=ids).logits)
    base = AutoModelForCausalLM.from_pretrained(out / "base")
    tag = tokenizer.convert_tokens_to_ids("<|block_start|>")
    trained_row = reloaded.get_input_embeddings().weight[tag]
    assert not torch.allclose(trained_row, base.get_input_embeddings().weight[tag]), (
        "the tag rows were trained"
    )
    other = tokenizer.encode(" a", add_special_tokens=False)[0]
    torch.testing.assert_close(
        reloaded.get_input_embeddings().weight[other], base.get_input_embeddings().weight[other]
    )
