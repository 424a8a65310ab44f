"""Loading the model and tokenizer, the attention backend, LoRA with trainable tag rows, merging."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from .config import ConfigError, LoraSection, ModelConfig
from .format import MementoTokens
from .tokens import add_memento_tokens

TINY_ARCHS = ("llama", "qwen3")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_attention(requested: str) -> str:
    """`auto` → FlexAttention (block-sparse BlockMask) on CUDA, SDPA with the dense bool mask on CPU.

    FlexAttention has no CPU backward (design.md §3), so it is refused for CPU training."""
    if requested == "auto":
        return "flex_attention" if torch.cuda.is_available() else "sdpa"
    if requested == "flex_attention" and not torch.cuda.is_available():
        raise ConfigError("flex_attention cannot train on CPU (no backward there); use sdpa or auto")
    return requested


def build_tiny_model(spec: dict[str, Any], vocab_size: int, attn: str):
    """A small model from a config (tests, the CPU quickstart): {arch: llama|qwen3, ...config fields}."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    spec = dict(spec)
    arch = spec.pop("arch", "llama")
    if arch not in TINY_ARCHS:
        raise ConfigError(f"model.tiny.arch must be one of {', '.join(TINY_ARCHS)}, got {arch!r}")
    config_cls, model_cls = (
        (LlamaConfig, LlamaForCausalLM) if arch == "llama" else (Qwen3Config, Qwen3ForCausalLM)
    )
    defaults = {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": False,
    }
    config = config_cls(**{**defaults, **spec, "vocab_size": vocab_size})
    config._attn_implementation = attn
    return model_cls(config)


def load_tokenizer(
    cfg: ModelConfig, source: str | None = None, corpus: list[str] | None = None, vocab: int = 2048
):
    from transformers import AutoTokenizer

    path = source or cfg.name_or_path
    if path is None:
        from .toy_tokenizer import build_tokenizer

        if not corpus:
            raise ConfigError("a tiny model needs training data to build its tokenizer from")
        return build_tokenizer(corpus, vocab_size=vocab)
    kwargs: dict[str, Any] = {"trust_remote_code": cfg.trust_remote_code}
    if cfg.gguf_file and source is None:
        kwargs["gguf_file"] = cfg.gguf_file
    tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(cfg: ModelConfig, tokenizer: Any, source: str | None = None):
    """The model with the tags added (mean-init) and the resolved attention backend."""
    from transformers import AutoModelForCausalLM

    attn = resolve_attention(cfg.attn_implementation)
    path = source or cfg.name_or_path
    if path is None:
        model = build_tiny_model(cfg.tiny or {}, len(tokenizer), attn)
    elif (Path(path) / "adapter_config.json").exists():
        model = merge_adapter(path, attn=attn)
    else:
        kwargs: dict[str, Any] = {"trust_remote_code": cfg.trust_remote_code, "attn_implementation": attn}
        if cfg.gguf_file and source is None:
            kwargs["gguf_file"] = cfg.gguf_file
        if cfg.dtype != "auto":
            kwargs["dtype"] = DTYPES[cfg.dtype]
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
        if "gguf_file" in kwargs:
            _forget_gguf_quantization(model)
    add_memento_tokens(tokenizer, model)
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    return model


def _forget_gguf_quantization(model: Any) -> None:
    """transformers dequantizes GGUF weights on load but keeps the model marked quantized, which
    blocks training and saving; the weights are plain tensors, so drop the marks."""
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    for obj in (model, model.config):
        for attr in ("is_quantized", "quantization_method", "quantization_config"):
            if attr in vars(obj):
                delattr(obj, attr)


def load_model_and_tokenizer(
    cfg: ModelConfig, init_from: str | None = None, corpus: list[str] | None = None, vocab: int = 2048
):
    tokenizer = load_tokenizer(cfg, init_from, corpus, vocab)
    tokens = add_memento_tokens(tokenizer)
    model = load_model(cfg, tokenizer, init_from)
    return model, tokenizer, tokens


def tag_ids(tokens: MementoTokens) -> list[int]:
    return [i for i in (*tokens.memento_ids, tokens.think_start, tokens.think_end) if i is not None]


def apply_lora(model: Any, cfg: LoraSection, tokens: MementoTokens):
    """LoRA on the attention/MLP projections, plus the tag rows of the embedding and (untied) head
    trainable through peft's trainable tokens, so the new tokens learn without full embeddings."""
    from peft import LoraConfig, get_peft_model

    ids = tag_ids(tokens)
    emb = model.get_input_embeddings()
    head = model.get_output_embeddings()
    names = {module: name for name, module in model.named_modules()}
    trainable = {names[emb].split(".")[-1]: ids}
    if head is not None and head.weight.data_ptr() != emb.weight.data_ptr():
        trainable[names[head].split(".")[-1]] = ids
    present = {name.split(".")[-1] for name, _ in model.named_modules()}
    targets = [t for t in cfg.target_modules if t in present]
    if not targets:
        raise ConfigError(f"lora.target_modules {cfg.target_modules} match no module of this model")
    config = LoraConfig(
        r=cfg.r,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=targets,
        trainable_token_indices=trainable,
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def merge_adapter(adapter_dir: str | Path, output_dir: str | Path | None = None, attn: str = "sdpa"):
    """Base model + adapter (and trained tag rows) → one plain model; saved with the tokenizer if
    `output_dir` is given."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    adapter_dir = Path(adapter_dir)
    base_path = json.loads((adapter_dir / "adapter_config.json").read_text())["base_model_name_or_path"]
    kwargs: dict[str, Any] = {"attn_implementation": attn}
    meta_path = adapter_dir / "memento_base.json"
    if meta_path.exists():  # written by memento-train: the base (a local dir next to it, or a GGUF file)
        meta = json.loads(meta_path.read_text())
        base_path = str(adapter_dir / meta["base"]) if (adapter_dir / meta["base"]).is_dir() else meta["base"]
        if meta.get("gguf_file"):
            kwargs["gguf_file"] = meta["gguf_file"]
    tokenizer = AutoTokenizer.from_pretrained(adapter_dir)
    base = AutoModelForCausalLM.from_pretrained(base_path, **kwargs)
    if "gguf_file" in kwargs:
        _forget_gguf_quantization(base)
    add_memento_tokens(tokenizer, base)
    merged = PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()
    if output_dir is not None:
        merged.save_pretrained(output_dir)
        tokenizer.save_pretrained(output_dir)
        for extra in ("block_masking_config.json", "chat_template.jinja", "memento_train.yaml"):
            if (adapter_dir / extra).exists():
                (Path(output_dir) / extra).write_text((adapter_dir / extra).read_text())
    return merged
