"""The whole loop on a CPU: synthetic data → stage 1 → stage 2 with retention → eval in three modes.

Everything is built in-process (a tiny Llama from a config, a BPE tokenizer trained on the data), so
it runs offline. The numbers it reports are whatever this run measures.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from data_builders.build import BuildConfig, run_build
from data_builders.synthetic import SyntheticConfig, synthetic_samples

from .config import config_from_dict
from .evaluate import evaluate, modes_table
from .train import run_training


@dataclass(frozen=True)
class QuickstartSize:
    train: int
    eval: int
    stage1_steps: int
    stage2_steps: int
    model: dict[str, Any]
    batch: int
    max_new_tokens: int


SIZES = {
    "fast": QuickstartSize(train=48, eval=6, stage1_steps=12, stage2_steps=8, batch=4, max_new_tokens=120,
                           model={"arch": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                                  "num_attention_heads": 4, "num_key_value_heads": 2}),
    "default": QuickstartSize(train=2000, eval=40, stage1_steps=700, stage2_steps=250, batch=8, max_new_tokens=900,
                              model={"arch": "llama", "hidden_size": 128, "intermediate_size": 384,
                                     "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2}),
}  # fmt: skip
TASK = SyntheticConfig(n_blocks=5, steps_per_block=2, n_vars=2, max_value=9, filler=1, modulus=10)


def _config(output: Path, data: Path, stage: int, size: QuickstartSize, seed: int) -> dict[str, Any]:
    return {
        "stage": stage,
        "seed": seed,
        "output_dir": str(output / f"stage{stage}"),
        "init_from": str(output / "stage1") if stage == 2 else None,
        "model": {"tiny": size.model, "attn_implementation": "sdpa", "dtype": "float32"},
        "data": {
            "train_files": [str(data)],
            "max_seq_len": 1024,
            "packing": True,
            "tokenizer_corpus_size": 384,
        },
        "retention": {"weight": 0.3, "teacher": "self"},
        "training": {
            "max_steps": size.stage1_steps if stage == 1 else size.stage2_steps,
            "per_device_train_batch_size": size.batch,
            "learning_rate": 2e-3 if stage == 1 else 5e-4,
            "lr_scheduler_type": "cosine",
            "warmup_steps": 0.05,
            "logging_steps": max(1, (size.stage1_steps if stage == 1 else size.stage2_steps) // 20),
            "save_strategy": "no",
            "report_to": "none",
            "use_cpu": True,
            "disable_tqdm": False,
        },
    }


def quickstart(output: str | Path = "outputs/quickstart", fast: bool = False, seed: int = 0,
               progress: bool = True) -> dict[str, Any]:  # fmt: skip
    size = SIZES["fast" if fast else "default"]
    output = Path(output)
    started = time.perf_counter()
    timings: dict[str, float] = {}

    def timed(name: str, fn, *args, **kwargs):
        start = time.perf_counter()
        result = fn(*args, **kwargs)
        timings[name] = round(time.perf_counter() - start, 1)
        return result

    task = SyntheticConfig(**{**TASK.__dict__, "seed": seed})
    held_out = SyntheticConfig(**{**TASK.__dict__, "seed": seed + 1000})
    timed(
        "data",
        run_build,
        synthetic_samples(size.train, task),
        output / "data" / "train",
        BuildConfig(),
        progress,
    )
    run_build(synthetic_samples(size.eval, held_out), output / "data" / "eval", BuildConfig(), progress)
    train_file = output / "data" / "train" / "samples.jsonl"
    stage1 = timed("stage1", run_training, config_from_dict(_config(output, train_file, 1, size, seed)))
    stage2 = timed("stage2", run_training, config_from_dict(_config(output, train_file, 2, size, seed)))
    summary = timed("eval", evaluate, output / "stage2", output / "data" / "eval" / "samples.jsonl",
                    ["full", "memento", "restart"], output / "eval", max_new_tokens=size.max_new_tokens,
                    batch_size=20, progress=progress)  # fmt: skip
    modes = summary["modes"]
    full, memento, restart = modes["full"], modes["memento"], modes["restart"]
    report = {
        "modes": modes,
        "targets": {
            "memento_accuracy_within_5pp_of_full": abs(memento["accuracy"] - full["accuracy"]) <= 0.05,
            "peak_kv_ratio_memento_over_full": memento["peak_kv_tokens"] / max(full["peak_kv_tokens"], 1),
            "restart_accuracy_drop": memento["accuracy"] - restart["accuracy"],
        },
        "training": {"stage1": stage1["log"], "stage2": stage2["log"], "data": stage2["data"]},
        "config": {
            "size": "fast" if fast else "default",
            "task": task.__dict__,
            "model": size.model,
            "stage1_steps": size.stage1_steps,
            "stage2_steps": size.stage2_steps,
            "train_samples": size.train,
            "eval_samples": size.eval,
            "seed": seed,
        },
        "seconds": {**timings, "total": round(time.perf_counter() - started, 1)},
        "plots": [str(output / "eval" / "kv_curve.png"), str(output / "eval" / "modes.png")],
    }
    (output / "report.json").write_text(json.dumps(report, indent=2))
    return report


def print_report(report: dict[str, Any]) -> None:
    print("\n" + modes_table(report["modes"]))
    t = report["targets"]
    stage1, stage2 = report["training"]["stage1"], report["training"]["stage2"]
    print(
        f"\npeak KV memento/full = {t['peak_kv_ratio_memento_over_full']:.2f} (target <= 0.5); "
        f"memento within 5 pp of full: {t['memento_accuracy_within_5pp_of_full']}; "
        f"restart drop = {t['restart_accuracy_drop']:+.3f}"
    )
    if stage1 and stage2:
        print(
            f"training loss: stage 1 {stage1[0]['loss']:.3f} -> {stage1[-1]['loss']:.3f}, "
            f"stage 2 {stage2[0]['loss']:.3f} -> {stage2[-1]['loss']:.3f}; {report['seconds']['total']:.0f} s in all"
        )
