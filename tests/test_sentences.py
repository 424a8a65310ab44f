"""The sentence splitter: spans tile the text, atomic units stay whole, merge rules apply."""

import itertools
import json

from hypothesis import given
from hypothesis import strategies as st
from test_format import SHARED, needs_shared

from data_builders.sentences import split_sentences


def _texts(text, sentences):
    return [s.text(text) for s in sentences]


def _tiles(text, sentences):
    stripped = text.strip()
    if not stripped:
        return sentences == []
    lead = len(text) - len(text.lstrip())
    stop = len(text.rstrip())
    joined = "".join(text[s.start : s.end] for s in sentences)
    contiguous = all(a.end == b.start for a, b in itertools.pairwise(sentences))
    return (
        contiguous and sentences[0].start == lead and sentences[-1].end == stop and joined == text[lead:stop]
    )


_pieces = st.sampled_from([
    "We compute the sum.", "So x = 3.", "Therefore y = 4.", "Wait, that is wrong!", "Is it?", "Let me list:",
    "- first item here", "2. second item", "$$a = b + c. Then d.$$", "\\[x^2. Y\\]", "$x. Y$", "ok.",
    "```python\nx = 1. Y = 2\n```", "e.g. this one.", "The value is 3.5 now.",
])  # fmt: skip
_seps = st.sampled_from([" ", "\n", "\n\n", "  \n\n  "])


@given(st.lists(st.tuples(_pieces, _seps), max_size=25))
def test_spans_tile_the_text_and_keep_atomic_units(parts):
    text = "".join(p + s for p, s in parts)
    sentences = split_sentences(text)
    assert _tiles(text, sentences)
    for atomic in ("$$a = b + c. Then d.$$", "\\[x^2. Y\\]", "```python\nx = 1. Y = 2\n```", "$x. Y$"):
        if atomic in text:
            assert any(atomic in t for t in _texts(text, sentences)), f"{atomic!r} was split"


def test_merge_rules():
    text = (
        "First we set up the equation carefully. Let me write the system:\n\n"
        "x + y = 10 and x - y = 2.\n\nTherefore x = 6 and y = 4 exactly. Ok. "
        "Now I check the result against both equations.\n\n- item one is here\n- item two is here"
    )
    got = _texts(text, split_sentences(text))
    assert got[0] == "First we set up the equation carefully."
    assert got[1].startswith("Let me write the system:") and got[1].endswith("x - y = 2."), (
        "':' joins the next"
    )
    assert got[1].count("Therefore") == 0 and got[2].startswith("Therefore x = 6"), "paragraph breaks win"
    assert "Ok." in got[2], "a fragment under 5 tokens joins its neighbour"
    assert got[-2:] == ["- item one is here", "- item two is here"], "list items stay separate and whole"
    assert _texts("We get 5. Thus the answer is 5.", split_sentences("We get 5. Thus the answer is 5.")) == [
        "We get 5. Thus the answer is 5."
    ], "a continuation opener joins the previous sentence"


@needs_shared
def test_real_trace_splits_without_breaking_math():
    record = json.loads((SHARED / "example_trace.jsonl").read_text().splitlines()[0])
    cot = record["cot"]
    sentences = split_sentences(cot)
    assert _tiles(cot, sentences) and 150 < len(sentences) < 800
    for t in _texts(cot, sentences):
        assert (
            t.count("\\(") == t.count("\\)") and t.count("\\[") == t.count("\\]") and t.count("$$") % 2 == 0
        )
