"""Memory and build time of the memento mask: dense bool (SDPA) vs FlexAttention BlockMask.

Layout shaped like OpenMementos (design.md §1): per document a ~150-token prompt, ~9 blocks of
~1,150 tokens each closed by a ~194-token memento, a ~300-token answer; documents packed
back to back into one row of S tokens (the last one cut off, its open block never expires).

    python benchmarks/mask_memory.py [--sizes 4096 16384 32768] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.nn.attention.flex_attention import create_block_mask

from memento_train.format import MementoTokens
from memento_train.masking import (
    MaskPolicy,
    block_mask_from_expiry,
    dense_mask_from_expiry,
    expiry,
    mask_mod,
    visible_until,
)

TOK = MementoTokens(block_start=1, block_end=2, summary_start=3, summary_end=4, think_start=5, think_end=6)


def openmementos_row(size: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)

    def normal(mean: float, std: float, low: int) -> int:
        return max(low, int(mean + std * torch.randn((), generator=gen).item()))

    ids: list[int] = []
    docs: list[int] = []
    doc = 0
    while len(ids) < size:
        seq = [7] * normal(150, 50, 20) + [TOK.think_start]
        for _ in range(normal(9, 2, 2)):
            seq += [TOK.block_start] + [8] * normal(1150, 350, 200) + [TOK.block_end]
            seq += [TOK.summary_start] + [9] * normal(194, 60, 30) + [TOK.summary_end]
        seq += [TOK.think_end] + [10] * normal(300, 100, 20)
        ids += seq
        docs += [doc] * len(seq)
        doc += 1
    return torch.tensor(ids[:size]), torch.tensor(docs[:size])


def tensor_bytes(*tensors: torch.Tensor | None) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def timed(fn, repeats: int):
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return out, statistics.median(times)


def measure(size: int, repeats: int, block: int = 128) -> dict[str, float]:
    ids, docs = openmementos_row(size)
    ids, docs = ids[None], docs[None]
    policy = MaskPolicy()
    exp, t_expiry = timed(lambda: expiry(ids, TOK, policy, docs), repeats)
    bm, t_block = timed(lambda: block_mask_from_expiry(exp, docs, "cpu", block), repeats)
    dense, t_dense = timed(lambda: dense_mask_from_expiry(exp, docs), 1)
    reference, t_reference = timed(
        lambda: create_block_mask(
            mask_mod(exp, docs, block), 1, None, size, size, device="cpu", BLOCK_SIZE=block
        ),
        1,
    )
    same = all(
        torch.equal(getattr(bm, name), getattr(reference, name))
        for name in ("kv_num_blocks", "full_kv_num_blocks", "q_num_blocks", "full_q_num_blocks")
    ) and torch.equal(bm.to_dense(), reference.to_dense())
    tiles = bm.kv_num_blocks.shape[-1]
    computed = int(bm.kv_num_blocks.sum() + bm.full_kv_num_blocks.sum())
    until = visible_until(exp, docs)
    block_bytes = tensor_bytes(
        bm.kv_num_blocks,
        bm.kv_indices,
        bm.full_kv_num_blocks,
        bm.full_kv_indices,
        bm.q_num_blocks,
        bm.q_indices,
        bm.full_q_num_blocks,
        bm.full_q_indices,
    )
    mod_bytes = -(-size // block) * block * until.element_size()  # the padded tensor mask_mod closes over
    visible = int(dense.sum())
    causal = size * (size + 1) // 2
    result = {
        "S": size,
        "docs": int(docs.max()) + 1,
        "dense_bytes": tensor_bytes(dense),
        "block_bytes": block_bytes,
        "mod_bytes": mod_bytes,
        "ratio": tensor_bytes(dense) / block_bytes,
        "ratio_with_mod": tensor_bytes(dense) / (block_bytes + mod_bytes),
        "t_expiry": t_expiry,
        "t_block": t_block,
        "t_build": t_expiry + t_block,
        "t_dense": t_expiry + t_dense,
        "t_reference": t_expiry + t_reference,
        "same": same,
        "tiles_computed": computed / (tiles * tiles),
        "tiles_computed_vs_causal": computed / (tiles * (tiles + 1) / 2),
        "visible_pairs": visible / size**2,
        "visible_vs_causal": visible / causal,
    }
    del dense
    return result


def mib(n: int) -> str:
    return f"{n / 2**20:,.2f} MiB"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096, 16384, 32768])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, tile 128x128, one packed row, "
        "policy: default (keep_last_n_blocks=0)"
    )
    header = (
        "| S | docs | dense bool | BlockMask | ratio | + mask_mod tensor | ratio incl. | build (expiry+tiles) "
        "| dense build | create_block_mask (equal?) | tiles computed (of all / of causal) | visible pairs (of all / of causal) |"
    )
    print(header)
    print("|---" * (header.count("|") - 1) + "|")
    for size in args.sizes:
        r = measure(size, args.repeats)
        print(
            f"| {r['S']:,} | {r['docs']} | {mib(r['dense_bytes'])} | {mib(r['block_bytes'])} | {r['ratio']:,.0f}x "
            f"| {mib(r['mod_bytes'])} | {r['ratio_with_mod']:,.0f}x "
            f"| {r['t_build'] * 1e3:,.0f} ms ({r['t_expiry'] * 1e3:,.0f}+{r['t_block'] * 1e3:,.0f}) "
            f"| {r['t_dense'] * 1e3:,.0f} ms | {r['t_reference'] * 1e3:,.0f} ms ({'yes' if r['same'] else 'NO'}) "
            f"| {r['tiles_computed']:.3f} / {r['tiles_computed_vs_causal']:.3f} "
            f"| {r['visible_pairs']:.3f} / {r['visible_vs_causal']:.3f} |"
        )


if __name__ == "__main__":
    main()
