"""`memento-train build-data` and `memento-train stats`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from .build import BuildConfig, config_dict, make_counter, run_build
from .loaders import iter_hf_raw, iter_openmementos, iter_raw_jsonl, iter_segment_jsons, parse_field_map
from .stats import dataset_stats
from .synthetic import SyntheticConfig, as_raw_trace, synthetic_sample

FORMATS = ("raw", "openmementos", "segments", "synthetic")


def add_build_parser(sub: Any) -> None:
    p = sub.add_parser("build-data", help="raw CoT traces -> block/memento samples (resumable)")
    p.add_argument(
        "--output", required=True, help="output directory (samples.jsonl, rejects.jsonl, stats.json)"
    )
    src = p.add_argument_group("input")
    src.add_argument("--format", choices=FORMATS, default="raw")
    src.add_argument("--input", nargs="+", help="local .jsonl/.json/.parquet files")
    src.add_argument("--dataset", help="HF dataset name (e.g. microsoft/OpenMementos)")
    src.add_argument("--config", help="dataset config (OpenMementos: default or full)")
    src.add_argument("--split", default="train")
    src.add_argument("--fields", help="column names, e.g. problem=question,cot=response,answer=final")
    src.add_argument("--limit", type=int, help="stop after this many input records")
    seg = p.add_argument_group("segmentation")
    seg.add_argument("--scorer", choices=("heuristic", "attention", "llm"), default="heuristic")
    seg.add_argument("--writer", choices=("extractive", "llm", "model"), default="extractive")
    seg.add_argument("--min-block-tokens", type=int, default=200)
    seg.add_argument("--max-block-tokens", type=int, default=1600, help="0 for no cap")
    seg.add_argument("--lam", type=float, default=0.5, help="weight of CV(block sizes) in the objective")
    seg.add_argument("--tokenizer", help="count tokens with this HF tokenizer (default: approximate)")
    seg.add_argument("--gguf-file")
    run = p.add_argument_group("run")
    run.add_argument("--workers", type=int, default=1)
    run.add_argument("--checkpoint-every", type=int, default=50)
    run.add_argument("--no-progress", action="store_true")
    syn = p.add_argument_group("synthetic (--format synthetic)")
    syn.add_argument("--n", type=int, default=100, help="number of synthetic tasks")
    syn.add_argument("--seed", type=int, default=0)
    syn.add_argument("--blocks", type=int, default=4)
    syn.add_argument("--steps", type=int, default=3, help="steps per block")
    syn.add_argument("--vars", type=int, default=3)
    syn.add_argument("--max-value", type=int, default=20)
    syn.add_argument("--filler", type=int, default=1)
    syn.add_argument("--passcode-block", type=int)
    syn.add_argument("--passcode-choices", type=int, default=10)
    syn.add_argument(
        "--as-raw", action="store_true", help="segment and summarize the synthetic CoT like raw data"
    )
    llm = p.add_argument_group("llm / model steps")
    llm.add_argument("--llm-base-url", help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")
    llm.add_argument("--llm-model")
    llm.add_argument(
        "--llm-api-key-env", default="OPENAI_API_KEY", help="environment variable holding the key"
    )
    llm.add_argument("--llm-timeout", type=float, default=120.0)
    llm.add_argument("--llm-retries", type=int, default=3)
    llm.add_argument("--llm-concurrency", type=int, default=4)
    llm.add_argument("--llm-cache", help="directory caching validated replies (default: OUTPUT/llm_cache)")
    llm.add_argument("--judge-threshold", type=float, default=8.0)
    llm.add_argument("--refine-rounds", type=int, default=2)
    llm.add_argument("--model", help="local model for --writer model")
    llm.add_argument("--attention-model", help="local model for --scorer attention")
    llm.add_argument("--kl-threshold", type=float, default=0.35)
    p.set_defaults(func=cmd_build)


def _options(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    cache = args.llm_cache or str(Path(args.output) / "llm_cache")
    client = {"retries": args.llm_retries, "cache_dir": cache}
    remote = {
        "base_url": args.llm_base_url,
        "model": args.llm_model,
        "api_key_env": args.llm_api_key_env,
        "timeout": args.llm_timeout,
    }
    scorer: dict[str, Any] = {}
    if args.scorer == "llm":
        scorer = {"backend_options": remote, "concurrency": args.llm_concurrency, **client}
    elif args.scorer == "attention":
        scorer = {"model": args.attention_model, "threshold": args.kl_threshold}
    writer: dict[str, Any] = {}
    if args.writer in ("llm", "model"):
        backend = remote if args.writer == "llm" else {"model": args.model}
        writer = {
            "backend": backend,
            "threshold": args.judge_threshold,
            "rounds": args.refine_rounds,
            "concurrency": args.llm_concurrency,
            **client,
        }
    return scorer, writer


def _items(args: argparse.Namespace):
    fields = parse_field_map(args.fields)
    if args.format == "synthetic":
        config = SyntheticConfig(
            args.blocks,
            args.steps,
            args.vars,
            args.max_value,
            args.filler,
            args.passcode_block,
            args.passcode_choices,
            args.seed,
        )
        samples = (synthetic_sample(i, config) for i in range(args.n))
        return (as_raw_trace(s) for s in samples) if args.as_raw else samples
    if not args.input and not args.dataset:
        raise SystemExit("error: give --input FILE... or --dataset NAME (or --format synthetic)")
    if args.format == "segments":
        return iter_segment_jsons(args.input or [])
    if args.format == "openmementos":
        return iter_openmementos(
            args.dataset or "microsoft/OpenMementos", args.config or "default", args.split, args.input
        )
    if args.input and all(f.endswith(".jsonl") for f in args.input):
        return (item for path in args.input for item in iter_raw_jsonl(path, fields))
    return iter_hf_raw(args.dataset or "local", args.split, args.config, fields, args.input)


def _limited(items, limit: int | None):
    for i, item in enumerate(items):
        if limit is not None and i >= limit:
            return
        yield item


def cmd_build(args: argparse.Namespace) -> int:
    scorer, writer = _options(args)
    config = BuildConfig(
        scorer=args.scorer,
        writer=args.writer,
        min_block_tokens=args.min_block_tokens,
        max_block_tokens=args.max_block_tokens or None,
        lam=args.lam,
        tokenizer=args.tokenizer,
        gguf_file=args.gguf_file,
        workers=args.workers,
        checkpoint_every=args.checkpoint_every,
        scorer_options=scorer,
        writer_options=writer,
    )
    total = args.n if args.format == "synthetic" else args.limit
    counts = run_build(_limited(_items(args), args.limit), args.output, config, not args.no_progress, total)
    stats = dataset_stats(args.output, make_counter(args.tokenizer, args.gguf_file))
    stats["build_config"] = {
        k: v for k, v in config_dict(config).items() if k not in ("scorer_options", "writer_options")
    }
    (Path(args.output) / "stats.json").write_text(json.dumps(stats, indent=2))
    print(
        f"{counts['samples']} samples, {counts['rejects']} rejects in {args.output} "
        f"({counts['skipped']} already done, skipped)"
    )
    _print_stats(stats)
    return 0


def _print_stats(stats: dict[str, Any]) -> None:
    def dist(name: str) -> str:
        d = stats[name]
        return (
            "-"
            if not d.get("count")
            else f"mean {d['mean']}, median {d['median']}, p10-p90 {d['p10']}-{d['p90']}"
        )

    print(f"samples {stats['samples']}, rejects {stats['rejects']} {stats['rejects_by_stage'] or ''}")
    print(f"blocks per trace         {dist('blocks_per_trace')}")
    print(f"block tokens             {dist('block_tokens')}")
    print(f"memento tokens           {dist('memento_tokens')}")
    print(f"compression              {stats['compression_ratio']} (memento / block tokens)")
    print(f"predicted peak-KV ratio  {dist('predicted_peak_kv_ratio')}")


def add_stats_parser(sub: Any) -> None:
    p = sub.add_parser("stats", help="statistics of a built dataset (writes stats.json next to it)")
    p.add_argument("path", help="output directory of build-data, or a samples.jsonl")
    p.add_argument("--tokenizer")
    p.add_argument("--gguf-file")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_stats)


def cmd_stats(args: argparse.Namespace) -> int:
    path = Path(args.path)
    if not (path / "samples.jsonl").exists() and not path.is_file():
        raise SystemExit(f"error: no samples.jsonl at {path}")
    stats = dataset_stats(path, make_counter(args.tokenizer, args.gguf_file))
    if path.is_dir():
        (path / "stats.json").write_text(json.dumps(stats, indent=2))
    if args.json:
        print(json.dumps(stats))
    else:
        _print_stats(stats)
    return 0
