"""Boundary scores from a local model's attention: where consecutive sentences look back at the
trace differently, a step of reasoning has likely ended.

For sentence s, its attention distribution is the attention mass its tokens put on each earlier
sentence (mean over heads and the chosen layers, renormalized). The boundary between sentences
i and i+1 scores by KL(P_{i+1} ‖ P_i) over the sentences before i: above `threshold` (default
0.35) it is a boundary; min/max block lengths are the segmenter's job.
"""

from __future__ import annotations

from typing import Any

import torch

from .scorers import kl_divergence, kl_to_score
from .sentences import Sentence


class AttentionScorer:
    name = "attention"

    def __init__(
        self,
        model: Any = None,
        tokenizer: Any = None,
        threshold: float = 0.35,
        layers: int = 4,
        max_tokens: int = 4096,
        gguf_file: str | None = None,
    ):
        if model is None:
            raise ValueError("the attention scorer needs a local model (--attention-model NAME_OR_DIR)")
        if isinstance(model, str):
            from transformers import AutoModelForCausalLM, AutoTokenizer

            kwargs = {"gguf_file": gguf_file} if gguf_file else {}
            tokenizer = tokenizer or AutoTokenizer.from_pretrained(model, **kwargs)
            model = AutoModelForCausalLM.from_pretrained(model, attn_implementation="eager", **kwargs)
        if tokenizer is None:
            raise ValueError("a model object needs its tokenizer")
        model.config._attn_implementation = "eager"  # the only backend that returns attention weights
        self.model, self.tokenizer = model.eval(), tokenizer
        self.threshold, self.layers, self.max_tokens = threshold, layers, max_tokens

    def _sentence_attention(self, texts: list[str]) -> torch.Tensor:
        """[n, n] attention mass from sentence row to earlier sentence column (row-normalized)."""
        pieces = [self.tokenizer(t + " ", add_special_tokens=False)["input_ids"] for t in texts]
        owner = torch.tensor([i for i, p in enumerate(pieces) for _ in p])
        ids = torch.tensor([t for p in pieces for t in p])[None]
        with torch.no_grad():
            out = self.model(input_ids=ids, output_attentions=True)
        attn = torch.stack(out.attentions[-self.layers :]).mean(dim=(0, 2))[0]  # [T, T]
        n = len(texts)
        onehot = torch.nn.functional.one_hot(owner, n).to(attn.dtype)  # [T, n]
        mass = onehot.T @ attn @ onehot  # [n, n]: from sentence to sentence
        mass = torch.tril(mass, diagonal=-1)
        return mass / mass.sum(-1, keepdim=True).clamp_min(1e-12)

    def __call__(self, text: str, sentences: list[Sentence]) -> list[int]:
        texts = [s.text(text) for s in sentences]
        scores = [0] * max(0, len(texts) - 1)
        start = 0
        while start < len(texts) - 1:  # windows that fit the model; boundaries near a window start score 0
            end, used = start, 0
            while end < len(texts) and (used < self.max_tokens or end == start):
                used += len(self.tokenizer(texts[end], add_special_tokens=False)["input_ids"]) + 1
                end += 1
            dist = self._sentence_attention(texts[start:end])
            for i in range(1, end - start - 1):  # boundary after local sentence i
                p, q = dist[i + 1, :i], dist[i, :i]
                p, q = p / p.sum().clamp_min(1e-12), q / q.sum().clamp_min(1e-12)
                kl = kl_divergence(p.tolist(), q.tolist())
                scores[start + i] = kl_to_score(kl, self.threshold)
            if end >= len(texts):
                break
            start = max(start + 1, end - 8)  # overlap so that every boundary gets context
        return scores
