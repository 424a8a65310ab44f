"""Boundary scorers: how good a block boundary is before each sentence, 0 (never) to 3 (ideal).

One interface: ``scorer(text, sentences) -> list[int]`` of length ``len(sentences) - 1``; entry i
scores the boundary between sentence i and sentence i + 1.
"""

from __future__ import annotations

import itertools
import math
import re
from typing import Protocol

from .sentences import Sentence

MAX_SCORE = 3


class BoundaryScorer(Protocol):
    name: str

    def __call__(self, text: str, sentences: list[Sentence]) -> list[int]: ...


_STRONG = re.compile(
    r"^(?:\W*)(?:Wait|But wait|Alternatively|Another approach|Another way|Let me (?:check|verify|double[- ]check|"
    r"re-?examine|reconsider|think again|try (?:another|a different))|Let's (?:check|verify|try another)|"
    r"Now,? (?:let|we|I)|Next|So the (?:final )?answer|Therefore,? the (?:final )?answer|Final Answer|"
    r"To (?:verify|check|confirm|summarize)|In summary|Okay,? (?:so|now|let)|Hmm|Actually|"
    r"(?:First|Second|Third|Finally)\b|On the other hand|Moving on)",
    re.IGNORECASE,
)
_WEAK = re.compile(
    r"^(?:\W*)(?:Now|So|Then|But|Also|Let me|Let's|I need|We need|Maybe|Perhaps)\b", re.IGNORECASE
)
_COMPUTATION_END = re.compile(r"(?:=\s*[-+]?\d[\d.,/]*|\\boxed\{[^}]*\})\s*(?:\\\)|\$)?\s*[.!]?$")
_LIST_ITEM = re.compile(r"^(?:[-*+•]|\d{1,3}[.)]|[a-z][.)])\s")
_MID_CALCULATION_CHARS = frozenset(":=+-*/×·^([{,")
_MID_CALCULATION_WORDS = ("\\cdot", "\\times", "\\frac")
_CALCULATION_START = re.compile(r"^\s*(?:[=+\-*/×·^)\]},]|\\cdot|\\times|&=)")


class HeuristicScorer:
    """Offline and deterministic: discourse cues, paragraph breaks and ends of computations raise
    the score; a boundary inside a calculation or right after ":" / "=" is 0."""

    name = "heuristic"

    def __call__(self, text: str, sentences: list[Sentence]) -> list[int]:
        scores = []
        for prev, cur in itertools.pairwise(sentences):
            before = text[max(prev.start, prev.end - 48) : prev.end].rstrip()  # only the tail matters
            after = text[cur.start : min(cur.end, cur.start + 48)].lstrip()
            mid_calculation = before[-1:] in _MID_CALCULATION_CHARS or before.endswith(_MID_CALCULATION_WORDS)
            if mid_calculation or _CALCULATION_START.match(after) or _LIST_ITEM.match(after):
                scores.append(0)  # inside a calculation, after ":"/"=", or the next item of a list
                continue
            strong, weak = _STRONG.match(after), _WEAK.match(after)
            support = cur.paragraph_start + bool(_COMPUTATION_END.search(before))
            if strong:
                score = 2 + (support > 0)
            elif weak:
                score = 1 + (support > 0)
            else:
                score = min(support, 1)
            scores.append(score)
        return scores


def kl_divergence(p: list[float], q: list[float], eps: float = 1e-9) -> float:
    return sum(pi * math.log((pi + eps) / (qi + eps)) for pi, qi in zip(p, q, strict=True) if pi > 0)


def kl_to_score(kl: float, threshold: float) -> int:
    """KL above the threshold is a boundary (2); twice the threshold is a clear one (3)."""
    if kl >= 2 * threshold:
        return 3
    if kl >= threshold:
        return 2
    if kl >= threshold / 2:
        return 1
    return 0


def make_scorer(name: str, **options) -> BoundaryScorer:
    if name == "heuristic":
        return HeuristicScorer()
    if name == "attention":
        from .attention_scorer import AttentionScorer

        return AttentionScorer(**options)
    if name == "llm":
        from .llm import LLMScorer

        return LLMScorer(**options)
    raise ValueError(f"unknown scorer {name!r}: choose heuristic, attention or llm")
