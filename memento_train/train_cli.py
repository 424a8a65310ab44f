"""`memento-train train | sweep | push | merge`: thin shells over train.py, config.py and hub.py."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from .config import apply_overrides, config_from_dict, expand_sweep, load_config, load_yaml


def add_train_parsers(sub: Any) -> None:
    p = sub.add_parser("train", help="run one training stage (same code as scripts/train.py)")
    p.add_argument("--config", help="YAML config (base: inheritance supported)")
    p.add_argument("--stage", type=int, choices=(1, 2), help="overrides the config's stage")
    p.add_argument(
        "overrides", nargs="*", help="key=value, e.g. training.learning_rate=1e-4 mask.keep_last_n_blocks=1"
    )
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("sweep", help="expand a sweep YAML (Cartesian product of list values, '_' bundles)")
    p.add_argument("sweep", help="sweep YAML (may use base: like any config)")
    p.add_argument(
        "--dry-run", action="store_true", help="print one launch command per run instead of training"
    )
    p.add_argument(
        "--launcher", default="accelerate launch scripts/train.py", help="command printed by --dry-run"
    )
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("push", help="push a checkpoint to the Hugging Face Hub (token from HF_TOKEN)")
    p.add_argument("checkpoint")
    p.add_argument("--repo-id", required=True)
    p.add_argument("--private", action="store_true")
    p.set_defaults(func=cmd_push)

    p = sub.add_parser("merge", help="merge a LoRA adapter (and its trained tag rows) into its base model")
    p.add_argument("adapter")
    p.add_argument("--output", required=True)
    p.set_defaults(func=cmd_merge)
    add_eval_parsers(sub)
    add_quickstart_parser(sub)
    add_probe_parser(sub)


def add_eval_parsers(sub: Any) -> None:
    p = sub.add_parser("eval", help="generate in full/memento/restart modes, score answers, account KV, plot")
    p.add_argument("--model", required=True, help="a checkpoint trained with memento-train")
    p.add_argument("--data", required=True, help="samples.jsonl (problem + meta.reference_answer or answer)")
    p.add_argument("--modes", default="full,memento,restart")
    p.add_argument("--samples", type=int, help="evaluate the first k items")
    p.add_argument("--output", default="outputs/eval")
    p.add_argument("--max-new-tokens", type=int, default=1024)
    p.add_argument("--max-block-tokens", type=int, help="force <|block_end|> after this many block tokens")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument(
        "--sympy", action="store_true", help="also accept answers sympy proves equal (2 s timeout)"
    )
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("replay", help="offline KV accounting of finished traces (no model needed)")
    p.add_argument("files", nargs="+", help="JSONL samples or official example JSONs")
    p.add_argument("--tokenizer", help="HF tokenizer (default: a BPE trained on each trace)")
    p.add_argument("--gguf-file")
    p.add_argument("--model-config", help="a model dir/name whose config gives KV bytes per token")
    p.add_argument("--keep-last-n-blocks", type=int, default=0)
    p.add_argument("--mask-delimiters", action="store_true")
    p.add_argument("--answer-sees-last-block", action="store_true")
    p.add_argument("--json", action="store_true", help="one JSON object per trace")
    p.set_defaults(func=cmd_replay)


def add_quickstart_parser(sub: Any) -> None:
    p = sub.add_parser("quickstart", help="the whole loop on a CPU: synthetic data, stage 1, stage 2, eval")
    p.add_argument("--output", default="outputs/quickstart")
    p.add_argument("--fast", action="store_true", help="a 1-minute smoke run (CI); numbers mean little")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_quickstart)


def add_probe_parser(sub: Any) -> None:
    p = sub.add_parser(
        "probe", help="passcode probe: what a memento's KV carries beyond its text (paper §6.2)"
    )
    p.add_argument("--model", required=True, help="a stage-2 checkpoint")
    p.add_argument("--output", default="outputs/probe")
    p.add_argument("--n", type=int, default=400, help="synthetic traces (70% train the probe, 30% score it)")
    p.add_argument("--choices", type=int, default=10, help="k-way passcode; chance = 1/k")
    p.add_argument("--layer", type=int, help="layer whose K||V is probed (default: the middle one)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_probe)


def cmd_probe(args: argparse.Namespace) -> int:
    from .probe import run_probe

    report = run_probe(args.model, args.output, args.n, args.choices, args.layer, args.seed)
    print(
        f"| probe (layer {report['layer']}, {args.choices}-way, chance {report['chance']:.2f}) | accuracy | 95% CI |"
    )
    print("|---|---|---|")
    for name, r in report["probes"].items():
        print(f"| {name} | {r['accuracy']:.3f} | {r['ci95'][0]:.3f}-{r['ci95'][1]:.3f} |")
    print(f"report: {Path(args.output) / 'probe.json'}, plot: {Path(args.output) / 'probe.png'}")
    return 0


def cmd_quickstart(args: argparse.Namespace) -> int:
    from .quickstart import print_report, quickstart

    report = quickstart(args.output, args.fast, args.seed, not args.no_progress)
    print_report(report)
    print(f"report: {Path(args.output) / 'report.json'}; plots: {', '.join(report['plots'])}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from .evaluate import evaluate, modes_table

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    summary = evaluate(args.model, args.data, modes, args.output, args.samples, args.max_new_tokens,
                       args.max_block_tokens, args.batch_size, args.sympy, not args.no_progress)  # fmt: skip
    for warning in summary["warnings"]:
        print(f"warning: {warning}", file=sys.stderr)
    print(modes_table(summary["modes"]))
    print(f"summary: {Path(args.output) / 'summary.json'}; plots: kv_curve.png, modes.png")
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from .cli import _load_tokenizer
    from .evaluate import replay
    from .format import load_samples
    from .masking import MaskPolicy

    policy = MaskPolicy(args.keep_last_n_blocks, args.mask_delimiters, args.answer_sees_last_block)
    config = None
    if args.model_config:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(args.model_config)
    for path in args.files:
        first = load_samples(path)[0]
        tokenizer = _load_tokenizer(args.tokenizer, args.gguf_file, first)
        for entry in replay(path, tokenizer, policy, config):
            if args.json:
                print(json.dumps(entry))
            else:
                print(
                    f"{entry['file']}[{entry['index']}]: {entry['tokens']} tokens, {entry['blocks']} blocks, "
                    f"peak KV {entry['peak_kv_memento']}/{entry['peak_kv_full']} = {entry['peak_kv_ratio']:.3f}, "
                    f"AUC ratio {entry['auc_ratio']:.3f}"
                )
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from .train import run_training

    config = load_config(args.config, args.overrides, args.stage)
    report = run_training(config)
    if int(os.environ.get("RANK", "0")) != 0:
        return 0
    data, log = report["data"], report["log"]
    print(
        f"stage {config.stage} done: {len(log)} logged steps, loss {log[0]['loss']:.4f} -> {log[-1]['loss']:.4f}; "
        f"{data['kept']} samples in {data['rows']} rows ({data['too_long']} too long dropped, "
        f"{data['invalid']} invalid), {data['real_token_fraction']:.1%} real tokens; saved to {config.output_dir}"
    )
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    """Write one config per run (each with its own output_dir and run_name), validate them all, then
    print their launch commands (--dry-run) or run them one after another."""
    import yaml

    data = load_yaml(args.sweep)
    base_output = data.get("output_dir", "outputs/sweep")
    planned = []
    for suffix, run in expand_sweep(data):
        run = apply_overrides(run, [f"output_dir={base_output}/{suffix}", f"run_name={suffix}"])
        config_from_dict(run)  # every run must be valid before any starts
        planned.append((suffix, Path(base_output) / suffix / "config.yaml", run))
    for suffix, path, run in planned:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(run, sort_keys=False))
        if args.dry_run:
            print(f"{args.launcher} --config {shlex.quote(str(path))}")
            continue
        print(f"[sweep] {suffix}: {path}", flush=True)
        code = subprocess.call([sys.executable, "-m", "memento_train.cli", "train", "--config", str(path)])
        if code:
            print(f"[sweep] run {suffix} failed with exit code {code}", file=sys.stderr)
            return code
    print(json.dumps({"runs": [suffix for suffix, _, _ in planned]}))
    return 0


def cmd_push(args: argparse.Namespace) -> int:
    from .hub import push

    print(push(args.checkpoint, args.repo_id, private=args.private))
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    from .modeling import merge_adapter

    merge_adapter(args.adapter, args.output)
    print(f"merged {args.adapter} into {args.output}")
    return 0
