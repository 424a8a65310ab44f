"""The central test: decoding with eviction reproduces the dense forward with the stage-2 mask."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from models import tiny_model
from trace_gen import TOK, documents, policies

from memento_train.inference import EvictingDecoder, generate, teacher_forced_logits
from memento_train.masking import MaskPolicy, dense_mask

ARCHS = ["llama", "qwen3"]
MODELS = {arch: tiny_model(arch, "sdpa") for arch in ARCHS}


def _dense_logits(model, ids, policy):
    mask = dense_mask(ids, TOK, policy)[:, None]
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits


@pytest.mark.parametrize("arch", ARCHS)
@given(doc=documents(max_blocks=5), policy=policies, prefill=st.integers(1, 4))
@settings(max_examples=25)
def test_eviction_matches_the_stage2_dense_forward(arch, doc, policy, prefill):
    model = MODELS[arch]
    ids = torch.tensor([doc.ids])
    prefill = min(prefill, ids.shape[1])
    decoded, stats = teacher_forced_logits(model, TOK, ids, policy, "memento", prefill=prefill)
    torch.testing.assert_close(decoded, _dense_logits(model, ids, policy), atol=1e-4, rtol=1e-4)
    mask = dense_mask(ids, TOK, policy)[0]
    held = mask.sum(-1).tolist()[prefill - 1 :]
    assert stats.lengths[0] == held, "the cache holds exactly the keys the mask shows"


@pytest.mark.parametrize("arch", ARCHS)
@given(doc=documents(max_blocks=4))
@settings(max_examples=10)
def test_full_mode_is_plain_causal(arch, doc):
    model = MODELS[arch]
    ids = torch.tensor([doc.ids])
    decoded, stats = teacher_forced_logits(model, TOK, ids, None, "full")
    with torch.no_grad():
        torch.testing.assert_close(decoded, model(input_ids=ids).logits, atol=1e-4, rtol=1e-4)
    assert stats.lengths[0] == list(range(1, ids.shape[1] + 1))


@pytest.mark.parametrize("arch", ARCHS)
@given(docs=st.lists(documents(max_blocks=4), min_size=2, max_size=3), policy=policies)
@settings(max_examples=10)
def test_batched_decoding_with_different_eviction_points_matches_rows(arch, docs, policy):
    model = MODELS[arch]
    width = max(len(d.ids) for d in docs)
    ids = torch.zeros(len(docs), width, dtype=torch.long)
    for b, d in enumerate(docs):
        ids[b, width - len(d.ids) :] = torch.tensor(d.ids)
    batched, stats = teacher_forced_logits(model, TOK, ids, policy, lengths=[len(d.ids) for d in docs])
    for b, d in enumerate(docs):
        single, single_stats = teacher_forced_logits(model, TOK, torch.tensor([d.ids]), policy)
        n = len(d.ids)
        torch.testing.assert_close(batched[b, width - n + 1 :], single[0, 1:], atol=1e-4, rtol=1e-4)
        row = stats.lengths[b]
        assert row[len(row) - (n - 1) :] == single_stats.lengths[0][1:]


def test_restart_mode_drops_the_memento_stream():
    """Restart recomputes survivors without the evicted block: logits after a memento then equal a
    dense forward in which the mementos never saw their block either."""
    model = MODELS["llama"]
    ids = torch.tensor([[10, 11, 1, 20, 21, 22, 2, 3, 30, 31, 4, 12, 13, 1, 23, 24, 2, 3, 32, 4, 14, 15]])
    memento, _ = teacher_forced_logits(model, TOK, ids, MaskPolicy(), "memento")
    restart, _ = teacher_forced_logits(model, TOK, ids, MaskPolicy(), "restart")
    assert torch.allclose(memento[0, :11], restart[0, :11], atol=1e-5), (
        "identical until the first memento closes"
    )
    assert not torch.allclose(memento[0, 11:], restart[0, 11:], atol=1e-4)
    # Reference: the survivors after a block (its <|block_end|>, the memento) never saw its content:
    # block 1 content (3-5) hidden from 6 on, block 2 content (14-15) hidden from 16 on. Restart equals
    # it for every query computed after a restart: 11-15 and 20-21 (6-10 and 16-19 ran before theirs).
    mask = dense_mask(ids, TOK, MaskPolicy())[0]
    mask[6:, 3:6] = False
    mask[16:, 14:16] = False
    with torch.no_grad():
        reference = model(input_ids=ids, attention_mask=mask[None, None]).logits
    torch.testing.assert_close(restart[0, 11:16], reference[0, 11:16], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(restart[0, 20:], reference[0, 20:], atol=1e-4, rtol=1e-4)


def test_generate_with_block_cap_and_kv_accounting():
    model = MODELS["llama"]
    prompt = [10, 11, 12, 1]  # ends inside a block
    result = generate(model, TOK, [prompt, prompt[:3]], MaskPolicy(), "memento", max_new_tokens=12,
                      max_block_tokens=3)  # fmt: skip
    assert len(result.ids[0]) == 12 and result.forced_block_ends[0] >= 1
    assert result.stats.peak(0) >= 1 and result.stats.auc(0) >= result.stats.peak(0)
    from transformers import LlamaConfig

    config = LlamaConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_size=64)
    assert result.stats.kv_bytes(10, config) == 10 * 2 * 2 * 16 * 2 * 4


def test_decoder_refuses_unsupported_settings():
    with pytest.raises(ValueError, match="mode must be one of"):
        EvictingDecoder(MODELS["llama"], TOK, mode="other")


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(
    "policy",
    [
        MaskPolicy(),
        MaskPolicy(keep_last_n_blocks=1),
        MaskPolicy(mask_delimiters=True, answer_sees_last_block=True),
    ],
)
def test_model_generate_with_the_evicting_cache_matches_dense(arch, policy):
    """Inside `model.generate()` (batch 1): a scripted continuation with three blocks gives the same
    logits as one dense forward with the stage-2 mask, while the physical cache shrinks."""
    from transformers import LogitsProcessor, LogitsProcessorList

    from memento_train.inference import generate_hf

    model = MODELS[arch]
    prompt = [10, 11, 12, 5]
    script = [1, 20, 21, 22, 2, 3, 30, 31, 4, 1, 23, 24, 2, 3, 32, 4, 1, 25, 2, 3, 33, 4, 6, 40, 41]

    class Script(LogitsProcessor):
        def __call__(self, input_ids, scores):
            forced = torch.full_like(scores, -1e9)
            forced[:, script[input_ids.shape[1] - len(prompt)]] = 0
            return forced

    out, cache = generate_hf(model, TOK, prompt, policy, max_new_tokens=len(script), do_sample=False,
                             eos_token_id=63, pad_token_id=0, logits_processor=LogitsProcessorList([Script()]),
                             output_logits=True, return_dict_in_generate=True)  # fmt: skip
    sequence = out.sequences
    assert sequence[0].tolist() == prompt + script
    with torch.no_grad():
        dense = model(input_ids=sequence, attention_mask=dense_mask(sequence, TOK, policy)[:, None]).logits
    torch.testing.assert_close(
        torch.stack(out.logits, 1)[0], dense[0, len(prompt) - 1 : -1], atol=1e-4, rtol=1e-4
    )
    assert len(cache.slot_pos) < sequence.shape[1], "entries were physically evicted"
    assert cache.layers[0].keys.shape[-2] == len(cache.slot_pos)


def test_generate_hf_refuses_prompts_that_close_a_memento():
    from memento_train.inference import generate_hf

    with pytest.raises(ValueError, match="must not close a memento"):
        generate_hf(MODELS["llama"], TOK, [10, 1, 20, 2, 3, 30, 4], MaskPolicy(), max_new_tokens=1)
