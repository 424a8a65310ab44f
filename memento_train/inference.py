"""Decoding with KV eviction that follows the training rule token by token.

Each row keeps its cached entries with their logical (RoPE) positions and expiries. Tokens are fed
to the same `ExpiryTracker` the training masks come from; before a query at position p is computed,
every cached key whose expiry is <= p is dropped from the cache (physically: the cache tensors are
compacted), and positions are passed explicitly, so RoPE sees the original positions with gaps.

Modes: `full` (no eviction: plain causal decoding), `memento` (the policy), `restart` (the paper's
dual-stream ablation: whenever a memento closes, the surviving entries are recomputed from their
tokens alone, so no cached KV carries an evicted block any more).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from .format import MementoTokens
from .masking import NEVER, ExpiryTracker, MaskPolicy

MODES = ("full", "memento", "restart")


@dataclass
class KVStats:
    """Per-row KV lengths per decoding step, and what they cost."""

    lengths: list[list[int]] = field(default_factory=list)  # [row][step] entries attended at that step
    seconds: float = 0.0
    evict_seconds: float = 0.0
    evicted: int = 0  # cache entries dropped
    new_tokens: int = 0

    def peak(self, row: int = 0) -> int:
        return max(self.lengths[row], default=0)

    def auc(self, row: int = 0) -> int:
        return sum(self.lengths[row])

    def kv_bytes(self, tokens: int, config: Any, dtype: torch.dtype = torch.float32) -> int:
        """layers × kv_heads × head_dim × 2 (K and V) × dtype size, per cached token."""
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return tokens * config.num_hidden_layers * heads * head_dim * 2 * torch.finfo(dtype).bits // 8


class EvictingDecoder:
    """Incremental forward passes over a batch with per-row eviction and compaction."""

    def __init__(self, model: Any, tokens: MementoTokens, policy: MaskPolicy | None = None, mode: str = "memento",
                 batch_size: int = 1, pad_token_id: int = 0):  # fmt: skip
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        from transformers import DynamicCache

        self.model, self.tokens, self.mode = model, tokens, mode
        self.policy = policy or MaskPolicy()
        self.pad = pad_token_id
        self.batch = batch_size
        self.cache = DynamicCache()
        self.trackers = [ExpiryTracker(tokens, self.policy) for _ in range(batch_size)]
        self.next_pos = torch.zeros(batch_size, dtype=torch.long)
        device = next(model.parameters()).device
        self.device = device
        self.slot_pos = torch.empty(batch_size, 0, dtype=torch.long, device=device)  # -1: dead slot
        self.slot_exp = torch.empty(batch_size, 0, dtype=torch.long, device=device)  # 0: dead slot
        self.slot_tok = torch.empty(batch_size, 0, dtype=torch.long, device=device)
        self.stats = KVStats(lengths=[[] for _ in range(batch_size)])
        self._backend = getattr(model.config, "_attn_implementation", "sdpa")
        if self._backend not in ("sdpa", "eager"):
            raise ValueError(f"decoding with eviction needs sdpa or eager attention, not {self._backend!r}")

    # -- cache surgery -------------------------------------------------------------------------
    def _live(self, threshold: torch.Tensor) -> torch.Tensor:
        """Slots still visible to queries after position `threshold` (per row)."""
        return (self.slot_exp > threshold[:, None].to(self.device)) & (self.slot_pos >= 0)

    def _compact(self, keep: torch.Tensor) -> None:
        if keep.all():
            return
        start = time.perf_counter()
        self.stats.evicted += int((~keep & (self.slot_pos >= 0)).sum())
        counts = keep.sum(1)
        width = int(counts.max()) if counts.numel() else 0
        order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)[
            :, :width
        ]  # live slots first, in order
        valid = torch.arange(width, device=self.device)[None, :] < counts[:, None]
        for layer in self.cache.layers:
            index = order[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
            layer.keys = layer.keys.gather(2, index)
            layer.values = layer.values.gather(2, index)
        self.slot_pos = torch.where(valid, self.slot_pos.gather(1, order), -1)
        self.slot_exp = torch.where(valid, self.slot_exp.gather(1, order), 0)
        self.slot_tok = torch.where(valid, self.slot_tok.gather(1, order), self.pad)
        self.stats.evict_seconds += time.perf_counter() - start

    def _mask(self, key_pos, key_exp, q_pos, q_valid, dtype):
        visible = (key_pos[:, None, :] >= 0) & (key_pos[:, None, :] <= q_pos[:, :, None])
        visible &= q_pos[:, :, None] < key_exp[:, None, :]
        # padding queries attend to themselves only (their outputs are discarded)
        n = q_pos.shape[1]
        own = torch.zeros_like(visible)
        own[:, :, -n:] = torch.eye(n, dtype=torch.bool, device=visible.device)
        visible = torch.where(q_valid[:, :, None], visible, own)
        visible = visible[:, None]
        if self._backend == "eager":
            return torch.where(
                visible, torch.zeros((), dtype=dtype, device=visible.device), torch.finfo(dtype).min
            )
        return visible

    # -- one forward ---------------------------------------------------------------------------
    def step(self, ids: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """Feed [B, n] new tokens (right-aligned; `valid` False marks left padding); returns logits [B, n, V]."""
        start = time.perf_counter()
        ids = ids.to(self.device)
        batch, n = ids.shape
        valid = torch.ones_like(ids, dtype=torch.bool) if valid is None else valid.to(self.device)
        new_pos = torch.full((batch, n), -1, dtype=torch.long)
        new_exp = torch.zeros(batch, n, dtype=torch.long)
        closed = False
        for b in range(batch):
            for j in range(n):
                if not valid[b, j]:
                    continue
                p = int(self.next_pos[b])
                new_pos[b, j], new_exp[b, j] = p, NEVER
                self.next_pos[b] += 1
                if self.mode == "full":
                    continue
                for lo, hi, exp in self.trackers[b].feed(int(ids[b, j])):
                    closed = True
                    self.slot_exp[b] = torch.where((self.slot_pos[b] >= lo) & (self.slot_pos[b] < hi), exp,
                                                   self.slot_exp[b])  # fmt: skip
                    in_chunk = (new_pos[b] >= lo) & (new_pos[b] < hi)
                    new_exp[b] = torch.where(in_chunk, exp, new_exp[b])
        new_pos, new_exp = new_pos.to(self.device), new_exp.to(self.device)
        # Before the first new query p of each row: drop every key with expiry <= p.
        first = torch.where(valid, new_pos, self.next_pos.to(self.device)[:, None]).min(1).values
        self._compact(self._live(first))
        key_pos = torch.cat([self.slot_pos, new_pos], 1)
        key_exp = torch.cat([self.slot_exp, torch.where(valid, new_exp, 0)], 1)
        dtype = next(self.model.parameters()).dtype
        mask = self._mask(key_pos, key_exp, new_pos, valid, dtype)
        with torch.no_grad():
            out = self.model(input_ids=torch.where(valid, ids, self.pad), attention_mask=mask,
                             position_ids=new_pos.clamp_min(0), cache=self.cache, use_cache=True)  # fmt: skip
        self.cache = out.cache
        attended = mask[:, 0, -1].sum(-1) if mask.dtype == torch.bool else (mask[:, 0, -1] == 0).sum(-1)
        self.slot_pos = torch.cat([self.slot_pos, new_pos], 1)
        self.slot_exp = torch.cat([self.slot_exp, torch.where(valid, new_exp, 0)], 1)
        self.slot_tok = torch.cat([self.slot_tok, torch.where(valid, ids, self.pad)], 1)
        self._compact(self._live(self.next_pos.to(self.device) - 1))
        if closed and self.mode == "restart":
            self._restart()
        for b in range(batch):
            self.stats.lengths[b].append(int(attended[b]))
        self.stats.seconds += time.perf_counter() - start
        return out.logits

    def _restart(self) -> None:
        """Recompute every surviving entry from its token alone (causal among survivors, original
        positions), so that no cached KV carries what an evicted block contributed."""
        from transformers import DynamicCache

        start = time.perf_counter()
        live = self.slot_pos >= 0
        q = self.slot_pos
        mask = live[:, None, :] & live[:, :, None] & (q[:, None, :] <= q[:, :, None])
        mask |= torch.eye(q.shape[1], dtype=torch.bool, device=self.device)[None]
        dtype = next(self.model.parameters()).dtype
        mask = mask[:, None]
        if self._backend == "eager":
            mask = torch.where(mask, torch.zeros((), dtype=dtype, device=self.device), torch.finfo(dtype).min)
        self.cache = DynamicCache()
        with torch.no_grad():
            out = self.model(input_ids=self.slot_tok, attention_mask=mask, position_ids=q.clamp_min(0),
                             cache=self.cache, use_cache=True)  # fmt: skip
        self.cache = out.cache
        self.stats.evict_seconds += time.perf_counter() - start


def teacher_forced_logits(model: Any, tokens: MementoTokens, ids: torch.Tensor, policy: MaskPolicy | None = None,
                          mode: str = "memento", prefill: int = 1, lengths: list[int] | None = None,
                          pad_token_id: int = 0) -> tuple[torch.Tensor, KVStats]:  # fmt: skip
    """Logits [B, S, V] for known sequences, computed the way generation computes them: a prefill of
    `prefill` tokens, then one token per step with eviction. Rows of different `lengths` are
    left-padded, so each row evicts at its own positions."""
    batch, size = ids.shape
    lengths = lengths or [size] * batch
    decoder = EvictingDecoder(model, tokens, policy, mode, batch, pad_token_id)
    starts = [size - n for n in lengths]  # left padding
    cols = torch.arange(size)[None, :]
    valid = cols >= torch.tensor(starts)[:, None]
    first = min(starts) + prefill
    pieces = [decoder.step(ids[:, :first], valid[:, :first])]
    for t in range(first, size):
        pieces.append(decoder.step(ids[:, t : t + 1], valid[:, t : t + 1]))
    return torch.cat(pieces, 1), decoder.stats


def _open_block_length(ids: list[int], tokens: MementoTokens) -> int:
    starts = [i for i, t in enumerate(ids) if t == tokens.block_start]
    ends = [i for i, t in enumerate(ids) if t == tokens.block_end]
    if not starts or (ends and ends[-1] > starts[-1]):
        return -1
    return len(ids) - starts[-1] - 1


@dataclass
class Generation:
    ids: list[list[int]]  # generated tokens per row (prompt excluded)
    stats: KVStats
    forced_block_ends: list[int]


def generate(model: Any, tokens: MementoTokens, prompts: list[list[int]], policy: MaskPolicy | None = None,
             mode: str = "memento", max_new_tokens: int = 256, eos_token_ids: tuple[int, ...] = (),
             max_block_tokens: int | None = None, pad_token_id: int = 0) -> Generation:  # fmt: skip
    """Greedy decoding of a batch with eviction. `max_block_tokens` forces <|block_end|> after that
    many tokens inside a block; `max_new_tokens` caps the total."""
    batch = len(prompts)
    width = max(len(p) for p in prompts)
    ids = torch.full((batch, width), pad_token_id, dtype=torch.long)
    valid = torch.zeros(batch, width, dtype=torch.bool)
    for b, prompt in enumerate(prompts):
        ids[b, width - len(prompt) :] = torch.tensor(prompt)
        valid[b, width - len(prompt) :] = True
    decoder = EvictingDecoder(model, tokens, policy, mode, batch, pad_token_id)
    logits = decoder.step(ids, valid)[:, -1]
    out: list[list[int]] = [[] for _ in range(batch)]
    done = [False] * batch
    in_block = [_open_block_length(p, tokens) for p in prompts]  # tokens inside the open block, -1 if none
    forced = [0] * batch
    for _ in range(max_new_tokens):
        next_ids = logits.argmax(-1)
        for b in range(batch):
            if max_block_tokens is not None and in_block[b] >= max_block_tokens and not done[b]:
                next_ids[b] = tokens.block_end
                forced[b] += 1
        step_valid = torch.tensor([not d for d in done])
        for b in range(batch):
            if done[b]:
                continue
            token = int(next_ids[b])
            out[b].append(token)
            if token == tokens.block_start:
                in_block[b] = 0
            elif token == tokens.block_end:
                in_block[b] = -1
            elif in_block[b] >= 0:
                in_block[b] += 1
            if token in eos_token_ids:
                done[b] = True
        decoder.stats.new_tokens += int(step_valid.sum())
        if all(done):
            break
        logits = decoder.step(next_ids[:, None], step_valid[:, None])[:, -1]
    return Generation(out, decoder.stats, forced)


class EvictingCache:
    """For `model.generate()` at batch size 1: a DynamicCache whose layers drop expired entries.

    Use through `generate_hf()`. A stopping criterion feeds each new token to the expiry tracker
    (it runs after the token is chosen, before its forward); the keys that expire at that token's
    position are dropped at the next cache update, before its query is computed. generate() derives
    positions from its all-ones 2D attention mask, so RoPE keeps the original positions.
    """

    def __new__(cls, tokens: MementoTokens, policy: MaskPolicy | None = None):
        from transformers import DynamicCache

        class _EvictingCache(DynamicCache):
            def update(self, key_states, value_states, layer_idx, *args, **kwargs):
                keep = self.pending_keep
                if (
                    keep is not None
                    and layer_idx < len(self.layers)
                    and self.layers[layer_idx].is_initialized
                ):
                    start = time.perf_counter()
                    layer = self.layers[layer_idx]
                    layer.keys, layer.values = layer.keys[:, :, keep], layer.values[:, :, keep]
                    if layer_idx == 0:
                        flags = keep.tolist()
                        self.slot_pos = [p for p, k in zip(self.slot_pos, flags, strict=True) if k]
                        self.slot_exp = [e for e, k in zip(self.slot_exp, flags, strict=True) if k]
                    if layer_idx == len(self.layers) - 1:
                        self.pending_keep = None
                    self.evict_seconds += time.perf_counter() - start
                if layer_idx == 0:
                    n = key_states.shape[-2]
                    self.slot_pos += list(range(self.next_pos, self.next_pos + n))
                    self.slot_exp += [NEVER] * n
                    self.next_pos += n
                    self.lengths.append(len(self.slot_pos))
                return super().update(key_states, value_states, layer_idx, *args, **kwargs)

        cache = _EvictingCache()
        cache.tracker = ExpiryTracker(tokens, policy or MaskPolicy())
        cache.slot_pos, cache.slot_exp, cache.next_pos = [], [], 0
        cache.pending_keep, cache.fed, cache.evict_seconds = None, 0, 0.0
        cache.lengths = []
        return cache


def _feed(cache: Any, token_ids: list[int]) -> None:
    """Feed tokens to the cache's tracker; schedule dropping keys whose expiry is <= the last one fed."""
    for token in token_ids:
        for lo, hi, exp in cache.tracker.feed(token):
            cache.slot_exp = [
                exp if lo <= p < hi else e for p, e in zip(cache.slot_pos, cache.slot_exp, strict=True)
            ]
        cache.fed += 1
    now = cache.fed - 1  # position of the last token fed: its query must not see keys expiring there
    keep = torch.tensor([e > now for e in cache.slot_exp], dtype=torch.bool)
    if not keep.all():
        cache.pending_keep = keep


def generate_hf(model: Any, tokens: MementoTokens, prompt_ids: list[int], policy: MaskPolicy | None = None,
                max_new_tokens: int = 256, **generate_kwargs) -> tuple[Any, Any]:  # fmt: skip
    """`model.generate()` with eviction, at batch size 1. Returns (generate's output, the cache)."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    probe = ExpiryTracker(tokens, policy or MaskPolicy())
    if any(probe.feed(t) for t in prompt_ids):
        raise ValueError(
            "generate_hf prefills the prompt with causal attention: the prompt must not close a "
            "memento (use EvictingDecoder / generate() for prompts that do)"
        )
    cache = EvictingCache(tokens, policy)
    _feed(cache, prompt_ids)

    class FeedTracker(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            _feed(cache, input_ids[0, cache.fed :].tolist())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    ids = torch.tensor([prompt_ids], device=next(model.parameters()).device)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), cache=cache,
                         max_new_tokens=max_new_tokens, stopping_criteria=StoppingCriteriaList([FeedTracker()]),
                         **generate_kwargs)  # fmt: skip
    return out, cache
