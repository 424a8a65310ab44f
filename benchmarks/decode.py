"""Decode throughput with and without eviction, and what eviction costs.

    python benchmarks/decode.py [--contexts 1024 4096 8192] [--steps 64]

A memento-structured sequence (100-token prompt, then blocks of ~300 tokens each closed by a
~50-token memento: OpenMementos proportions at a quarter of the size) is prefilled up to each
context length; then `--steps` tokens are decoded one at a time (teacher-forced, so both modes do
the same work), with a memento closing inside the window so eviction happens while it is timed.
Reported: decode tokens/s in `full` and `memento` mode, the KV entries attended at the last step,
and the share of decode time spent evicting (cache compaction) and tracking expiries.
"""

from __future__ import annotations

import argparse
import random
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from memento_train.format import MementoTokens
from memento_train.inference import EvictingDecoder
from memento_train.masking import MaskPolicy

TOK = MementoTokens(block_start=1, block_end=2, summary_start=3, summary_end=4, think_start=5, think_end=6)


def structured(length: int, steps: int, seed: int = 0) -> tuple[list[int], int]:
    """Prompt, then (block, memento) pairs; returns the ids and a prefill length near `length` chosen
    so that a memento closes in the middle of the decode window."""
    rng = random.Random(seed)
    ids = [rng.randrange(10, 500) for _ in range(100)] + [TOK.think_start]
    while len(ids) < length + 2 * steps + 400:
        ids += (
            [TOK.block_start]
            + [rng.randrange(10, 500) for _ in range(rng.randint(250, 350))]
            + [TOK.block_end]
        )
        ids += (
            [TOK.summary_start]
            + [rng.randrange(10, 500) for _ in range(rng.randint(40, 60))]
            + [TOK.summary_end]
        )
    close = min(i for i, t in enumerate(ids) if t == TOK.summary_end and i >= length + steps // 2)
    prefill = close - steps // 2
    return ids[: prefill + steps], prefill


def run(model, ids: list[int], length: int, steps: int, mode: str) -> dict[str, float]:
    decoder = EvictingDecoder(model, TOK, MaskPolicy(), mode)
    tensor = torch.tensor([ids])
    decoder.step(tensor[:, :length])
    decoder.stats.evict_seconds, decoder.stats.evicted = 0.0, 0
    start = time.perf_counter()
    for t in range(length, length + steps):
        decoder.step(tensor[:, t : t + 1])
    elapsed = time.perf_counter() - start
    return {
        "tps": steps / elapsed,
        "evict": decoder.stats.evict_seconds / elapsed,
        "kv": decoder.stats.lengths[0][-1],
        "evicted": decoder.stats.evicted,
    }


def tracker_share(ids: list[int], length: int, steps: int, seconds_per_step: float) -> float:
    """The expiry tracker's own cost per decoded token, as a share of a decode step."""
    from memento_train.masking import ExpiryTracker

    tracker = ExpiryTracker(TOK, MaskPolicy())
    for t in ids[:length]:
        tracker.feed(t)
    start = time.perf_counter()
    for t in ids[length : length + steps]:
        tracker.feed(t)
    return (time.perf_counter() - start) / steps / seconds_per_step


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 8192])
    parser.add_argument("--steps", type=int, default=64)
    args = parser.parse_args()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=16384)  # fmt: skip
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config).eval()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; tiny Llama (hidden 256, 4 layers, fp32), "
        f"{args.steps} decode steps after a prefill of each context, median of 3 runs"
    )
    print(
        "\n| context | full tokens/s | memento tokens/s | memento / full | KV attended full / memento "
        "| entries evicted in the window | eviction share of decode time | expiry tracking share |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for length in args.contexts:
        ids, prefill = structured(length, args.steps)
        results = {}
        for mode in ("full", "memento"):
            runs = sorted(
                (run(model, ids, prefill, args.steps, mode) for _ in range(3)), key=lambda r: r["tps"]
            )
            results[mode] = runs[1]
        full, memento = results["full"], results["memento"]
        tracking = tracker_share(ids, prefill, args.steps, 1 / memento["tps"])
        print(
            f"| {prefill:,} | {full['tps']:.1f} | {memento['tps']:.1f} | {memento['tps'] / full['tps']:.2f} "
            f"| {full['kv']:,} / {memento['kv']:,} | {memento['evicted']} | {memento['evict']:.2%} | {tracking:.2%} |"
        )


if __name__ == "__main__":
    main()
