"""`memento-train` command line: one subcommand per job, each a thin shell over the library."""

from __future__ import annotations

import argparse
import json
import sys
from importlib import resources
from pathlib import Path
from typing import Any

from .format import MementoFormatError, MementoTokens, Sample, load_samples

EXAMPLE_TRACE = "examples/trace.json"


def example_trace_path() -> Path:
    """The example trace shipped inside the package (written for this project)."""
    return Path(str(resources.files("memento_train").joinpath(EXAMPLE_TRACE)))


def _load_tokenizer(name: str | None, gguf_file: str | None, sample: Sample) -> Any:
    from .tokens import add_memento_tokens

    if name is None:
        from .toy_tokenizer import build_tokenizer

        corpus = [sample.problem, *sample.blocks, *sample.mementos, sample.answer]
        return build_tokenizer(corpus, vocab_size=1024)
    from transformers import AutoTokenizer

    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, **kwargs)
    except OSError as err:
        raise SystemExit(f"error: cannot load tokenizer {name!r}: {err}") from None
    add_memento_tokens(tokenizer)
    return tokenizer


def _policy(args: argparse.Namespace):
    from .masking import MaskPolicy

    return MaskPolicy(
        keep_last_n_blocks=args.keep_last_n_blocks,
        mask_delimiters=args.mask_delimiters,
        answer_sees_last_block=args.answer_sees_last_block,
    )


def mask_report(sample: Sample, tokenizer: Any, policy, png: str | None) -> dict[str, Any]:
    """Tokenize one sample as training will, apply the rule, account its KV, optionally draw it."""
    import torch

    from .mask_viz import draw_mask, kv_accounting
    from .masking import dense_mask
    from .tokens import render_chat, role_counts, token_roles

    prompt, completion = render_chat(sample, tokenizer)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    completion_ids = tokenizer(completion, add_special_tokens=False)["input_ids"]
    ids = torch.tensor(prompt_ids + completion_ids)
    tokens = MementoTokens.from_tokenizer(tokenizer)
    mask = dense_mask(ids, tokens, policy)
    roles = token_roles(ids, tokens, prompt_len=len(prompt_ids))
    report: dict[str, Any] = {
        "blocks": len(sample.blocks),
        "policy": vars(policy) if hasattr(policy, "__dict__") else str(policy),
        "role_tokens": role_counts(roles),
        **kv_accounting(mask),
    }
    if png:
        title = (
            f"{len(sample.blocks)} blocks, {len(ids)} tokens; peak KV {report['peak_kv_memento']}"
            f"/{report['peak_kv_full']} = {report['peak_kv_ratio']:.2f}x of full"
        )
        report["png"] = str(draw_mask(mask, png, roles, title))
    return report


def _print_report(report: dict[str, Any]) -> None:
    roles = ", ".join(f"{k} {v}" for k, v in report["role_tokens"].items() if v)
    print(f"tokens          {report['tokens']}  ({roles})")
    print(f"blocks          {report['blocks']}")
    print(f"policy          {report['policy']}")
    print(
        f"peak KV tokens  full {report['peak_kv_full']}  memento {report['peak_kv_memento']}"
        f"  ratio {report['peak_kv_ratio']:.3f}"
    )
    print(
        f"KV AUC          full {report['kv_auc_full']:.0f}  memento {report['kv_auc_memento']:.0f}"
        f"  ratio {report['auc_ratio']:.3f}"
    )
    if "png" in report:
        print(f"mask drawn to   {report['png']}")


def cmd_mask(args: argparse.Namespace) -> int:
    samples = load_samples(args.trace)
    if not 0 <= args.index < len(samples):
        raise SystemExit(
            f"error: --index {args.index} out of range: {args.trace} holds {len(samples)} samples"
        )
    sample = samples[args.index]
    tokenizer = _load_tokenizer(args.tokenizer, args.gguf_file, sample)
    report = mask_report(sample, tokenizer, _policy(args), args.png)
    report["trace"] = str(args.trace)
    if args.json:
        print(json.dumps(report))
    else:
        _print_report(report)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    args.trace, args.index = str(example_trace_path()), 0
    print(f"memento-train demo: the mask of {args.trace}\n")
    return cmd_mask(args)


def _add_mask_args(p: argparse.ArgumentParser, png_default: str | None) -> None:
    p.add_argument(
        "--tokenizer", help="HF hub name or local dir (default: a BPE tokenizer trained on the trace)"
    )
    p.add_argument("--gguf-file", help="GGUF file inside --tokenizer's directory")
    p.add_argument("--keep-last-n-blocks", type=int, default=0, help="finished blocks that stay visible")
    p.add_argument("--mask-delimiters", action="store_true", help="evict block tags with their content")
    p.add_argument("--answer-sees-last-block", action="store_true", help="keep the last block for the answer")
    p.add_argument("--png", default=png_default, help="write a drawing of the mask here")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memento-train", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("mask", help="apply the visibility rule to a trace: KV accounting and a PNG")
    p.add_argument(
        "--trace", required=True, help=".json/.jsonl sample(s), an example JSON, or a raw response"
    )
    p.add_argument("--index", type=int, default=0, help="which sample of the file")
    _add_mask_args(p, None)
    p.set_defaults(func=cmd_mask)
    p = sub.add_parser("demo", help="draw the mask of the example trace shipped with the package")
    _add_mask_args(p, "memento_mask.png")
    p.set_defaults(func=cmd_demo)
    from data_builders.cli import add_build_parser, add_stats_parser

    add_build_parser(sub)
    add_stats_parser(sub)
    from .train_cli import add_train_parsers

    add_train_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (MementoFormatError, ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
