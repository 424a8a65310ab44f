"""An in-process byte-level BPE tokenizer, trained in milliseconds on the text at hand.

No model hub is reachable in tests, CI or the CPU demo; this gives them a real
`PreTrainedTokenizerFast` (chat template, special tokens, lossless decode) with
token counts of a realistic granularity.
"""

from __future__ import annotations

from collections.abc import Iterable

from .format import ALL_TAGS
from .tokens import FALLBACK_CHAT_TEMPLATE

CONTROL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>")


def build_tokenizer(corpus: Iterable[str], vocab_size: int = 1024, with_tags: bool = True):
    """A deterministic BPE tokenizer for `corpus` with ChatML control tokens and (unless
    `with_tags=False`, as for a base model) the memento tags."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[*CONTROL_TOKENS, *(ALL_TAGS if with_tags else ())],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(list(corpus), trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        unk_token=None,
    )
    tokenizer.chat_template = FALLBACK_CHAT_TEMPLATE
    return tokenizer
