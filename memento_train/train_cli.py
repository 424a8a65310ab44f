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
