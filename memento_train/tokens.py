"""The tokenizer side of the format: adding the tags with semantic mean-init, chat rendering, token roles."""

from __future__ import annotations

import warnings
from collections import Counter
from typing import Any

import torch

from .format import (
    BLOCK_END,
    BLOCK_START,
    SUMMARY_END,
    SUMMARY_START,
    THINK_END,
    THINK_START,
    MementoTokens,
    Sample,
    render_response,
)

# Paper App. A.2.1: a new tag starts at the mean embedding of words that mean the same, plus N(0, 0.01).
INIT_WORDS: dict[str, tuple[str, ...]] = {
    BLOCK_START: ("block", "start", "begin", "section", "step"),
    BLOCK_END: ("block", "end", "finish", "section", "done"),
    SUMMARY_START: ("summary", "summarize", "brief", "recap", "overview"),
    SUMMARY_END: ("summary", "end", "finish", "done", "complete"),
    THINK_START: ("think", "reason", "thought", "begin"),
    THINK_END: ("think", "end", "answer", "done"),
}
INIT_NOISE_STD = 0.01

# ChatML, used only when a tokenizer ships no chat template of its own.
FALLBACK_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _word_mean(tokenizer: Any, weight: torch.Tensor, words: tuple[str, ...]) -> torch.Tensor:
    vectors = []
    for word in words:
        ids = sorted(
            {i for variant in (word, " " + word) for i in tokenizer.encode(variant, add_special_tokens=False)}
        )
        ids = [i for i in ids if i < weight.shape[0]]
        if ids:
            vectors.append(weight[ids].float().mean(0))
    if not vectors:  # a tokenizer that knows none of the words: fall back to the mean of all rows
        return weight.float().mean(0)
    return torch.stack(vectors).mean(0)


def add_memento_tokens(
    tokenizer: Any, model: Any = None, *, seed: int = 0, noise_std: float = INIT_NOISE_STD
) -> MementoTokens:
    """Add the four tags (and <think>/</think> if missing); mean-init their rows in `model`.

    Idempotent: tags the tokenizer already has keep their ids and their trained rows.
    Works for tied and untied output heads (the untied head gets its own mean over its own rows).
    """
    wanted = [BLOCK_START, BLOCK_END, SUMMARY_START, SUMMARY_END, THINK_START, THINK_END]
    vocab = tokenizer.get_vocab()
    new = [t for t in wanted if t not in vocab or len(tokenizer.encode(t, add_special_tokens=False)) != 1]
    # The memento tags are control tokens (never split, never produced by ordinary text);
    # <think>/</think>, when the base lacks them, are added as plain added tokens, like Qwen3 has them.
    special = [t for t in new if t in (BLOCK_START, BLOCK_END, SUMMARY_START, SUMMARY_END)]
    plain = [t for t in new if t not in special]
    if special:
        tokenizer.add_special_tokens({"extra_special_tokens": special}, replace_extra_special_tokens=False)
    if plain:
        tokenizer.add_tokens(plain)
    tokens = MementoTokens.from_tokenizer(tokenizer)
    if model is None:
        return tokens
    old_rows = model.get_input_embeddings().weight.shape[0]
    tag_ids = {tag: tokenizer.convert_tokens_to_ids(tag) for tag in wanted}
    # Rows to initialize: tags just added, and tags of a tokenizer that already had them but whose
    # model was never resized (a base model loaded next to a memento tokenizer).
    fresh = [tag for tag, idx in tag_ids.items() if tag in new or idx >= old_rows]
    if not fresh:
        return tokens
    old_input = model.get_input_embeddings().weight.detach().clone()
    old_output = model.get_output_embeddings()
    old_output = old_output.weight.detach().clone() if old_output is not None else None
    if len(tokenizer) > old_rows:
        model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    emb = model.get_input_embeddings().weight
    out_layer = model.get_output_embeddings()
    tied = out_layer is None or out_layer.weight.data_ptr() == emb.data_ptr()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for tag in fresh:
            idx = tag_ids[tag]
            noise = torch.randn(emb.shape[1], generator=gen) * noise_std
            emb[idx] = (_word_mean(tokenizer, old_input, INIT_WORDS[tag]) + noise).to(emb.dtype)
            if not tied and old_output is not None:
                head = out_layer.weight
                noise = torch.randn(head.shape[1], generator=gen) * noise_std
                head[idx] = (_word_mean(tokenizer, old_output, INIT_WORDS[tag]) + noise).to(head.dtype)
    return tokens


def chat_template_of(tokenizer: Any) -> str:
    return getattr(tokenizer, "chat_template", None) or FALLBACK_CHAT_TEMPLATE


def render_chat(sample: Sample, tokenizer: Any) -> tuple[str, str]:
    """(prompt, completion) text: the prompt from the model's own chat template, loss on the completion.

    The completion is the template's rendering of the assistant turn when it keeps our response
    verbatim; a template that rewrites the reasoning falls back to response + EOS, with a warning.
    """
    response = render_response(sample)
    template = chat_template_of(tokenizer)
    user = [{"role": "user", "content": sample.problem}]
    prompt = tokenizer.apply_chat_template(
        user, tokenize=False, add_generation_prompt=True, chat_template=template
    )
    full = tokenizer.apply_chat_template(
        [*user, {"role": "assistant", "content": response}], tokenize=False, chat_template=template
    )
    if full.startswith(prompt) and response in full[len(prompt) :]:
        return prompt, full[len(prompt) :]
    warnings.warn(
        "the chat template rewrites the assistant turn; using response + eos_token as the completion",
        stacklevel=2,
    )
    return prompt, response + (tokenizer.eos_token or "")


# Token roles, for drawing and KV accounting.
PROMPT, THINK, BLOCK, BLOCK_TAG, GAP, MEMENTO, MEMENTO_TAG, ANSWER = (
    "prompt",
    "think",
    "block",
    "block_tag",
    "gap",
    "memento",
    "memento_tag",
    "answer",
)
ROLES = (PROMPT, THINK, BLOCK, BLOCK_TAG, GAP, MEMENTO, MEMENTO_TAG, ANSWER)


def token_roles(
    input_ids: list[int] | torch.Tensor, tokens: MementoTokens, prompt_len: int | None = None
) -> list[str]:
    """The role of each token of one document. Without `prompt_len`, the prompt ends at <think>
    (or at the first block when there is no <think>)."""
    ids = input_ids.tolist() if isinstance(input_ids, torch.Tensor) else list(input_ids)
    if prompt_len is None:
        starts = [i for i, t in enumerate(ids) if t in (tokens.think_start, tokens.block_start)]
        prompt_len = starts[0] if starts else len(ids)
    roles = [PROMPT] * prompt_len
    state = THINK
    for t in ids[prompt_len:]:
        if state == ANSWER:
            roles.append(ANSWER)
            continue
        if t == tokens.block_start:
            roles.append(BLOCK_TAG)
            state = BLOCK
        elif t == tokens.block_end:
            roles.append(BLOCK_TAG)
            state = GAP
        elif t == tokens.summary_start:
            roles.append(MEMENTO_TAG)
            state = MEMENTO
        elif t == tokens.summary_end:
            roles.append(MEMENTO_TAG)
            state = THINK
        elif t in (tokens.think_start, tokens.think_end) and t is not None:
            roles.append(THINK)
            if t == tokens.think_end:
                state = ANSWER
        else:
            roles.append(state)
    return roles


def role_counts(roles: list[str]) -> dict[str, int]:
    counts = Counter(roles)
    return {r: counts.get(r, 0) for r in ROLES}
