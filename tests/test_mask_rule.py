"""The one visibility rule against a brute-force reference, and the eviction path against the mask."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from trace_gen import TOK, packed, policies, reference_mask

from memento_train.masking import (
    NEVER,
    ExpiryTracker,
    MaskPolicy,
    additive_mask,
    dense_mask,
    dense_mask_from_expiry,
    evicted,
    expiry,
)


@given(packed(), policies)
def test_dense_mask_equals_brute_force_reference(sample, policy):
    docs, ids, doc_ids = sample
    assert torch.equal(dense_mask(ids, TOK, policy, doc_ids), reference_mask(docs, policy))


@given(packed())
def test_no_policy_is_plain_causal_with_documents(sample):
    docs, ids, doc_ids = sample
    assert torch.equal(dense_mask(ids, TOK, None, doc_ids), reference_mask(docs, None))
    assert (expiry(ids, TOK, None, doc_ids) == NEVER).all()


@given(packed(), policies)
def test_batched_rows_equal_single_rows(sample, policy):
    _, ids, doc_ids = sample
    batch_ids = torch.stack([ids, ids.flip(0)])
    batch_docs = torch.stack([doc_ids, doc_ids.flip(0)])
    batched = dense_mask(batch_ids, TOK, policy, batch_docs)
    for b in range(2):
        assert torch.equal(batched[b], dense_mask(batch_ids[b], TOK, policy, batch_docs[b]))


@given(packed(max_docs=1), policies)
def test_incremental_eviction_reproduces_every_mask_row(sample, policy):
    """Drive the tracker token by token as inference does: before computing query p, drop every
    key whose expiry was decided <= p. The cache then holds exactly mask row p, using only
    what was known at step p."""
    _, ids, _ = sample
    mask = dense_mask(ids, TOK, policy)
    tracker = ExpiryTracker(TOK, policy)
    known = torch.full((len(ids),), NEVER, dtype=torch.long)
    cache: list[int] = []
    for p, token in enumerate(ids.tolist()):
        for start, stop, exp in tracker.feed(token):
            assert exp == p, "an expiry is decided exactly at the query it applies to"
            known[start:stop] = exp
        cache.append(p)
        cache = [k for k in cache if not evicted(known[k], p)]
        assert cache == torch.nonzero(mask[p]).flatten().tolist()


@given(packed(), policies)
def test_eviction_predicate_agrees_with_dense_mask(sample, policy):
    _, ids, doc_ids = sample
    exp = expiry(ids, TOK, policy, doc_ids)
    mask = dense_mask(ids, TOK, policy, doc_ids)
    for p in range(len(ids)):
        kept = ~evicted(exp[: p + 1], p) & (doc_ids[: p + 1] == doc_ids[p])
        assert torch.equal(kept, mask[p, : p + 1])


@given(st.lists(st.sampled_from([1, 2, 3, 4, 5, 6, 10, 11]), max_size=80), policies)
def test_arbitrary_streams_never_crash_and_stay_sane(stream, policy):
    ids = torch.tensor(stream, dtype=torch.long)
    exp = expiry(ids, TOK, policy)
    positions = torch.arange(len(stream))
    assert ((exp > positions) | (exp == NEVER)).all(), "a token is always visible to itself"
    mask = dense_mask_from_expiry(exp)
    assert mask.diagonal().all() if len(stream) else True
    # Visibility only shrinks as policies get more permissive? No: keeping more blocks only adds.
    looser = MaskPolicy(policy.keep_last_n_blocks + 1, policy.mask_delimiters, policy.answer_sees_last_block)
    assert (dense_mask(ids, TOK, looser) | ~mask).all(), "keeping one more block never hides a key"
    assert (dense_mask(ids, TOK, None) | ~mask).all(), "the memento mask is a subset of causal"


@given(packed(), policies)
def test_answer_sees_last_block_only_adds_visibility(sample, policy):
    _, ids, doc_ids = sample
    base = MaskPolicy(policy.keep_last_n_blocks, policy.mask_delimiters, False)
    later = MaskPolicy(policy.keep_last_n_blocks, policy.mask_delimiters, True)
    assert (dense_mask(ids, TOK, later, doc_ids) | ~dense_mask(ids, TOK, base, doc_ids)).all()


def test_worked_example_by_hand():
    #        0  1  2  3  4  5  6  7  8  9 10 11 12 13 14 15 16
    ids = [10, 5, 1, 20, 21, 2, 3, 30, 4, 1, 22, 2, 3, 31, 4, 6, 40]
    exp = expiry(torch.tensor(ids), TOK)
    expected = [NEVER] * len(ids)
    expected[3] = expected[4] = 8  # block 1 content expires at memento 1's <|summary_end|>
    expected[10] = 14  # block 2 content at memento 2's
    assert exp.tolist() == expected
    exp = expiry(torch.tensor(ids), TOK, MaskPolicy(mask_delimiters=True))
    assert exp[2:6].tolist() == [8, 8, 8, 8]
    exp = expiry(torch.tensor(ids), TOK, MaskPolicy(keep_last_n_blocks=1))
    assert exp[3:5].tolist() == [14, 14] and exp[10] == NEVER
    exp = expiry(torch.tensor(ids), TOK, MaskPolicy(answer_sees_last_block=True))
    assert exp[3:5].tolist() == [9, 9] and exp[10] == NEVER  # last block stays for the answer
    mask = dense_mask(torch.tensor(ids), TOK)
    assert mask[7, 3] and not mask[8, 3], "the memento sees its block; its <|summary_end|> does not"


def test_summary_binds_to_most_recent_block_without_memento():
    # block A closed, block B closed (no memento for A yet), then two mementos: B's first, then A's.
    ids = [10, 1, 20, 2, 1, 21, 2, 3, 30, 4, 3, 31, 4, 40]
    exp = expiry(torch.tensor(ids), TOK)
    assert exp[5] == 9 and exp[2] == 12


@pytest.mark.parametrize(
    "kwargs",
    [
        {"keep_last_n_blocks": -1},
        {"keep_last_n_blocks": 1.5},
        {"keep_last_n_blocks": True},
        {"mask_delimiters": 1},
    ],
)
def test_policy_validation(kwargs):
    with pytest.raises((TypeError, ValueError)):
        MaskPolicy(**kwargs)


def test_additive_mask_values():
    mask = torch.tensor([[True, False], [True, True]])
    add = additive_mask(mask, torch.float32)
    assert add[0, 0] == 0 and add[0, 1] == torch.finfo(torch.float32).min and add.dtype == torch.float32
