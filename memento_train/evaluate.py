"""Evaluation: generate in full / memento / restart modes, score answers, account KV, plot.

An answer that cannot be extracted counts as wrong and is reported (`unparseable`), never dropped.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .format import MementoFormatError, MementoTokens
from .inference import MODES, generate
from .masking import MaskPolicy

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?")


def _boxed(text: str) -> str | None:
    start = text.rfind("\\boxed")
    if start < 0:
        return None
    brace = text.find("{", start)
    if brace < 0:
        return None
    depth = 0
    for i in range(brace, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[brace + 1 : i]
    return None


def extract_answer(text: str) -> str | None:
    """The last \\boxed{…}, else what follows the last "Final Answer:", else the last number."""
    boxed = _boxed(text)
    if boxed is not None and boxed.strip():
        return boxed.strip()
    marker = list(re.finditer(r"final answer\s*[:：]?\s*(?:is\s*)?", text, re.IGNORECASE))
    if marker:
        tail = text[marker[-1].end() :].strip().splitlines()
        if tail and tail[0].strip():
            return tail[0].strip()
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def normalize(answer: str) -> str:
    out = answer.strip().rstrip(".").strip().strip("$").strip()
    for pattern, repl in ((r"\\text\{([^}]*)\}", r"\1"), (r"\\(?:left|right|displaystyle|,|;|!)", ""),
                          (r"\\[dt]frac", r"\\frac"), (r"\s+", ""), (r"(?<=\d),(?=\d{3})", "")):  # fmt: skip
        out = re.sub(pattern, repl, out)
    return out.rstrip(".").lower()


def _as_number(text: str) -> float | None:
    match = re.fullmatch(r"(-?\d+(?:\.\d+)?)(?:/(\d+(?:\.\d+)?))?", text)
    if not match:
        frac = re.fullmatch(r"(-?)\\frac\{(\d+)\}\{(\d+)\}", text)
        return (
            (-1 if frac.group(1) else 1) * int(frac.group(2)) / int(frac.group(3))
            if frac and int(frac.group(3))
            else None
        )
    value = float(match.group(1))
    return value / float(match.group(2)) if match.group(2) and float(match.group(2)) else value


def _sympy_equal(a: str, b: str, timeout: float) -> bool:
    import concurrent.futures

    def check() -> bool:
        import sympy

        return bool(
            sympy.simplify(sympy.sympify(a.replace("^", "**")) - sympy.sympify(b.replace("^", "**"))) == 0
        )

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        try:
            return pool.submit(check).result(timeout=timeout)
        except Exception:
            return False


def is_correct(predicted: str | None, gold: str, use_sympy: bool = False, timeout: float = 2.0) -> bool:
    if predicted is None:
        return False
    a, b = normalize(predicted), normalize(gold)
    if a == b:
        return True
    x, y = _as_number(a), _as_number(b)
    if x is not None and y is not None:
        return math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-9)
    return use_sympy and _sympy_equal(a, b, timeout)


def load_policy(checkpoint: str | Path) -> tuple[MaskPolicy, str | None]:
    """The policy the checkpoint was trained with, from its block_masking_config.json."""
    path = Path(checkpoint) / "block_masking_config.json"
    if not path.exists():
        return MaskPolicy(), (f"{checkpoint} has no block_masking_config.json (not trained with memento-train?); "
                              "evaluating with the default policy keep_last_n_blocks=0, mask_delimiters=false")  # fmt: skip
    cfg = json.loads(path.read_text())
    return MaskPolicy(int(cfg.get("keep_last_n_blocks", 0)), bool(cfg.get("mask_delimiters", False)),
                      bool(cfg.get("keep_last_block_for_answer", False))), None  # fmt: skip


def load_items(path: str | Path, limit: int | None = None) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such data file: {path}")
    items = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise MementoFormatError(f"invalid JSON: {err.msg}", where=f"{path}:{lineno}") from None
        gold = (record.get("meta") or {}).get("reference_answer") or record.get("reference_answer")
        if gold is None and isinstance(record.get("answer"), str):
            gold = extract_answer(record["answer"])
        if not isinstance(record.get("problem"), str) or gold is None:
            raise MementoFormatError("needs 'problem' and a reference answer (meta.reference_answer or 'answer')",
                                     where=f"{path}:{lineno}")  # fmt: skip
        items.append(
            {"id": record.get("id", f"{path.name}:{lineno}"), "problem": record["problem"], "gold": str(gold)}
        )
        if limit is not None and len(items) >= limit:
            break
    if not items:
        raise MementoFormatError("no items to evaluate", where=str(path))
    return items


def _chunks(items: list[Any], size: int) -> Iterable[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def evaluate(checkpoint: str | Path, data: str | Path, modes: list[str], output: str | Path, samples: int | None = None,
             max_new_tokens: int = 1024, max_block_tokens: int | None = None, batch_size: int = 4,
             use_sympy: bool = False, progress: bool = True) -> dict[str, Any]:  # fmt: skip
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .tokens import chat_template_of

    bad = [m for m in modes if m not in MODES]
    if bad:
        raise ValueError(f"unknown mode(s) {', '.join(bad)}: choose from {', '.join(MODES)}")
    items = load_items(data, samples)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    try:
        tokens = MementoTokens.from_tokenizer(tokenizer)
    except MementoFormatError:
        raise MementoFormatError(f"{checkpoint}: the tokenizer has no memento tokens; evaluate a checkpoint trained "
                                 "with memento-train (or add the tokens and train it first)") from None  # fmt: skip
    policy, warning = load_policy(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, attn_implementation="sdpa").eval()
    eos = tuple(
        i
        for i in {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")}
        if isinstance(i, int)
    )
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": it["problem"]}], add_generation_prompt=True,
                                             tokenize=False, chat_template=chat_template_of(tokenizer))
               for it in items]  # fmt: skip
    prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"checkpoint": str(checkpoint), "data": str(data), "items": len(items),
                               "policy": vars(policy), "warnings": [warning] if warning else [], "modes": {}}  # fmt: skip
    curves: dict[str, list[int]] = {}
    with (output / "items.jsonl").open("w") as per_item:
        for mode in modes:
            rows = []
            bar = tqdm(total=len(items), desc=f"eval {mode}", disable=not progress)
            for batch in _chunks(list(range(len(items))), batch_size):
                start = time.perf_counter()
                result = generate(model, tokens, [prompt_ids[i] for i in batch], policy, mode, max_new_tokens,
                                  eos, max_block_tokens, tokenizer.pad_token_id or 0)  # fmt: skip
                seconds = time.perf_counter() - start
                for row, index in enumerate(batch):
                    ids = result.ids[row]
                    text = tokenizer.decode(ids, skip_special_tokens=False)
                    # no </think>: the reasoning never ended, so there is no answer (unparseable, wrong)
                    predicted = extract_answer(text.split("</think>")[-1]) if "</think>" in text else None
                    blocks = ids.count(tokens.block_start)
                    lengths = result.stats.lengths[row]
                    record = {
                        "id": items[index]["id"], "mode": mode, "gold": items[index]["gold"], "predicted": predicted,
                        "correct": is_correct(predicted, items[index]["gold"], use_sympy),
                        "unparseable": predicted is None, "blocks": blocks, "generated_tokens": len(ids),
                        "peak_kv_tokens": max(lengths, default=0), "kv_auc": sum(lengths),
                        "tokens_per_s": len(ids) / seconds, "forced_block_ends": result.forced_block_ends[row],
                        "compression": _compression(ids, tokens), "text": text,
                    }  # fmt: skip
                    rows.append(record)
                    per_item.write(json.dumps(record) + "\n")
                    if index == 0:
                        curves[mode] = lengths
                bar.update(len(batch))
            bar.close()
            summary["modes"][mode] = _summarize(rows)
    (output / "summary.json").write_text(json.dumps(summary, indent=2))
    plot_kv(curves, output / "kv_curve.png")
    plot_bars(summary["modes"], output / "modes.png")
    return summary


def modes_table(modes: dict[str, dict[str, Any]]) -> str:
    """The per-mode summary as a markdown table (eval and quickstart print it)."""
    lines = ["| mode | accuracy | ± | unparseable | peak KV tokens | KV AUC | tokens/s | blocks | compression |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for mode, m in modes.items():
        comp = f"{m['compression']:.3f}" if m["compression"] is not None else "-"
        lines.append(f"| {mode} | {m['accuracy']:.3f} | {m['stderr']:.3f} | {m['unparseable']} "
                     f"| {m['peak_kv_tokens']:.0f} | {m['kv_auc']:.0f} | {m['tokens_per_s']:.1f} "
                     f"| {m['blocks_per_answer']:.2f} | {comp} |")  # fmt: skip
    return "\n".join(lines)


def _compression(ids: list[int], tokens: MementoTokens) -> float | None:
    block = memento = 0
    state = None
    for t in ids:
        if t in (tokens.block_start, tokens.summary_start):
            state = t
        elif t in (tokens.block_end, tokens.summary_end):
            state = None
        elif state == tokens.block_start:
            block += 1
        elif state == tokens.summary_start:
            memento += 1
    return memento / block if block else None


def _summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(rows)
    accuracy = sum(r["correct"] for r in rows) / n
    compressions = [r["compression"] for r in rows if r["compression"] is not None]
    return {
        "accuracy": accuracy,
        "stderr": math.sqrt(accuracy * (1 - accuracy) / n),
        "n": n,
        "unparseable": sum(r["unparseable"] for r in rows),
        "peak_kv_tokens": sum(r["peak_kv_tokens"] for r in rows) / n,
        "kv_auc": sum(r["kv_auc"] for r in rows) / n,
        "tokens_per_s": sum(r["tokens_per_s"] for r in rows) / n,
        "blocks_per_answer": sum(r["blocks"] for r in rows) / n,
        "compression": sum(compressions) / len(compressions) if compressions else None,
        "generated_tokens": sum(r["generated_tokens"] for r in rows) / n,
    }


def plot_kv(curves: dict[str, list[int]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    styles = {"full": "-", "memento": "-", "restart": ":"}  # restart overlaps memento: dotted on top
    for mode, lengths in curves.items():
        ax.plot(range(len(lengths)), lengths, styles.get(mode, "-"), label=mode, linewidth=1.6)
    ax.set_xlabel("decoding step")
    ax.set_ylabel("KV entries attended")
    ax.set_title("KV cache size while decoding (first item)")
    ax.legend()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def plot_bars(modes: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(modes)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    axes[0].bar(
        names, [modes[m]["accuracy"] for m in names], yerr=[modes[m]["stderr"] for m in names], capsize=4
    )
    axes[0].set_ylabel("accuracy")
    axes[1].bar(names, [modes[m]["peak_kv_tokens"] for m in names])
    axes[1].set_ylabel("mean peak KV tokens")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def replay(path: str | Path, tokenizer: Any, policy: MaskPolicy, config: Any = None) -> list[dict[str, Any]]:
    """Offline KV accounting of finished traces, without a model: peak and AUC of the KV cache
    under full attention vs memento eviction (the paper's offline analysis)."""
    from .cli import mask_report
    from .format import load_samples

    reports = []
    for i, sample in enumerate(load_samples(str(path))):
        report = mask_report(sample, tokenizer, policy, None)
        entry = {"file": str(path), "index": i, "tokens": report["tokens"], "blocks": report["blocks"],
                 "peak_kv_full": report["peak_kv_full"], "peak_kv_memento": report["peak_kv_memento"],
                 "peak_kv_ratio": report["peak_kv_ratio"], "auc_ratio": report["auc_ratio"]}  # fmt: skip
        if config is not None:
            from .inference import KVStats

            entry["peak_kv_bytes_full"] = KVStats().kv_bytes(report["peak_kv_full"], config)
            entry["peak_kv_bytes_memento"] = KVStats().kv_bytes(report["peak_kv_memento"], config)
        reports.append(entry)
    return reports
