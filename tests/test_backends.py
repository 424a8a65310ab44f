"""The mask reaches the model's attention layers intact on every backend we support."""

import pytest
import torch
from hypothesis import given, settings
from models import positions, tiny_model
from trace_gen import TOK, packed, policies

from memento_train.masking import (
    MaskBackendError,
    MaskPolicy,
    additive_mask,
    attention_mask_for,
    check_mask_for_backend,
    dense_mask,
)

ARCHS = ["llama", "qwen3"]


def _structured_batch():
    """Two rows of 384 tokens (3 tiles of 128) holding full, partial and empty tiles:
    row 0 is one document (a 130-token prompt, then blocks); row 1 packs two documents."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(10, 60, (2, 384), generator=gen)
    for row in (0, 1):
        ids[row, 130], ids[row, 250], ids[row, 251], ids[row, 270] = 1, 2, 3, 4  # block 1 + memento
        ids[row, 280], ids[row, 330], ids[row, 331], ids[row, 340] = 1, 2, 3, 4  # block 2 + memento
    docs = torch.zeros(2, 384, dtype=torch.long)
    docs[1, 256:] = 1
    return ids, docs


def _logits(model, ids, mask, docs):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask, position_ids=positions(docs)).logits


@pytest.mark.parametrize("arch", ARCHS)
def test_flex_blockmask_forward_equals_sdpa_dense(arch):
    ids, docs = _structured_batch()
    bm = attention_mask_for("flex_attention", ids, TOK, MaskPolicy(), docs)
    partial, full = bm.kv_num_blocks.sum().item(), bm.full_kv_num_blocks.sum().item()
    assert partial and full and partial + full < 2 * 6, "batch must exercise full, partial and empty tiles"
    flex = _logits(tiny_model(arch, "flex_attention"), ids, bm, docs)
    sdpa = _logits(
        tiny_model(arch, "sdpa"), ids, attention_mask_for("sdpa", ids, TOK, MaskPolicy(), docs), docs
    )
    torch.testing.assert_close(flex, sdpa, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
@given(sample=packed(max_docs=3), policy=policies)
@settings(max_examples=15)
def test_eager_additive_equals_sdpa_bool(arch, sample, policy):
    _, ids, doc_ids = sample
    ids, docs = ids[None], doc_ids[None]
    eager = _logits(tiny_model(arch, "eager"), ids, attention_mask_for("eager", ids, TOK, policy, docs), docs)
    sdpa = _logits(tiny_model(arch, "sdpa"), ids, attention_mask_for("sdpa", ids, TOK, policy, docs), docs)
    torch.testing.assert_close(eager, sdpa, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_evicted_block_content_cannot_reach_later_logits(arch):
    """With one layer, changing block 1's content changes no logit from its <|summary_end|> on
    under the memento mask, and does under the causal mask (so the test can fail). With more
    layers it does reach them, through the mementos' own KV, which saw the block: that is the
    paper's implicit second information stream, not a leak (the restart ablation removes it)."""
    ids, docs = _structured_batch()
    ids, docs = ids[:1], docs[:1]
    other = ids.clone()
    other[0, 131:250] = torch.randint(10, 60, (119,), generator=torch.Generator().manual_seed(1))

    def logits(model, policy):
        return [
            _logits(model, x, attention_mask_for("sdpa", x, TOK, policy, docs), docs) for x in (ids, other)
        ]

    memento = logits(tiny_model(arch, "sdpa", layers=1), MaskPolicy())
    causal = logits(tiny_model(arch, "sdpa", layers=1), None)
    torch.testing.assert_close(memento[0][0, 270:], memento[1][0, 270:], atol=1e-6, rtol=0)
    assert not torch.allclose(memento[0][0, 251:270], memento[1][0, 251:270]), "the memento sees its block"
    assert not torch.allclose(causal[0][0, 270:], causal[1][0, 270:])
    deep = logits(tiny_model(arch, "sdpa", layers=2), MaskPolicy())
    assert not torch.allclose(deep[0][0, 270:], deep[1][0, 270:]), "two layers: the memento stream carries it"


def test_backend_dispatch_types():
    ids, docs = _structured_batch()
    sdpa = attention_mask_for("sdpa", ids, TOK, document_ids=docs)
    eager = attention_mask_for("eager", ids, TOK, document_ids=docs)
    assert sdpa.dtype == torch.bool and sdpa.shape == (2, 1, 384, 384)
    assert torch.equal(eager, additive_mask(sdpa))
    assert torch.equal(sdpa[:, 0], dense_mask(ids, TOK, document_ids=docs))
    check_mask_for_backend(sdpa, "sdpa")
    check_mask_for_backend(eager, "eager")
    check_mask_for_backend(
        attention_mask_for("flex_attention", ids, TOK, document_ids=docs), "flex_attention"
    )


@pytest.mark.parametrize(
    ("make", "backend", "match"),
    [
        ("bool", "eager", "additive_mask"),
        ("bool", "flex_attention", "BlockMask"),
        ("float", "flex_attention", "BlockMask"),
        ("float", "sdpa", "bool mask"),
        ("block", "sdpa", "only works with flex_attention"),
        ("block", "eager", "only works with flex_attention"),
        ("bool", "flash_attention_2", "cannot take a memento mask"),
        ("2d", "sdpa", "4D"),
    ],
)
def test_silently_wrong_combinations_are_refused(make, backend, match):
    ids = torch.tensor([[10, 1, 11, 2, 3, 12, 4, 13]])
    masks = {
        "bool": lambda: attention_mask_for("sdpa", ids, TOK),
        "float": lambda: attention_mask_for("eager", ids, TOK),
        "block": lambda: attention_mask_for("flex_attention", ids, TOK),
        "2d": lambda: torch.ones(1, 8, dtype=torch.bool),
    }
    with pytest.raises(MaskBackendError, match=match):
        check_mask_for_backend(masks[make](), backend)


@pytest.mark.parametrize("backend", ["flash_attention_2", "flash_attention_3", "sdpa_paged", "nonsense"])
def test_backends_that_cannot_express_the_rule_are_refused(backend):
    with pytest.raises(MaskBackendError, match="cannot take a memento mask"):
        attention_mask_for(backend, torch.tensor([[10, 11]]), TOK)
