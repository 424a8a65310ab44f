"""Random memento-structured token streams with their structure recorded, and a brute-force
reference of the visibility rule written straight from design.md §2 (independent of
memento_train.masking: it never parses the stream, it reads the generator's own record)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from hypothesis import strategies as st

from memento_train.format import MementoTokens
from memento_train.masking import MaskPolicy

TOK = MementoTokens(block_start=1, block_end=2, summary_start=3, summary_end=4, think_start=5, think_end=6)
TEXT = st.integers(min_value=10, max_value=60)


@dataclass
class Block:
    start: int  # position of <|block_start|>
    end: int | None = None  # position of <|block_end|>; None: never closed
    memento_end: int | None = None  # position of the <|summary_end|> closing its memento


@dataclass
class Doc:
    ids: list[int] = field(default_factory=list)
    blocks: list[Block] = field(default_factory=list)


@st.composite
def documents(draw, max_blocks: int = 5) -> Doc:
    doc = Doc()
    ids = doc.ids
    ids += draw(st.lists(TEXT, min_size=1, max_size=5))  # prompt
    if draw(st.booleans()):
        ids.append(TOK.think_start)
    n_blocks = draw(st.integers(0, max_blocks))
    last_kind = draw(st.sampled_from(["full", "no_memento", "unclosed_block", "unclosed_memento"]))
    for i in range(n_blocks):
        kind = last_kind if i == n_blocks - 1 else "full"
        block = Block(start=len(ids))
        doc.blocks.append(block)
        ids.append(TOK.block_start)
        ids += draw(st.lists(TEXT, max_size=5))
        if kind == "unclosed_block":
            return doc
        block.end = len(ids)
        ids.append(TOK.block_end)
        ids += draw(st.lists(TEXT, max_size=2))  # text between <|block_end|> and <|summary_start|>
        if kind == "no_memento":
            break
        ids.append(TOK.summary_start)
        ids += draw(st.lists(TEXT, max_size=4))
        if kind == "unclosed_memento":
            return doc
        block.memento_end = len(ids)
        ids.append(TOK.summary_end)
        ids += draw(st.lists(TEXT, max_size=1))  # text after a memento, before the next block
    if draw(st.booleans()):
        ids.append(TOK.think_end)
    ids += draw(st.lists(TEXT, max_size=4))  # answer
    return doc


@st.composite
def packed(draw, max_docs: int = 3, max_blocks: int = 5) -> tuple[list[Doc], torch.Tensor, torch.Tensor]:
    docs = draw(st.lists(documents(max_blocks), min_size=1, max_size=max_docs))
    ids = [t for d in docs for t in d.ids]
    doc_ids = [i for i, d in enumerate(docs) for _ in d.ids]
    return docs, torch.tensor(ids), torch.tensor(doc_ids)


policies = st.builds(
    MaskPolicy,
    keep_last_n_blocks=st.integers(0, 3),
    mask_delimiters=st.booleans(),
    answer_sees_last_block=st.booleans(),
)


def reference_visible(doc: Doc, policy: MaskPolicy, q: int, k: int) -> bool:
    """design.md §2 for one document, positions relative to its start."""
    if k > q:
        return False
    block_starts = [b.start for b in doc.blocks]
    for i, block in enumerate(doc.blocks):
        if block.end is None:
            continue  # a block that never closes never expires
        in_content = block.start < k < block.end
        is_tag = k in (block.start, block.end)
        if not (in_content or (policy.mask_delimiters and is_tag)):
            continue
        j = i + policy.keep_last_n_blocks  # expires at the <|summary_end|> of memento i + N
        if block.memento_end is None or j >= len(doc.blocks) or doc.blocks[j].memento_end is None:
            return True
        expires = doc.blocks[j].memento_end
        if policy.answer_sees_last_block:  # ... or at the next <|block_start|> after it
            later = [s for s in block_starts if s > expires]
            if not later:
                return True
            expires = later[0]
        return q < expires
    return True


def reference_mask(docs: list[Doc], policy: MaskPolicy | None) -> torch.Tensor:
    size = sum(len(d.ids) for d in docs)
    mask = torch.zeros(size, size, dtype=torch.bool)
    offset = 0
    for doc in docs:
        n = len(doc.ids)
        for q in range(n):
            for k in range(q + 1):
                visible = True if policy is None else reference_visible(doc, policy, q, k)
                mask[offset + q, offset + k] = visible
        offset += n
    return mask
