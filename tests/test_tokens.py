"""Adding the tags with semantic mean-init, chat rendering, token roles, the toy tokenizer."""

import pytest
import torch
from models import tiny_model

from memento_train.format import ALL_TAGS, MementoFormatError, MementoTokens, Sample, render_response
from memento_train.tokens import (
    INIT_WORDS,
    THINK_END,
    add_memento_tokens,
    render_chat,
    role_counts,
    token_roles,
)
from memento_train.toy_tokenizer import build_tokenizer

CORPUS = [
    "block start begin section step end finish done summary summarize brief recap overview complete "
    "think reason thought answer " * 3,
    "The quick brown fox jumps over the lazy dog. 1 + 2 = 3.",
]


def _base(tied: bool):
    tokenizer = build_tokenizer(CORPUS, vocab_size=300, with_tags=False)
    model = tiny_model("llama", vocab_size=len(tokenizer))
    if tied:
        model.config.tie_word_embeddings = True
        model.lm_head.weight = model.model.embed_tokens.weight
    return tokenizer, model


def _expected_row(tokenizer, weight, tag):
    rows = []
    for word in INIT_WORDS[tag]:
        ids = sorted({i for v in (word, " " + word) for i in tokenizer.encode(v, add_special_tokens=False)})
        rows.append(weight[ids].mean(0))
    return torch.stack(rows).mean(0)


@pytest.mark.parametrize("tied", [False, True])
def test_add_tokens_mean_init(tied):
    tokenizer, model = _base(tied)
    old_in = model.get_input_embeddings().weight.detach().clone()
    old_out = model.get_output_embeddings().weight.detach().clone()
    with pytest.raises(MementoFormatError, match="add_memento_tokens"):
        MementoTokens.from_tokenizer(tokenizer)
    tokens = add_memento_tokens(tokenizer, model, seed=0)
    assert len({*tokens.memento_ids, tokens.think_start, tokens.think_end}) == 6
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    assert emb.shape[0] == len(tokenizer) == head.shape[0]
    assert torch.equal(emb[: old_in.shape[0]], old_in), "existing rows are untouched"
    for tag in ALL_TAGS:
        idx = tokenizer.convert_tokens_to_ids(tag)
        deviation = emb[idx] - _expected_row(tokenizer, old_in, tag)
        assert 0 < deviation.abs().max() < 0.06 and 0.005 < deviation.std() < 0.015, "mean + N(0, 0.01)"
        if tied:
            assert head.data_ptr() == emb.data_ptr()
        else:
            out_dev = head[idx] - _expected_row(tokenizer, old_out, tag)
            assert 0 < out_dev.abs().max() < 0.06
    # Every tag is one token, and ordinary text never produces one.
    for tag in ALL_TAGS:
        assert len(tokenizer.encode(tag, add_special_tokens=False)) == 1
    assert not set(tokenizer.encode("block start summary end", add_special_tokens=False)) & set(
        tokens.memento_ids
    )


def test_add_tokens_is_idempotent():
    tokenizer, model = _base(False)
    first = add_memento_tokens(tokenizer, model)
    snapshot = model.get_input_embeddings().weight.detach().clone()
    assert add_memento_tokens(tokenizer, model, seed=123) == first
    assert torch.equal(model.get_input_embeddings().weight, snapshot)


def test_add_tokens_keeps_an_existing_think_token():
    tokenizer = build_tokenizer(CORPUS, vocab_size=300, with_tags=False)
    tokenizer.add_tokens(["<think>", "</think>"])
    think = tokenizer.convert_tokens_to_ids("<think>")
    tokens = add_memento_tokens(tokenizer)
    assert tokens.think_start == think


def test_toy_tokenizer_is_deterministic_and_lossless():
    a, b = build_tokenizer(CORPUS, 300), build_tokenizer(CORPUS, 300)
    assert a.get_vocab() == b.get_vocab()
    text = "The answer: 3 + 4 = 7 <|block_start|> naïve ✓ <|summary_end|>"
    assert a.decode(a.encode(text, add_special_tokens=False)) == text


SAMPLE = Sample(problem="What is 2+3?", blocks=["2+3 = 5."], mementos=["sum is 5"], answer="\\boxed{5}")


def test_render_chat_with_fallback_template():
    tokenizer = build_tokenizer(CORPUS, 300)
    prompt, completion = render_chat(SAMPLE, tokenizer)
    assert prompt == "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
    assert completion == render_response(SAMPLE) + "<|im_end|>\n"


def test_render_chat_falls_back_when_the_template_rewrites_reasoning():
    tokenizer = build_tokenizer(CORPUS, 300)
    # A template that drops the reasoning of assistant turns (as some reasoning models' templates do).
    tokenizer.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
        "{% if m['role'] == 'assistant' %}{{ m['content'].split('</think>')[-1] }}{% else %}{{ m['content'] }}"
        "{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    with pytest.warns(UserWarning, match="rewrites the assistant turn"):
        _prompt, completion = render_chat(SAMPLE, tokenizer)
    assert completion == render_response(SAMPLE) + tokenizer.eos_token


def test_token_roles():
    tokenizer = build_tokenizer(CORPUS, 300)
    tokens = MementoTokens.from_tokenizer(tokenizer)
    prompt, completion = render_chat(SAMPLE, tokenizer)
    p_ids = tokenizer.encode(prompt, add_special_tokens=False)
    ids = p_ids + tokenizer.encode(completion, add_special_tokens=False)
    roles = token_roles(ids, tokens, prompt_len=len(p_ids))
    counts = role_counts(roles)
    assert counts["prompt"] == len(p_ids)
    assert counts["block_tag"] == 2 and counts["memento_tag"] == 2
    assert counts["block"] == len(tokenizer.encode("2+3 = 5.", add_special_tokens=False))
    assert roles[ids.index(tokenizer.convert_tokens_to_ids(THINK_END)) + 1] == "answer"
    assert token_roles(ids, tokens)[: len(p_ids)] == ["prompt"] * len(p_ids)
