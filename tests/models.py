"""Tiny random Llama and Qwen3 models built from configs (no hub), for backend parity tests."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

ARCHS = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM)}


def tiny_model(
    arch: str, attn_implementation: str = "sdpa", vocab_size: int = 64, seed: int = 0, layers: int = 2
):
    config_cls, model_cls = ARCHS[arch]
    config = config_cls(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
    )
    config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    return model_cls(config).eval()


def positions(document_ids: torch.Tensor) -> torch.Tensor:
    """RoPE positions restarting at 0 in every packed document."""
    out = torch.zeros_like(document_ids)
    for b in range(document_ids.shape[0]):
        row = document_ids[b]
        start = 0
        for i in range(1, len(row) + 1):
            if i == len(row) or row[i] != row[i - 1]:
                out[b, start:i] = torch.arange(i - start)
                start = i
    return out
