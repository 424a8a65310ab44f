"""The passcode probe (paper §6.2): how much does a memento's KV carry beyond its text?

A random k-way passcode is hidden in block 2 of synthetic traces and never written into a memento.
Under the stage-2 mask, memento 2 saw block 2 (M2, direct), memento 3 never did (M3, masked: any
passcode information reaches it only through memento 2's KV), and memento 1 was computed before
block 2 existed (M1, causal control: it must stay at chance). An MLP probe on the K‖V features of
each memento's tokens at one layer is trained on some traces and scored on others.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from data_builders.synthetic import SyntheticConfig, synthetic_samples

from .format import MementoTokens
from .masking import dense_mask
from .tokens import render_chat


def wilson(correct: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a proportion."""
    if n == 0:
        return (0.0, 1.0)
    p = correct / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def _memento_spans(ids: list[int], tokens: MementoTokens) -> list[tuple[int, int]]:
    spans, start = [], None
    for i, t in enumerate(ids):
        if t == tokens.summary_start:
            start = i + 1
        elif t == tokens.summary_end and start is not None:
            spans.append((start, i))
            start = None
    return spans


def memento_features(model: Any, tokenizer: Any, tokens: MementoTokens, samples: list[Any], policy: Any,
                     layer: int) -> torch.Tensor:  # fmt: skip
    """[samples, 3 mementos, 2·kv_dim]: mean K‖V over each of the first three mementos' tokens."""
    attention = model.model.layers[layer].self_attn
    captured: dict[str, torch.Tensor] = {}
    hooks = [
        attention.k_proj.register_forward_hook(lambda m, i, o: captured.__setitem__("k", o)),
        attention.v_proj.register_forward_hook(lambda m, i, o: captured.__setitem__("v", o)),
    ]
    rows = []
    try:
        for sample in samples:
            prompt, completion = render_chat(sample, tokenizer)
            ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
            ids = ids + tokenizer(completion, add_special_tokens=False)["input_ids"]
            tensor = torch.tensor([ids])
            with torch.no_grad():
                model(input_ids=tensor, attention_mask=dense_mask(tensor, tokens, policy)[:, None])
            kv = torch.cat([captured["k"][0], captured["v"][0]], -1)  # [S, 2·kv_dim]
            spans = _memento_spans(ids, tokens)[:3]
            if len(spans) < 3:
                raise ValueError("a probe trace needs at least three mementos")
            rows.append(torch.stack([kv[a:b].mean(0) for a, b in spans]))
    finally:
        for hook in hooks:
            hook.remove()
    return torch.stack(rows)


def train_probe(x_train, y_train, x_val, y_val, classes: int, epochs: int = 300, seed: int = 0) -> float:
    """An MLP (one hidden layer of 64) trained full-batch with Adam; returns validation accuracy."""
    torch.manual_seed(seed)
    mean, std = x_train.mean(0), x_train.std(0) + 1e-6
    x_train, x_val = (x_train - mean) / std, (x_val - mean) / std
    mlp = torch.nn.Sequential(torch.nn.Linear(x_train.shape[1], 64), torch.nn.ReLU(), torch.nn.Dropout(0.2),
                              torch.nn.Linear(64, classes))  # fmt: skip
    optimizer = torch.optim.Adam(mlp.parameters(), lr=3e-3, weight_decay=1e-3)
    for _ in range(epochs):
        mlp.train()
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(mlp(x_train), y_train).backward()
        optimizer.step()
    mlp.eval()
    with torch.no_grad():
        return float((mlp(x_val).argmax(-1) == y_val).float().mean())


def run_probe(checkpoint: str | Path, output: str | Path, n: int = 400, choices: int = 10, layer: int | None = None,
              seed: int = 0, task: SyntheticConfig | None = None) -> dict[str, Any]:  # fmt: skip
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .evaluate import load_policy

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    tokens = MementoTokens.from_tokenizer(tokenizer)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, attn_implementation="sdpa").eval()
    policy, _ = load_policy(checkpoint)
    layer = model.config.num_hidden_layers // 2 if layer is None else layer
    base = task or SyntheticConfig(n_blocks=3, steps_per_block=2, n_vars=2, max_value=9, filler=0, modulus=10)
    config = SyntheticConfig(**{**base.__dict__, "n_blocks": max(3, base.n_blocks), "passcode_block": 1,
                                "passcode_choices": choices, "seed": seed + 7919})  # fmt: skip
    samples = synthetic_samples(n, config)
    from data_builders.synthetic import PASSCODES

    labels = torch.tensor([PASSCODES.index(s.meta["passcode"]) for s in samples])
    features = memento_features(model, tokenizer, tokens, samples, policy, layer)
    split = int(0.7 * n)  # traces [0, split) train the probe, the rest score it
    results = {}
    for name, index in (("M1_causal_control", 0), ("M2_direct", 1), ("M3_masked", 2)):
        accuracy = train_probe(features[:split, index], labels[:split], features[split:, index], labels[split:],
                               choices, seed=seed)  # fmt: skip
        correct = round(accuracy * (n - split))
        results[name] = {"accuracy": accuracy, "ci95": wilson(correct, n - split), "n_val": n - split}
    report = {"checkpoint": str(checkpoint), "layer": layer, "choices": choices, "chance": 1 / choices,
              "traces": n, "probes": results,
              "paper_toy_model": {"M3_masked": 0.25, "M2_direct": 0.65, "chance": 0.10}}  # fmt: skip
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    (output / "probe.json").write_text(json.dumps(report, indent=2))
    _plot(report, output / "probe.png")
    return report


def _plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(report["probes"])
    acc = [report["probes"][n]["accuracy"] for n in names]
    low = [a - report["probes"][n]["ci95"][0] for a, n in zip(acc, names, strict=True)]
    high = [report["probes"][n]["ci95"][1] - a for a, n in zip(acc, names, strict=True)]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar([n.split("_", 1)[0] + "\n" + n.split("_", 1)[1] for n in names], acc, yerr=[low, high], capsize=5)
    ax.axhline(report["chance"], color="gray", linestyle="--", label=f"chance (1/{report['choices']})")
    ax.set_ylabel("probe accuracy on held-out traces")
    ax.set_title(f"passcode probe, layer {report['layer']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
