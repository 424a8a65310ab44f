"""The one visibility rule (design.md §2) and every mask object derived from it.

Each token gets an expiry: the first query index from which it is invisible. A query q may attend
a key k iff ``same_document(q, k) and k <= q and q < expiry[k]``. Training masks (dense bool for
SDPA, additive float for eager, FlexAttention BlockMask) and inference eviction all read the same
expiry tensor, produced by one state machine (`ExpiryTracker`) that inference also drives token by
token; that shared code is what makes the three agree by construction.

Indices are positions in the sequence (row) the ids came from, not RoPE positions: with packing,
RoPE restarts per document while expiries stay row indices.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .format import MementoTokens

NEVER: int = torch.iinfo(torch.int64).max
"""Expiry of a token that never becomes invisible (prompt, mementos, answer, unclosed blocks)."""

FLEX_BLOCK_SIZE = 128


class MaskBackendError(ValueError):
    """A mask object that a backend would silently misuse, or a backend that cannot express the rule."""


@dataclass(frozen=True)
class MaskPolicy:
    """Which finished blocks stay visible, and for how long."""

    keep_last_n_blocks: int = 0
    mask_delimiters: bool = False
    answer_sees_last_block: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.keep_last_n_blocks, bool) or not isinstance(self.keep_last_n_blocks, int):
            raise TypeError(f"keep_last_n_blocks must be an int, got {self.keep_last_n_blocks!r}")
        if self.keep_last_n_blocks < 0:
            raise ValueError(f"keep_last_n_blocks must be >= 0, got {self.keep_last_n_blocks}")
        for name in ("mask_delimiters", "answer_sees_last_block"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")


class ExpiryTracker:
    """The rule as a state machine over one document's token stream.

    `feed(token)` consumes the token at the next position and returns the expiries it decides,
    as ``(start, stop, expiry)`` ranges of earlier positions. A decided expiry is always the
    position of the token just fed (a ``<|summary_end|>``, or with `answer_sees_last_block` the
    next ``<|block_start|>``), so an evicting cache can drop those keys before computing this query.

    Malformed streams never raise: a block or memento that is not closed by the grammar simply
    never expires (the safe side: the model sees more, never less, than training showed it).
    """

    def __init__(self, tokens: MementoTokens, policy: MaskPolicy | None = None, start: int = 0):
        self.tokens = tokens
        self.policy = policy or MaskPolicy()
        self.pos = start  # position of the next token to feed
        self._open_block: int | None = None  # position of the open block's <|block_start|>
        self._blocks: list[tuple[int, int]] = []  # closed blocks: (block_start pos, block_end pos)
        self._memento_end: list[int | None] = []  # per closed block: position of its <|summary_end|>
        self._unsummarized: list[int] = []  # closed blocks without a memento (stack: last closed binds first)
        self._memento_of: int | None = None  # block index the open memento binds to (-1: binds to none)
        self._waiting: list[int] = []  # answer_sees_last_block: blocks to expire at the next <|block_start|>

    def _range(self, block: int, expiry: int) -> tuple[int, int, int]:
        start, end = self._blocks[block]
        if self.policy.mask_delimiters:
            return (start, end + 1, expiry)
        return (start + 1, end, expiry)

    def feed(self, token: int) -> list[tuple[int, int, int]]:
        p, t, tok = self.pos, token, self.tokens
        self.pos += 1
        decided: list[tuple[int, int, int]] = []
        if t == tok.block_start:
            decided = [self._range(b, p) for b in self._waiting]
            self._waiting = []
            self._open_block = p  # an already open block is abandoned: it never expires
            self._memento_of = None
        elif t == tok.block_end:
            if self._open_block is not None:
                self._blocks.append((self._open_block, p))
                self._memento_end.append(None)
                self._unsummarized.append(len(self._blocks) - 1)
                self._open_block = None
        elif t == tok.summary_start:
            self._memento_of = self._unsummarized.pop() if self._unsummarized else -1
        elif t == tok.summary_end:
            owner, self._memento_of = self._memento_of, None
            if owner is not None and owner >= 0:
                self._memento_end[owner] = p
                expiring = owner - self.policy.keep_last_n_blocks
                if expiring >= 0 and self._memento_end[expiring] is not None:
                    if self.policy.answer_sees_last_block:
                        self._waiting.append(expiring)
                    else:
                        decided = [self._range(expiring, p)]
        return decided


def _rows(x: torch.Tensor) -> torch.Tensor:
    if x.dim() == 1:
        return x.unsqueeze(0)
    if x.dim() != 2:
        raise ValueError(f"expected a [S] or [B, S] tensor, got shape {tuple(x.shape)}")
    return x


def expiry(
    input_ids: torch.Tensor,
    tokens: MementoTokens,
    policy: MaskPolicy | None = MaskPolicy(),
    document_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token expiry, [S] or [B, S] like `input_ids`; `NEVER` where a token never expires.

    `policy=None` means plain causal attention (stage 1): nothing expires. With `document_ids`
    the state restarts at every document boundary.
    """
    ids = _rows(input_ids)
    docs = _rows(document_ids) if document_ids is not None else None
    out = torch.full(ids.shape, NEVER, dtype=torch.long)
    if policy is not None:
        for b, row in enumerate(ids.tolist()):
            doc_row = docs[b].tolist() if docs is not None else None
            tracker = ExpiryTracker(tokens, policy)
            for p, t in enumerate(row):
                if doc_row is not None and p and doc_row[p] != doc_row[p - 1]:
                    tracker = ExpiryTracker(tokens, policy, start=p)
                for start, stop, exp in tracker.feed(t):
                    out[b, start:stop] = exp
    return out.to(input_ids.device).reshape(input_ids.shape)


