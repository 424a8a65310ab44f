"""Serving files next to the weights (the official Memento vLLM overlay's block-masking config and
chat template), a generated model card, and pushing to the Hub with the token from HF_TOKEN only."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

from .config import TrainConfig, to_dict
from .format import BLOCK_END, BLOCK_START, SUMMARY_END, SUMMARY_START
from .tokens import chat_template_of


def block_masking_config(cfg: TrainConfig) -> dict[str, Any]:
    """The overlay's BlockMaskingConfig fields for the policy this checkpoint was trained with."""
    mask = cfg.mask
    if mask.answer_sees_last_block and mask.keep_last_n_blocks != 0:
        raise ValueError(
            "the vLLM overlay's keep_last_block_for_answer only exists with keep_last_n_blocks=0"
        )
    return {
        "enable": cfg.stage == 2,
        "keep_last_n_blocks": mask.keep_last_n_blocks,
        "mask_delimiters": mask.mask_delimiters,
        "keep_last_block_for_answer": mask.answer_sees_last_block,
        "compact_on_summary_end": True,
        "require_assistant_section": True,
        "block_start_token": BLOCK_START,
        "block_end_token": BLOCK_END,
        "summary_start_token": SUMMARY_START,
        "summary_end_token": SUMMARY_END,
    }


def write_serving_files(out: str | Path, tokenizer: Any, cfg: TrainConfig) -> None:
    out = Path(out)
    (out / "block_masking_config.json").write_text(json.dumps(block_masking_config(cfg), indent=2))
    (out / "chat_template.jinja").write_text(chat_template_of(tokenizer))
    (out / "README.md").write_text(model_card(out, cfg))


def model_card(out: Path, cfg: TrainConfig) -> str:
    report_path = out / "memento_train_report.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    losses = [e["loss"] for e in report.get("log", [])]
    base = (
        cfg.model.name_or_path
        or f"tiny {cfg.model.tiny.get('arch', 'llama') if cfg.model.tiny else ''} from config"
    )
    lines = [
        "---",
        "library_name: transformers",
        "tags: [memento, memento-train, reasoning, kv-cache-eviction]",
        "---",
        f"# Memento checkpoint (stage {cfg.stage})",
        "",
        "Trained with memento-train: the model reasons in blocks, closes "
        "each with a memento, and is trained to continue with finished blocks evicted from attention.",
        "",
        f"- Base model: `{base}`" + (f" (initialized from `{cfg.init_from}`)" if cfg.init_from else ""),
        f"- Data: {', '.join(f'`{f}`' for f in cfg.data.train_files)}",
        f"- Stage: {cfg.stage} ({'memento mask + retention' if cfg.stage == 2 else 'causal format learning'})",
        f"- Mask policy: keep_last_n_blocks={cfg.mask.keep_last_n_blocks}, mask_delimiters={cfg.mask.mask_delimiters}, "
        f"answer_sees_last_block={cfg.mask.answer_sees_last_block}",
        f"- Retention: weight={cfg.retention.weight}, teacher={cfg.retention.teacher}, "
        f"temperature={cfg.retention.temperature}",
        f"- LoRA: {'r=' + str(cfg.lora.r) if cfg.lora.enabled else 'no'}",
    ]
    if losses:
        lines.append(
            f"- Measured: training loss {losses[0]:.4f} → {losses[-1]:.4f} over {len(losses)} logged steps"
        )
    lines += [
        "",
        "## Serving",
        "`block_masking_config.json` and `chat_template.jinja` next to the weights are what the official Memento vLLM "
        "overlay reads: pass the first as `--block-masking-config` and the second as `--chat-template`, with prefix "
        "caching disabled and `skip_special_tokens: false`.",
        "",
        "## Training configuration",
        "```yaml",
        yaml.safe_dump({k: v for k, v in to_dict(cfg).items() if k != "hub"}, sort_keys=False).strip(),
        "```",
    ]
    return "\n".join(lines) + "\n"


def push(checkpoint: str | Path, repo_id: str, private: bool = True, token_env: str = "HF_TOKEN") -> str:
    """Upload a checkpoint folder; the token comes from the environment and is never logged or written."""
    from huggingface_hub import HfApi

    token = os.environ.get(token_env)
    if not token:
        raise RuntimeError(f"set {token_env} to a Hugging Face token with write access to push {repo_id}")
    checkpoint = Path(checkpoint)
    if not (checkpoint / "config.json").exists() and not (checkpoint / "adapter_config.json").exists():
        raise FileNotFoundError(f"{checkpoint} holds no model (config.json or adapter_config.json)")
    if not (checkpoint / "block_masking_config.json").exists():
        raise FileNotFoundError(
            f"{checkpoint} has no block_masking_config.json: train it with memento-train, or "
            "write one with memento_train.hub.write_serving_files"
        )
    api = HfApi(token=token)
    api.create_repo(repo_id, private=private, exist_ok=True)
    info = api.upload_folder(
        folder_path=str(checkpoint), repo_id=repo_id, ignore_patterns=["checkpoint-*/**"]
    )
    return str(info)
