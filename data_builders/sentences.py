"""Sentence splitting for reasoning traces: spans of the original text, never rewritten.

A block is later cut out as ``text[first.start:last.end]``, so splitting must never lose or alter a
character. Code fences, display math, inline math and list items stay whole; lines ending in ":"
join the next unit, continuation openers (Therefore/Thus/So/Hence/Then) join the previous one, and
fragments under ~5 tokens join a neighbour.
"""

from __future__ import annotations

import bisect
import re
import string
from dataclasses import dataclass

_PROTECTED = re.compile(
    r"(?=[`$\\])(?:"  # a cheap first-character test before the alternatives
    r"```.*?(?:```|\Z)"  # fenced code (an unclosed fence runs to the end)
    r"|\$\$.*?\$\$"  # display math
    r"|\\\[.*?\\\]"  # \[ … \]
    r"|\\\(.*?\\\)"  # \( … \)
    r"|(?<![\\$])\$(?!\s)[^$\n]{1,400}?(?<![\s\\])\$(?!\d)"  # inline $…$
    r")",
    re.DOTALL,
)
_PARAGRAPH = re.compile(r"\n[ \t]*\n\s*")
_LIST_ITEM = re.compile(r"\n(?=[ \t]*(?:[-*+•]|\d{1,3}[.)])[ \t]+\S)")
_SENTENCE_END = re.compile(r"[.!?][\"')\]]*(?:[ \t]+(?=[\"'(\[]?[A-Z0-9\\$])|\n(?=\S))")
_CONTINUATION = re.compile(r"(?:Therefore|Thus|So|Hence|Then)\b")
MIN_FRAGMENT_TOKENS = 5


@dataclass(frozen=True)
class Sentence:
    start: int  # offset of the first character in the source text
    end: int  # offset one past the last character, trailing whitespace included
    paragraph_start: bool  # a blank line precedes it

    def text(self, source: str) -> str:
        return source[self.start : self.end].strip()


_NOT_PUNCTUATION = str.maketrans("", "", string.ascii_letters + string.digits + string.whitespace + "_")


def approx_tokens(text: str) -> int:
    """Whitespace-separated words plus punctuation marks: a tokenizer-free size estimate (BPE
    tokenizers give ~1.2-1.5x). String methods only: it runs for every sentence of every trace."""
    return len(text.split()) + len(text.translate(_NOT_PUNCTUATION))


_LIST_MARKER = re.compile(r"(?:^|\n)[ \t]*(?:[-*+•]|\d{1,3}[.)]|[A-Za-z][.)])[ \t]*$")
_ABBREVIATION = re.compile(r"(?:\b(?:e\.g|i\.e|etc|vs|cf|Eq|Fig|Dr|Mr|Mrs|Ms|approx|resp)\.|\b[A-Z]\.)\W*$")


def _inside(pos: int, spans: list[tuple[int, int]]) -> bool:
    """Spans are sorted and disjoint: binary search for the last one starting before `pos`."""
    i = bisect.bisect_left(spans, (pos, pos)) - 1
    return i >= 0 and spans[i][0] < pos < spans[i][1]


def _false_sentence_end(text: str, pos: int) -> bool:
    """A period that ends a list marker ("2. ") or an abbreviation ("e.g. "), not a sentence."""
    before = text[max(0, pos - 12) : pos].rstrip()
    return bool(_LIST_MARKER.search(before) or _ABBREVIATION.search(before))


def split_sentences(text: str) -> list[Sentence]:
    """Split `text` into sentences whose spans tile it from its first to its last non-space character."""
    lead = len(text) - len(text.lstrip())
    stop = len(text.rstrip())
    if lead >= stop:
        return []
    protected = [m.span() for m in _PROTECTED.finditer(text, lead, stop)]
    cuts: dict[int, bool] = {}  # boundary offset -> is a paragraph break
    for m in _PARAGRAPH.finditer(text, lead, stop):
        cuts[m.end()] = True
    for m in _LIST_ITEM.finditer(text, lead, stop):
        cuts.setdefault(m.end(), False)
    for m in _SENTENCE_END.finditer(text, lead, stop):
        if not _false_sentence_end(text, m.end()):
            cuts.setdefault(m.end(), False)
    bounds = sorted(p for p in cuts if lead < p < stop and not _inside(p, protected))
    starts = [lead, *bounds]
    ends = [*bounds, stop]
    units = [[s, e, cuts.get(s, False)] for s, e in zip(starts, ends, strict=True)]
    return [Sentence(s, e, p) for s, e, p in _merge(text, units)]


def _merge(text: str, units: list[list]) -> list[list]:
    merged: list[list] = []  # [start, end, paragraph_start, words, ends with ":"]
    for start, end, paragraph in units:
        words = text[start:end].split()
        size = len(words)  # words: enough to spot a fragment, and 5x cheaper than approx_tokens
        colon = bool(words) and words[-1].endswith(":")
        if merged:
            prev = merged[-1]
            joins = (
                prev[4]
                or (not paragraph and _CONTINUATION.match(text, start) is not None)
                or prev[3] < MIN_FRAGMENT_TOKENS
                or (not paragraph and size < MIN_FRAGMENT_TOKENS)
            )
            if joins:
                prev[1], prev[3], prev[4] = end, prev[3] + size, colon
                continue
        merged.append([start, end, paragraph, size, colon])
    return [m[:3] for m in merged]
