"""Choosing block boundaries: maximize mean(cut scores) − λ·CV(block token sizes).

Every block holds at least `min_block_tokens` (and at most `max_block_tokens`, if set); a score of
0 means "never cut here" (inside a calculation, after ":"), unless no segmentation exists otherwise.

For a fixed number of blocks m the objective trades the cut-score sum against the sum of squared
block sizes. `segment` solves the Lagrangian ``max Σscore − μ·Σsize²`` for a grid of μ by one
dynamic program over (blocks, position) that serves every m at once, then scores each candidate
with the exact objective. That finds every optimum on the convex hull of the (score, Σsize²)
trade-off; `segment_brute_force` is the exact reference, and the tests and the benchmark report
how often and by how much the two differ.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

LAMBDA = 0.5
MU_GRID = (0.0, 0.3, 3.0, 30.0, 1000.0)
NU_GRID = (-1.0, 0.0, 1.0, 2.0, 2.5, 3.5)


@dataclass(frozen=True)
class Segmentation:
    cuts: tuple[int, ...]  # sentence indices that start a new block (0 < cut < n)
    objective: float


def objective(cuts: tuple[int, ...], sizes: list[int], scores: list[int], lam: float = LAMBDA) -> float:
    """mean(score of each cut) − λ·CV(block sizes); one block scores 0."""
    if not cuts:
        return 0.0
    bounds = [0, *cuts, len(sizes)]
    blocks = [sum(sizes[a:b]) for a, b in itertools.pairwise(bounds)]
    mean = sum(blocks) / len(blocks)
    std = math.sqrt(sum((b - mean) ** 2 for b in blocks) / len(blocks))
    return sum(scores[c - 1] for c in cuts) / len(cuts) - lam * (std / mean if mean else 0.0)


def _valid(cuts, prefix, min_tokens, max_tokens) -> bool:
    bounds = [0, *cuts, len(prefix) - 1]
    for a, b in itertools.pairwise(bounds):
        size = prefix[b] - prefix[a]
        if size < min_tokens or (max_tokens is not None and size > max_tokens):
            return False
    return True


def segment_brute_force(
    sizes: list[int],
    scores: list[int],
    min_tokens: int = 200,
    max_tokens: int | None = None,
    lam: float = LAMBDA,
) -> Segmentation | None:
    """The exact optimum by enumeration (2^(n-1) candidates; small inputs only)."""
    n = len(sizes)
    prefix = [0, *itertools.accumulate(sizes)]
    best: Segmentation | None = None
    for allow_zero in (False, True):
        positions = [j for j in range(1, n) if allow_zero or scores[j - 1] > 0]
        for r in range(len(positions) + 1):
            for cuts in itertools.combinations(positions, r):
                if _valid(cuts, prefix, min_tokens, max_tokens):
                    value = objective(cuts, sizes, scores, lam)
                    if best is None or value > best.objective + 1e-12:
                        best = Segmentation(cuts, value)
        if best is not None:
            return best
    return None


def segment(
    sizes: list[int],
    scores: list[int],
    min_tokens: int = 200,
    max_tokens: int | None = None,
    lam: float = LAMBDA,
    mu_grid: tuple[float, ...] = MU_GRID,
) -> Segmentation | None:
    """Best segmentation found on the Lagrangian hull; None when no segmentation satisfies the
    size limits (a trace shorter than `min_tokens`, or a sentence longer than `max_tokens`)."""
    n = len(sizes)
    if len(scores) != max(n - 1, 0):
        raise ValueError(f"{n} sentences need {max(n - 1, 0)} boundary scores, got {len(scores)}")
    if n == 0:
        return None
    for allow_zero in (False, True):
        found = _lagrangian(sizes, scores, min_tokens, max_tokens, lam, mu_grid, allow_zero)
        if found is not None:
            return found
    return None


def _lagrangian(sizes, scores, min_tokens, max_tokens, lam, mu_grid, allow_zero) -> Segmentation | None:
    n = len(sizes)
    prefix = np.concatenate([[0], np.cumsum(sizes)]).astype(np.float64)
    total = max(prefix[-1], 1.0)
    nodes = np.array([0, *[j for j in range(1, n) if allow_zero or scores[j - 1] > 0], n])
    at = prefix[nodes]
    gain = np.array([0.0, *[scores[j - 1] for j in nodes[1:-1]], 0.0])
    # Valid predecessors of node t form one contiguous range: min <= at[t] - at[f] <= max.
    hi = np.searchsorted(at, at - min_tokens, side="right") - 1
    lo = np.searchsorted(at, at - max_tokens, side="left") if max_tokens is not None else np.zeros_like(hi)
    # Grid over (ν, μ): maximize Σ(score − ν) − μ·Σ(size/T)², one DP for every block count at once.
    nus, mus = np.meshgrid(np.array(NU_GRID), np.array(mu_grid), indexing="ij")
    nus, mus = nus.reshape(-1, 1), mus.reshape(-1, 1)
    rows = np.arange(nus.shape[0])
    cut_value = gain[None, :] - nus  # [G, nodes]
    cut_value[:, 0] = 0.0  # the start is not a cut
    # reach[g, f] = best value of a segmentation ending with a cut at node f, that cut's value included
    reach = np.full((nus.shape[0], len(nodes)), -np.inf)
    reach[:, 0] = 0.0
    back = np.zeros((nus.shape[0], len(nodes)), dtype=np.int64)
    scale = mus / (total * total)
    squared = (at[:, None] - at[None, :]) ** 2  # [to, from] block size², computed once
    for t in range(1, len(nodes)):
        f_lo, f_hi = lo[t], min(hi[t], t - 1)
        if f_hi < f_lo:
            continue
        vals = reach[:, f_lo : f_hi + 1] - scale * squared[t, f_lo : f_hi + 1]
        arg = vals.argmax(axis=1)
        back[:, t] = arg + f_lo
        reach[:, t] = vals[rows, arg] + cut_value[:, t]
    last = len(nodes) - 1  # the end node: reachable means a valid segmentation exists
    candidates: set[tuple[int, ...]] = set()
    for g in np.nonzero(np.isfinite(reach[:, last]))[0]:
        cuts, node = [], last
        while node:
            node = back[g, node]
            if node:
                cuts.append(int(nodes[node]))
        candidates.add(tuple(reversed(cuts)))
    if not candidates:
        return None
    scored = [Segmentation(c, objective(c, sizes, scores, lam)) for c in candidates]
    return max(scored, key=lambda s: (s.objective, -len(s.cuts)))