def evicted(expiry_values: torch.Tensor, query_pos: int | torch.Tensor) -> torch.Tensor:
    """The eviction predicate: cached keys to drop before computing the query at `query_pos`."""
    return expiry_values <= query_pos


def dense_mask_from_expiry(
    expiry_values: torch.Tensor, document_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """[.., S, S] bool, True = query row may attend key column."""
    size = expiry_values.shape[-1]
    pos = torch.arange(size, device=expiry_values.device)
    q, k = pos[:, None], pos[None, :]
    mask = (k <= q) & (q < expiry_values.unsqueeze(-2))
    if document_ids is not None:
        mask &= document_ids.unsqueeze(-1) == document_ids.unsqueeze(-2)
    return mask


def dense_mask(
    input_ids: torch.Tensor,
    tokens: MementoTokens,
    policy: MaskPolicy | None = MaskPolicy(),
    document_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """The rule as a dense bool mask, [S, S] (or [B, S, S]); True = query row may attend key column."""
    return dense_mask_from_expiry(expiry(input_ids, tokens, policy, document_ids), document_ids)


def additive_mask(bool_mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """0 where attention is allowed, finfo.min where not: the only form `eager` reads correctly."""
    zero = torch.zeros((), dtype=dtype, device=bool_mask.device)
    return torch.where(bool_mask, zero, torch.finfo(dtype).min)


def _padded(x: torch.Tensor, length: int, value: int) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, length - x.shape[-1]), value=value)


def _document_ends(docs: torch.Tensor) -> torch.Tensor:
    """For each position, the index one past the end of its document (documents must be contiguous)."""
    size = docs.shape[-1]
    change = torch.ones(size, dtype=torch.bool, device=docs.device)
    change[1:] = docs[1:] != docs[:-1]
    starts = torch.nonzero(change).flatten()
    if docs[starts].unique().numel() != starts.numel():
        raise ValueError("document_ids must form contiguous runs (one run per packed document)")
    ends = torch.cat([starts[1:], torch.tensor([size], device=docs.device)])
    return ends[torch.cumsum(change.long(), 0) - 1]


def visible_until(expiry_values: torch.Tensor, document_ids: torch.Tensor | None = None) -> torch.Tensor:
    """[B, S] int32: key k is visible exactly to queries k <= q < visible_until[k].

    With contiguous packed documents, ``same_document(q, k) and k <= q`` is ``k <= q < end of k's
    document``, so the document test folds into the expiry: one int32 per token is the whole rule.
    """
    exp = _rows(expiry_values)
    size = exp.shape[-1]
    ends = torch.full_like(exp, size)
    if document_ids is not None:
        docs = _rows(document_ids).to(exp.device)
        ends = torch.stack([_document_ends(docs[b]) for b in range(exp.shape[0])])
    return torch.minimum(exp, ends).to(torch.int32)


def mask_mod(
    expiry_values: torch.Tensor, document_ids: torch.Tensor | None = None, block_size: int = FLEX_BLOCK_SIZE
):
    """A FlexAttention mask_mod for a [B, S] batch of expiries.

    It closes over one int32 tensor (a Python int would recompile every step), padded to a
    multiple of the tile size with 0 so indices in the last partial tile stay in bounds and
    padding keys are never visible.
    """
    return _mask_mod_from_until(visible_until(expiry_values, document_ids), block_size)


def _mask_mod_from_until(until: torch.Tensor, block_size: int):
    until = _padded(until, -(-until.shape[-1] // block_size) * block_size, 0)

    def memento_mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (q_idx < until[b, kv_idx])

    return memento_mask_mod


def _ordered(tiles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    num = tiles.sum(-1, dtype=torch.int32)
    idx = torch.argsort((~tiles).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return num, idx


def block_mask_from_expiry(
    expiry_values: torch.Tensor,
    document_ids: torch.Tensor | None = None,
    device: torch.device | str | None = None,
    block_size: int = FLEX_BLOCK_SIZE,
):
    """A FlexAttention BlockMask, built from the rule's structure instead of S² mask evaluations.

    Key k is visible exactly to the query interval [k, visible_until[k]), so a tile below the
    diagonal is non-empty iff the largest interval end in its key tile passes its first query,
    and full iff the smallest reaches its last; diagonal tiles are partial. Tiles holding padding
    are never full, as in `create_block_mask`, whose result this equals (tested).
    """
    from torch.nn.attention.flex_attention import BlockMask

    device = torch.device(device) if device is not None else expiry_values.device
    exp = _rows(expiry_values).to(device)
    docs = _rows(document_ids).to(device) if document_ids is not None else None
    size = exp.shape[-1]
    tiles = -(-size // block_size)
    until = visible_until(exp, docs)
    ends = _padded(until, tiles * block_size, 0).view(exp.shape[0], tiles, block_size)  # padding: empty
    max_end, min_end = ends.max(-1).values, ends.min(-1).values  # [B, T] per key tile
    first_q = torch.arange(tiles, device=device) * block_size
    last_q = torch.clamp(first_q + block_size, max=size)  # one past the last real query of the tile
    tile = torch.arange(tiles, device=device)
    below = tile[:, None] > tile[None, :]  # [q tile, kv tile]
    diagonal = tile[:, None] == tile[None, :]
    any_visible = (below & (max_end[:, None, :] > first_q[None, :, None])) | diagonal
    whole = torch.ones(tiles, dtype=torch.bool, device=device)
    whole[-1] = size % block_size == 0
    full = below & (min_end[:, None, :] >= last_q[None, :, None]) & whole[:, None] & whole[None, :]
    kv_num, kv_idx = _ordered((any_visible & ~full).unsqueeze(1))
    full_num, full_idx = _ordered(full.unsqueeze(1))
    return BlockMask.from_kv_blocks(
        kv_num,
        kv_idx,
        full_num,
        full_idx,
        BLOCK_SIZE=block_size,
        mask_mod=_mask_mod_from_until(until, block_size),
        seq_lengths=(size, size),
    )


def block_mask(
    input_ids: torch.Tensor,
    tokens: MementoTokens,
    policy: MaskPolicy | None = MaskPolicy(),
    document_ids: torch.Tensor | None = None,
    device: torch.device | str | None = None,
    block_size: int = FLEX_BLOCK_SIZE,
):
    """The rule as a FlexAttention `BlockMask` for a [B, S] batch (packing via `document_ids`)."""
    exp = expiry(_rows(input_ids), tokens, policy, _rows(document_ids) if document_ids is not None else None)
    return block_mask_from_expiry(exp, document_ids, device or input_ids.device, block_size)


SUPPORTED_BACKENDS = ("sdpa", "eager", "flex_attention")


def _check_backend(backend: str) -> None:
    if backend not in SUPPORTED_BACKENDS:
        hint = (
            " flash-attention kernels only express causal/sliding masks, not memento eviction."
            if "flash" in backend
            else ""
        )
        raise MaskBackendError(
            f"attention backend {backend!r} cannot take a memento mask; use one of "
            f"{', '.join(SUPPORTED_BACKENDS)}.{hint}"
        )


def attention_mask_for(
    backend: str,
    input_ids: torch.Tensor,
    tokens: MementoTokens,
    policy: MaskPolicy | None = MaskPolicy(),
    document_ids: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
):
    """The mask object `backend` reads correctly: sdpa → bool [B,1,S,S], eager → additive float
    [B,1,S,S], flex_attention → BlockMask. Backends that cannot express the rule are refused."""
    _check_backend(backend)
    ids = _rows(input_ids)
    docs = _rows(document_ids) if document_ids is not None else None
    return mask_from_expiry(backend, expiry(ids, tokens, policy, docs), docs, dtype)


def mask_from_expiry(
    backend: str,
    expiry_values: torch.Tensor,
    document_ids: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
):
    """`attention_mask_for` from expiries already computed (the trainer reuses them for its loss)."""
    _check_backend(backend)
    exp = _rows(expiry_values)
    if backend == "flex_attention":
        return block_mask_from_expiry(exp, document_ids, exp.device)
    dense = dense_mask_from_expiry(exp, _rows(document_ids) if document_ids is not None else None).unsqueeze(
        1
    )
    return dense if backend == "sdpa" else additive_mask(dense, dtype)


def check_mask_for_backend(mask, backend: str) -> None:
    """Refuse the combinations that run without error and compute the wrong thing (design.md §2)."""
    from torch.nn.attention.flex_attention import BlockMask

    if backend not in SUPPORTED_BACKENDS:
        raise MaskBackendError(f"attention backend {backend!r} cannot take a memento mask")
    if isinstance(mask, BlockMask):
        if backend != "flex_attention":
            raise MaskBackendError(f"a BlockMask only works with flex_attention, not {backend!r}")
        return
    if not isinstance(mask, torch.Tensor) or mask.dim() != 4:
        raise MaskBackendError(f"expected a 4D mask tensor or a BlockMask, got {type(mask).__name__}")
    if backend == "flex_attention":
        raise MaskBackendError("flex_attention needs a BlockMask; a tensor mask would be added to the scores")
    if backend == "eager" and mask.dtype == torch.bool:
        raise MaskBackendError(
            "eager adds the mask to the scores: a bool mask must be converted with additive_mask()"
        )
    if backend == "sdpa" and mask.dtype != torch.bool:
        raise MaskBackendError("pass sdpa the bool mask (True = may attend), not an additive one")
