"""Memento writers: from a trace's blocks to one terse memento per block.

`extractive` works offline: it keeps the sentences that carry state (equations, numeric results,
definitions, decisions, the final answer) up to 10–20% of the block's tokens, never the whole
block. `llm` and `model` (data_builders.llm) compress with a language model, judge and refine.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from .sentences import approx_tokens, split_sentences

TARGET_LOW, TARGET_HIGH = 0.10, 0.20


@dataclass
class Mementos:
    texts: list[str]
    scores: list[float | None] = field(default_factory=list)  # judge scores (0-10) where a judge ran
    rounds: list[int] = field(default_factory=list)  # refinement rounds used per memento


class MementoWriter(Protocol):
    name: str

    def __call__(
        self, problem: str, blocks: list[str], split: list[tuple[list[str], list[int]]] | None = None
    ) -> Mementos:
        """`split`: per block, its sentences and their token counts, when already known."""
        ...


_EQUATION = re.compile(r"[=<>≤≥≈]|\\(?:frac|sqrt|cdot|times|le|ge)\b")
_FILLER = re.compile(r"^(?:(?:Hmm|Okay|Ok|Well|Wait|Alright|So|Now|Let me see|I think)[,.!]?\s+)+", re.I)


_DIGITS = frozenset("0123456789")
_DEFINITION_WORDS = "let define defined denote call set suppose where represent represents"
_DECISION_WORDS = (
    "so therefore thus hence get gives conclude answer result correct wrong valid invalid choose chose "
    "pick use works fails confirm confirmed verified checks"
)


def _with_punctuation(words: str) -> frozenset[str]:
    """Each word bare and with the punctuation that follows words in text, so that a plain
    str.split() (no regex, no translate) is enough to look words up."""
    return frozenset(w + p for w in words.split() for p in ("", ",", ".", ":", ";", "!", "?", ")"))


_DEFINITIONS = _with_punctuation(_DEFINITION_WORDS)
_DECISIONS = _with_punctuation(_DECISION_WORDS)


def _value(sentence: str) -> float:
    """How much state a sentence carries. Substring and word-set tests, not one regex per signal:
    this runs for every sentence of every trace."""
    lower = sentence.lower()
    tokens = lower.split()
    words = set(tokens)
    score = 0.0
    if "boxed" in lower or "final answer" in lower or "answer is" in lower:
        score += 4
    if _EQUATION.search(sentence):
        score += 2
    numbers = len([t for t in tokens if t[0] in _DIGITS or (t[0] in "-+($" and t[1:2] in _DIGITS)])
    score += min(numbers, 3) * 0.5
    if not words.isdisjoint(_DEFINITIONS):
        score += 1
    if not words.isdisjoint(_DECISIONS):
        score += 1
    return score


def _clip(text: str, budget: int) -> str:
    """The first `budget` words of a sentence, for blocks too small to keep a sentence whole."""
    words = text.split()
    return " ".join(words[: max(1, budget)]) + (" …" if len(words) > budget else "")


class ExtractiveWriter:
    """Pick the most state-bearing sentences of each block until 10–20% of its tokens.

    `count` measures tokens (the target tokenizer when given, else an approximate count).
    """

    name = "extractive"

    def __init__(
        self, count: Callable[[str], int] | None = None, low: float = TARGET_LOW, high: float = TARGET_HIGH
    ):
        self.count = count or approx_tokens
        self.low, self.high = low, high

    def write_one(
        self, block: str, sentences: list[str] | None = None, sizes: list[int] | None = None
    ) -> str:
        """`sentences` and `sizes`, when the caller has them, save splitting and counting again."""
        if sentences is None or sizes is None:
            sentences = [s.text(block) for s in split_sentences(block)]
            sizes = [self.count(s) for s in sentences]
        total = sum(sizes) or 1
        low, high = self.low * total, self.high * total
        order = sorted(range(len(sentences)), key=lambda i: (-_value(sentences[i]), -i))
        chosen, used = [], 0
        for i in order:
            if used >= low:
                break
            if used + sizes[i] <= high:
                chosen.append(i)
                used += sizes[i]
        if not chosen:  # every sentence is larger than the budget: keep the head of the best one
            best = order[0]
            return _clip(_FILLER.sub("", sentences[best]) or sentences[best], int(high) or 1)
        return " ".join(_FILLER.sub("", sentences[i]) or sentences[i] for i in sorted(chosen))

    def __call__(
        self, problem: str, blocks: list[str], split: list[tuple[list[str], list[int]]] | None = None
    ) -> Mementos:
        texts = [self.write_one(b, *(split[i] if split else (None, None))) for i, b in enumerate(blocks)]
        return Mementos(texts, [None] * len(texts), [0] * len(texts))


def make_writer(name: str, count: Callable[[str], int] | None = None, **options) -> MementoWriter:
    if name == "extractive":
        return ExtractiveWriter(count)
    if name in ("llm", "model"):
        from .llm import LLMWriter, make_backend

        return LLMWriter(make_backend(name, **options.pop("backend", {})), **options)
    raise ValueError(f"unknown memento writer {name!r}: choose extractive, llm or model")
