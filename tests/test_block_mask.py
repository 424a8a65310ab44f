"""FlexAttention BlockMask: the structural builder equals create_block_mask, covers exactly the
visible pairs, and flex_attention with it equals SDPA with the dense mask (forward, no_grad)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from trace_gen import TOK, packed, policies

from memento_train.masking import block_mask, block_mask_from_expiry, dense_mask, expiry, mask_mod


def _tile_sets(bm):
    """{(b, q_tile): (partial kv tiles, full kv tiles)} as sets."""
    out = {}
    kv_num, kv_idx = bm.kv_num_blocks, bm.kv_indices
    full_num, full_idx = bm.full_kv_num_blocks, bm.full_kv_indices
    for b in range(kv_num.shape[0]):
        for q in range(kv_num.shape[2]):
            partial = set(kv_idx[b, 0, q, : kv_num[b, 0, q]].tolist())
            full = set(full_idx[b, 0, q, : full_num[b, 0, q]].tolist())
            out[(b, q)] = (partial, full)
    return out


def _mask_from_block_mask(bm, mod, size, block):
    """Expand a BlockMask back to pairs the way the kernel reads it: full tiles all on,
    partial tiles through mask_mod, everything else off."""
    mask = torch.zeros(size, size, dtype=torch.bool)
    for (b, qt), (partial, full) in _tile_sets(bm).items():
        assert b == 0
        for kt in partial | full:
            qs = torch.arange(qt * block, min((qt + 1) * block, size))
            ks = torch.arange(kt * block, min((kt + 1) * block, size))
            if kt in full:
                mask[qs[:, None], ks[None, :]] = True
            else:
                mask[qs[:, None], ks[None, :]] = mod(0, 0, qs[:, None], ks[None, :])
    return mask


@given(packed(max_docs=3, max_blocks=5), policies, st.sampled_from([4, 8, 16]))
@settings(max_examples=60)
def test_structural_block_mask_equals_create_block_mask(sample, policy, block):
    _, ids, doc_ids = sample
    exp = expiry(ids, TOK, policy, doc_ids)[None]
    docs = doc_ids[None]
    ours = block_mask_from_expiry(exp, docs, "cpu", block)
    reference = create_block_mask(
        mask_mod(exp, docs, block), 1, None, len(ids), len(ids), device="cpu", BLOCK_SIZE=block
    )
    assert _tile_sets(ours) == _tile_sets(reference)
    assert torch.equal(ours.to_dense(), reference.to_dense())


@given(packed(max_docs=3, max_blocks=5), policies, st.sampled_from([4, 8]))
@settings(max_examples=60)
def test_block_mask_expands_to_the_dense_mask(sample, policy, block):
    _, ids, doc_ids = sample
    exp = expiry(ids, TOK, policy, doc_ids)[None]
    bm = block_mask_from_expiry(exp, doc_ids[None], "cpu", block)
    expanded = _mask_from_block_mask(bm, mask_mod(exp, doc_ids[None], block), len(ids), block)
    assert torch.equal(expanded, dense_mask(ids, TOK, policy, doc_ids))


def test_non_contiguous_documents_are_refused():
    with pytest.raises(ValueError, match="contiguous"):
        block_mask(torch.tensor([[10, 11, 12]]), TOK, document_ids=torch.tensor([[0, 1, 0]]))


@given(packed(max_docs=2, max_blocks=4), policies, st.integers(1, 2))
@settings(max_examples=20)
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_attention_forward_equals_sdpa_with_dense_mask(sample, policy, batch):
    _, ids, doc_ids = sample
    ids, docs = ids.repeat(batch, 1), doc_ids.repeat(batch, 1)
    size = ids.shape[1]
    gen = torch.Generator().manual_seed(size)
    q, k, v = (torch.randn(batch, 2, size, 16, generator=gen) for _ in range(3))
    bm = block_mask(ids, TOK, policy, docs, device="cpu")
    dense = dense_mask(ids, TOK, policy, docs)[:, None]
    with torch.no_grad():
        flex = flex_attention(q, k, v, block_mask=bm)
        sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=dense)
    torch.testing.assert_close(flex, sdpa, atol=1e-5, rtol=1e-5)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_attention_default_tile_size_with_ragged_length():
    """S = 300 (not a multiple of 128): the padded tail must not leak into attention."""
    torch.manual_seed(0)
    ids = torch.randint(10, 60, (1, 300))
    for start in range(20, 280, 60):  # blocks of 30 content tokens with 5-token mementos
        ids[0, start], ids[0, start + 31], ids[0, start + 32], ids[0, start + 38] = 1, 2, 3, 4
    docs = torch.zeros(1, 300, dtype=torch.long)
    docs[0, 150:] = 1
    bm = block_mask(ids, TOK, document_ids=docs)
    q, k, v = (torch.randn(1, 2, 300, 16) for _ in range(3))
    with torch.no_grad():
        flex = flex_attention(q, k, v, block_mask=bm)
        sdpa = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=dense_mask(ids, TOK, document_ids=docs)[:, None]
        )
    torch.testing.assert_close(flex, sdpa, atol=1e-5, rtol=1e-5)
