"""stats.json for a built dataset: counts, block and memento size distributions, compression,
and the peak-KV ratio each sample would have under eviction (the rule from memento_train.masking)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch

from memento_train.format import MementoTokens
from memento_train.masking import MaskPolicy, expiry, visible_until

_TOK = MementoTokens(block_start=1, block_end=2, summary_start=3, summary_end=4, think_start=5, think_end=6)


def predicted_peak_kv_ratio(
    prompt: int, blocks: list[int], mementos: list[int], answer: int, policy: MaskPolicy | None = None
) -> float:
    """max over decoding steps of the KV entries held under eviction, over the total length, for a
    trace with these token counts (tags included), computed with the training mask's own rule."""
    ids = [0] * prompt + [_TOK.think_start]
    for b, m in zip(blocks, mementos, strict=True):
        ids += (
            [_TOK.block_start] + [0] * b + [_TOK.block_end, _TOK.summary_start] + [0] * m + [_TOK.summary_end]
        )
    ids += [_TOK.think_end] + [0] * answer
    until = visible_until(expiry(torch.tensor(ids), _TOK, policy or MaskPolicy())[None])[0].numpy()
    held = np.zeros(len(ids) + 1, dtype=np.int64)  # key k is held for queries k .. until[k]-1
    np.add.at(held, np.arange(len(ids)), 1)
    np.add.at(held, until, -1)
    return float(np.cumsum(held)[:-1].max() / len(ids))


def _distribution(values: list[float]) -> dict[str, float]:
    if not values:
        return {"count": 0}
    arr = np.asarray(values, dtype=np.float64)
    return {
        "count": int(arr.size),
        "mean": round(float(arr.mean()), 2),
        "min": round(float(arr.min()), 4),
        "p10": round(float(np.percentile(arr, 10)), 4),
        "median": round(float(np.median(arr)), 4),
        "p90": round(float(np.percentile(arr, 90)), 4),
        "max": round(float(arr.max()), 4),
    }


def dataset_stats(directory: str | Path, count=None) -> dict[str, Any]:
    from .sentences import approx_tokens

    count = count or approx_tokens
    directory = Path(directory)
    samples_path = directory / "samples.jsonl" if directory.is_dir() else directory
    rejects_path = samples_path.with_name("rejects.jsonl")
    blocks_per, block_tokens, memento_tokens, compression, peak = [], [], [], [], []
    sources: Counter[str] = Counter()
    n = 0
    with samples_path.open(encoding="utf-8") as handle:
        for line in handle:
            if not line.strip():
                continue
            record = json.loads(line)
            n += 1
            meta = record.get("meta") or {}
            b_tok = meta.get("block_tokens") or [count(b) for b in record["blocks"]]
            m_tok = meta.get("memento_tokens") or [count(m) for m in record["mementos"]]
            blocks_per.append(len(b_tok))
            block_tokens += b_tok
            memento_tokens += m_tok
            compression.append(sum(m_tok) / max(1, sum(b_tok)))
            peak.append(
                predicted_peak_kv_ratio(count(record["problem"]), b_tok, m_tok, count(record["answer"]))
            )
            sources[record.get("source") or ""] += 1
    rejects: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    if rejects_path.exists():
        for line in rejects_path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                reject = json.loads(line)
                rejects[reject["stage"]] += 1
                reasons[reject["reason"].split(":")[0][:80]] += 1
    return {
        "samples": n,
        "rejects": sum(rejects.values()),
        "rejects_by_stage": dict(rejects),
        "top_reject_reasons": dict(reasons.most_common(10)),
        "sources": dict(sources),
        "blocks_per_trace": _distribution(blocks_per),
        "block_tokens": _distribution(block_tokens),
        "memento_tokens": _distribution(memento_tokens),
        "compression_ratio": round(sum(memento_tokens) / max(1, sum(block_tokens)), 4),
        "compression_per_trace": _distribution(compression),
        "predicted_peak_kv_ratio": _distribution(peak),
        "token_counts": "approximate (words + punctuation)" if count is approx_tokens else "target tokenizer",
    }
