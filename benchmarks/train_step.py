"""Training-step throughput, packing efficiency and mask memory.

    python benchmarks/train_step.py [--seq-len 2048] [--steps 5]

1. tokens/s of one optimizer step (forward, backward, AdamW) in stage 1 (causal + document mask),
   stage 2 (memento mask) and stage 2 + retention (an extra no-grad teacher forward), on CPU with a
   tiny Llama, rows of `--seq-len` tokens packed from synthetic memento samples.
2. real-token fraction with and without packing for OpenMementos-shaped sample lengths (goal ≥ 95%
   with packing).
3. bytes of the attention-mask objects: the dense bool mask (SDPA on CPU), a dense float additive
   mask (what eager, or a float-mask trainer, holds) and the FlexAttention BlockMask.
4. with a CUDA device: stage-2 step time with FlexAttention (BlockMask) vs SDPA with a dense mask
   at 4K and 16K tokens (goal: flex ≤ 0.6× dense at 16K). Skipped, and said so, without one.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from data_builders.synthetic import SyntheticConfig, synthetic_samples
from memento_train.config import config_from_dict
from memento_train.data import MementoCollator, best_fit_decreasing, packed_rows, tokenized_dataset
from memento_train.masking import MaskPolicy, block_mask, dense_mask
from memento_train.train import build_trainer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mask_memory import TOK, openmementos_row  # the same OpenMementos-shaped rows as that benchmark

MODEL = {"arch": "llama", "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
         "num_attention_heads": 8, "num_key_value_heads": 4}  # fmt: skip


def _config(tmp: Path, data: Path, seq_len: int, stage: int, weight: float, attn: str = "sdpa"):
    return config_from_dict({
        "stage": stage, "output_dir": str(tmp / f"s{stage}"),
        "model": {"tiny": MODEL, "attn_implementation": attn, "dtype": "float32"},
        "data": {"train_files": [str(data)], "max_seq_len": seq_len, "tokenizer_corpus_size": 512},
        "retention": {"weight": weight},
        "training": {"report_to": "none", "use_cpu": not torch.cuda.is_available()},
    })  # fmt: skip


def _samples(path: Path, n: int) -> Path:
    config = SyntheticConfig(n_blocks=4, steps_per_block=2, filler=1)
    with path.open("w") as handle:
        for sample in synthetic_samples(n, config):
            handle.write(json.dumps({"id": sample.meta["id"], **sample.to_dict()}) + "\n")
    return path


def step_throughput(seq_len: int, steps: int) -> list[tuple[str, float, float]]:
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data = _samples(tmp / "data.jsonl", 64)
        for name, stage, weight in (
            ("stage 1", 1, 0.0),
            ("stage 2", 2, 0.0),
            ("stage 2 + retention", 2, 0.3),
        ):
            trainer, _ = build_trainer(_config(tmp, data, seq_len, stage, weight))
            rows, _ = packed_rows(tokenized_dataset([str(data)], trainer.processing_class), seq_len, True)
            row = max(rows, key=lambda r: len(r["input_ids"]))
            batch = MementoCollator(trainer.processing_class.pad_token_id, fixed_length=seq_len)([row])
            model = trainer.model.train()
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            times = []
            for i in range(steps + 1):
                start = time.perf_counter()
                loss = trainer.compute_loss(model, batch)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                if i:  # the first step warms up allocators and kernels
                    times.append(time.perf_counter() - start)
            real = sum(1 for d in row["document_ids"])
            results.append((name, real / statistics.median(times), len(set(row["document_ids"]))))
    return results


def openmementos_lengths(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)

    def normal(mean, std, low):
        return max(low, int(rng.gauss(mean, std)))

    lengths = []
    for _ in range(n):
        blocks = normal(9, 2, 2)
        total = normal(150, 50, 20) + 2 + normal(300, 100, 20)
        total += sum(normal(1150, 350, 200) + normal(194, 60, 30) + 4 for _ in range(blocks))
        lengths.append(total)
    return lengths


def packing_table(max_len: int, n: int = 2000, batch: int = 8) -> tuple[float, float, float, int]:
    lengths = [x for x in openmementos_lengths(n) if x <= max_len]
    rows = best_fit_decreasing(lengths, max_len)
    packed = sum(lengths) / (len(rows) * max_len)
    to_max = sum(lengths) / (len(lengths) * max_len)
    random.Random(1).shuffle(lengths)
    batches = [lengths[i : i + batch] for i in range(0, len(lengths), batch)]
    to_batch_max = sum(lengths) / sum(max(b) * len(b) for b in batches)
    return packed, to_max, to_batch_max, len(lengths)


def mask_bytes(seq_len: int) -> tuple[int, int, int]:
    ids, docs = openmementos_row(seq_len)
    ids, docs = ids[None], docs[None]
    dense = dense_mask(ids, TOK, MaskPolicy(), docs)
    bool_bytes = dense.numel() * dense.element_size()
    float_bytes = (
        dense.numel() * torch.finfo(torch.float32).bits // 8
    )  # additive_mask(dense), not materialized
    bm = block_mask(ids, TOK, MaskPolicy(), docs)
    tensors = [bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks, bm.full_kv_indices,
               bm.q_num_blocks, bm.q_indices, bm.full_q_num_blocks, bm.full_q_indices]  # fmt: skip
    return bool_bytes, float_bytes, sum(t.numel() * t.element_size() for t in tensors) + seq_len * 4


def gpu_flex_vs_dense(steps: int = 5) -> list[str]:
    if not torch.cuda.is_available():
        return ["no CUDA device here: flex vs dense stage-2 steps at 4K and 16K not measured"]
    from transformers import LlamaConfig, LlamaForCausalLM

    lines = [
        "| S | dense SDPA step | flex step | flex / dense | dense peak GiB | flex peak GiB |",
        "|---|---|---|---|---|---|",
    ]
    config = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                         num_attention_heads=16, num_key_value_heads=8, max_position_embeddings=32768)  # fmt: skip
    for seq_len in (4096, 16384):
        ids, docs = openmementos_row(seq_len)
        ids, docs = ids[None].cuda(), docs[None].cuda()
        result = {}
        for attn in ("sdpa", "flex_attention"):
            config._attn_implementation = attn
            model = LlamaForCausalLM(config).cuda().to(torch.bfloat16)
            mask = (block_mask(ids, TOK, MaskPolicy(), docs, device="cuda") if attn == "flex_attention"
                    else dense_mask(ids.cpu(), TOK, MaskPolicy(), docs.cpu())[:, None].cuda())  # fmt: skip
            torch.cuda.reset_peak_memory_stats()
            times = []
            for i in range(steps + 1):
                torch.cuda.synchronize()
                start = time.perf_counter()
                out = model(input_ids=ids, attention_mask=mask, labels=ids)
                out.loss.backward()
                torch.cuda.synchronize()
                if i:
                    times.append(time.perf_counter() - start)
            result[attn] = (statistics.median(times), torch.cuda.max_memory_allocated() / 2**30)
            del model, mask
            torch.cuda.empty_cache()
        dense, flex = result["sdpa"], result["flex_attention"]
        lines.append(
            f"| {seq_len:,} | {dense[0] * 1e3:.0f} ms | {flex[0] * 1e3:.0f} ms | {flex[0] / dense[0]:.2f} "
            f"| {dense[1]:.1f} | {flex[1]:.1f} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; tiny Llama {MODEL}")
    print(
        f"\n| step (S = {args.seq_len:,}, packed, batch 1) | tokens/s | documents in the row | vs stage 1 |"
    )
    print("|---|---|---|---|")
    results = step_throughput(args.seq_len, args.steps)
    for name, tps, docs in results:
        print(f"| {name} | {tps:,.0f} | {docs} | {tps / results[0][1]:.2f} |")
    print(
        "\n| OpenMementos-shaped lengths, max_seq_len | samples that fit | real tokens, packed (BFD) | padded to max_seq_len | padded to batch max (8) |"
    )
    print("|---|---|---|---|---|")
    for max_len in (16384, 32768):
        packed, to_max, to_batch, n = packing_table(max_len)
        print(f"| {max_len:,} | {n} | {packed:.1%} | {to_max:.1%} | {to_batch:.1%} |")
    print(
        "\n| S | dense bool mask (SDPA) | dense float mask | BlockMask (+ mask_mod tensor) | float / bool | bool / BlockMask |"
    )
    print("|---|---|---|---|---|---|")
    for seq_len in (2048, 8192, 32768):
        b, f, bm = mask_bytes(seq_len)
        print(
            f"| {seq_len:,} | {b / 2**20:,.1f} MiB | {f / 2**20:,.1f} MiB | {bm / 2**20:,.2f} MiB | {f / b:.0f}x | {b / bm:,.0f}x |"
        )
    print()
    for line in gpu_flex_vs_dense():
        print(line)


if __name__ == "__main__":
    main()
