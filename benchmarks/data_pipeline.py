"""Throughput of the offline data builder and time of the segmenter.

    python benchmarks/data_pipeline.py [--copies 200] [--trace PATH]

1. traces/s of split + heuristic score + segment + extractive mementos (no LLM calls) on the
   official raw example trace replicated `--copies` times: one core (in-process) and all cores
   (a process pool, one builder per process).
2. the segmenter alone on a 400-sentence trace, against the ~0.32 s that the official MEMENTO
   DP is reported to take on a 187-sentence trace on this machine (issue #3).
3. the segmenter's gap to the brute-force optimum on small random inputs.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import statistics
import time
from pathlib import Path

from data_builders.build import BuildConfig, Builder
from data_builders.loaders import RawTrace, iter_raw_jsonl
from data_builders.scorers import HeuristicScorer
from data_builders.segment import segment, segment_brute_force
from data_builders.sentences import approx_tokens, split_sentences

DEFAULT_TRACE = (
    Path(__file__).resolve().parents[1].parent / "shared/data/memento_examples/example_trace.jsonl"
)
OFFICIAL_DP_SECONDS = 0.32  # reported for a 187-sentence trace (issue #3); not re-measured here

_BUILDER: Builder | None = None


def _init() -> None:
    global _BUILDER
    _BUILDER = Builder(BuildConfig())


def _run(trace: RawTrace):
    return _BUILDER(trace)


def throughput(trace: RawTrace, copies: int, workers: int) -> float:
    traces = [RawTrace(f"{trace.id}-{i}", trace.problem, trace.cot, trace.answer) for i in range(copies)]
    if workers == 1:
        _init()
        start = time.perf_counter()
        results = [_run(t) for t in traces]
    else:
        with multiprocessing.get_context("fork").Pool(workers, initializer=_init) as pool:
            pool.map(_run, traces[:workers])  # warm-up: imports and regex compilation
            start = time.perf_counter()
            results = pool.map(_run, traces, chunksize=max(1, copies // (4 * workers)))
    elapsed = time.perf_counter() - start
    assert all(isinstance(r, dict) for r in results), "every copy must build"
    return copies / elapsed


def sentences_trace(trace: RawTrace, n: int) -> tuple[list[int], list[int]]:
    text = trace.cot
    while len(split_sentences(text)) < n:
        text = text + "\n\n" + trace.cot
    sentences = split_sentences(text)[:n]
    sizes = [approx_tokens(s.text(text)) for s in sentences]
    return sizes, HeuristicScorer()(text, sentences)[: n - 1]


def segmenter_time(sizes: list[int], scores: list[int], max_tokens: int | None, repeats: int = 20) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        segment(sizes, scores, 200, max_tokens)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def gap_study(trials: int = 500, seed: int = 0) -> tuple[int, int, float, float]:
    rng = random.Random(seed)
    total = optimal = 0
    gaps = []
    for _ in range(trials):
        n = rng.randint(2, 14)
        sizes = [rng.randint(20, 200) for _ in range(n)]
        scores = [rng.randint(0, 3) for _ in range(n - 1)]
        cap = rng.choice([None, 400, 600])
        exact = segment_brute_force(sizes, scores, 200, cap)
        if exact is None:
            continue
        found = segment(sizes, scores, 200, cap)
        gap = exact.objective - found.objective
        total += 1
        optimal += gap <= 1e-9
        gaps.append(gap)
    return total, optimal, statistics.mean(gaps), max(gaps)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--copies", type=int, default=200)
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    args = parser.parse_args()
    (trace,) = list(iter_raw_jsonl(args.trace))
    sentences = split_sentences(trace.cot)
    tokens = sum(approx_tokens(s.text(trace.cot)) for s in sentences)
    cores = os.cpu_count() or 1
    print(
        f"trace {args.trace.name}: {len(trace.cot):,} chars, {len(sentences)} sentences, ~{tokens:,} tokens "
        f"(approximate count), x{args.copies}; {cores} cores"
    )
    one = throughput(trace, args.copies, 1)
    many = throughput(trace, args.copies, cores)
    print("\n| pipeline (split + heuristic + segment + extractive) | traces/s | traces/s per core |")
    print("|---|---|---|")
    print(f"| 1 core | {one:,.1f} | {one:,.1f} |")
    print(f"| {cores} cores | {many:,.1f} | {many / cores:,.1f} |")
    print("\n| segmenter | sentences | median time | vs official DP (0.32 s, 187 sentences) |")
    print("|---|---|---|---|")
    for n in (187, 400):
        sizes, scores = sentences_trace(trace, n)
        for cap in (1600, None):
            t = segmenter_time(sizes, scores, cap)
            print(
                f"| max_block_tokens={cap} | {n} | {t * 1e3:,.2f} ms | {OFFICIAL_DP_SECONDS / t:,.0f}x faster |"
            )
    total, optimal, mean_gap, max_gap = gap_study()
    print("\n| segmenter vs brute force (2-14 sentences, random sizes/scores/caps) | value |")
    print("|---|---|")
    print(f"| inputs with a feasible segmentation | {total} |")
    print(f"| exact optimum found | {optimal} ({optimal / total:.1%}) |")
    print(f"| mean / max objective gap | {mean_gap:.5f} / {max_gap:.4f} |")


if __name__ == "__main__":
    main()
