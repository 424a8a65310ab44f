"""Boundary scorers (heuristic, attention) and the extractive memento writer."""

import json

import pytest
from models import tiny_model
from test_format import SHARED, needs_shared

from data_builders.attention_scorer import AttentionScorer
from data_builders.scorers import HeuristicScorer, kl_divergence, kl_to_score, make_scorer
from data_builders.sentences import approx_tokens, split_sentences
from data_builders.synthetic import synthetic_sample
from data_builders.writers import ExtractiveWriter, make_writer
from memento_train.toy_tokenizer import build_tokenizer

TRACE = (
    "We need the area of the triangle with sides 3, 4 and 5. The sides satisfy 9 + 16 = 25.\n\n"
    "So it is a right triangle with legs 3 and 4. The area is 3 * 4 / 2 = 6.\n\n"
    "Wait, let me check whether the hypotenuse could be a different side. Only 5 is longest.\n\n"
    "The product of the legs is computed as:\n12 divided by 2 gives 6.\n\n"
    "Alternatively, Heron's formula gives s = 6 and area = sqrt(6 * 3 * 2 * 1) = 6."
)


def test_heuristic_scores():
    sentences = split_sentences(TRACE)
    texts = [s.text(TRACE) for s in sentences]
    scores = HeuristicScorer()(TRACE, sentences)
    assert len(scores) == len(sentences) - 1 and all(0 <= s <= 3 for s in scores)

    def before(prefix):
        return next(scores[i - 1] for i, t in enumerate(texts) if i and t.startswith(prefix))

    assert before("Wait, let me") == 3, "a strong cue after a paragraph break and a result"
    assert before("Alternatively") == 3
    assert before("So it is a right") >= 1
    assert any(t.startswith("The product of the legs is computed as:\n12") for t in texts), (
        "':' joins the next"
    )
    assert HeuristicScorer()(TRACE, sentences) == scores, "deterministic"


def test_heuristic_never_cuts_inside_a_calculation():
    text = "The total is 5 + 7 =\n\n12 which we keep. Next we move on to the other part of the question."
    sentences = split_sentences(text)
    texts = [s.text(text) for s in sentences]
    scores = HeuristicScorer()(text, sentences)
    for i, t in enumerate(texts[:-1]):
        if t.rstrip().endswith(("=", ":", "+")):
            assert scores[i] == 0


def test_kl_helpers():
    assert kl_divergence([0.5, 0.5], [0.5, 0.5]) == pytest.approx(0)
    assert kl_divergence([1.0, 0.0], [0.5, 0.5]) == pytest.approx(0.6931, abs=1e-3)
    assert [kl_to_score(x, 0.35) for x in (0.1, 0.2, 0.4, 0.8)] == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="unknown scorer"):
        make_scorer("nope")


def test_attention_scorer_on_a_tiny_model():
    tokenizer = build_tokenizer([TRACE], vocab_size=300)
    model = tiny_model("llama", attn_implementation="sdpa", vocab_size=len(tokenizer))
    sentences = split_sentences(TRACE)
    loose = AttentionScorer(model, tokenizer, threshold=1e-12)(TRACE, sentences)
    strict = AttentionScorer(model, tokenizer, threshold=1e6)(TRACE, sentences)
    assert len(loose) == len(sentences) - 1 and all(0 <= s <= 3 for s in loose)
    assert strict == [0] * len(strict) and sum(loose) > 0, "the threshold decides what is a boundary"
    windowed = AttentionScorer(model, tokenizer, threshold=1e-12, max_tokens=40)(TRACE, sentences)
    assert len(windowed) == len(loose), "traces longer than the model window are scored in windows"
    with pytest.raises(ValueError, match="needs a local model"):
        AttentionScorer()


def _check_memento(block: str, memento: str, low=0.10, high=0.20):
    b, m = approx_tokens(block), approx_tokens(memento)
    assert m < b, "never the whole block"
    assert m <= high * b + 8, f"memento too long: {m}/{b}"
    return m / b


@needs_shared
def test_extractive_on_real_blocks():
    record = json.loads((SHARED / "example_response.json").read_text())
    blocks = [s["text"] for s in record["segments"] if s["type"] == "block"]
    mementos = ExtractiveWriter()("problem", blocks)
    ratios = [_check_memento(b, m) for b, m in zip(blocks, mementos.texts, strict=True)]
    assert all(r >= 0.05 for r in ratios), ratios


def test_extractive_keeps_state_bearing_sentences():
    sample = synthetic_sample(0)
    text = " ".join(sample.blocks) + " Thus the final answer is \\boxed{42}."
    memento = make_writer("extractive")("p", [text]).texts[0]
    assert "\\boxed{42}" in memento
    assert "=" in memento
    _check_memento(text, memento)


def test_extractive_tiny_block_is_clipped_not_copied():
    block = "Compute 17 * 3 = 51 and remember the result for the next step of the solution."
    memento = ExtractiveWriter()("p", [block]).texts[0]
    assert memento != block and memento.endswith("…")
