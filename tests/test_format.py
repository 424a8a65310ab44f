"""The trace format: canonical render, tolerant parse, the malformed-input catalogue, loaders."""

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memento_train.format import (
    ALL_TAGS,
    MementoFormatError,
    Sample,
    load_samples,
    parse_response,
    render_response,
    sample_from_record,
)

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "memento_examples"
EXAMPLE_JSONS = ["example_response.json", "example_code.json", "example_science.json"]
needs_shared = pytest.mark.skipif(
    not SHARED.is_dir(), reason=f"real examples not found at {SHARED} (../shared is absent in this checkout)"
)

B, BE, S, SE = "<|block_start|>", "<|block_end|>", "<|summary_start|>", "<|summary_end|>"


def test_shipped_example_round_trips():
    from memento_train.cli import example_trace_path

    sample = load_samples(str(example_trace_path()))[0]
    text = render_response(sample)
    assert render_response(parse_response(text, sample.problem)) == text
    assert len(sample.blocks) == 4


@needs_shared
@pytest.mark.parametrize("name", EXAMPLE_JSONS)
def test_real_examples_render_parse_render_identical(name):
    record = json.loads((SHARED / name).read_text())
    sample = sample_from_record(record, where=name)
    assert len(sample.blocks) == len([s for s in record["segments"] if s["type"] == "block"])
    text = render_response(sample)
    again = parse_response(text, sample.problem)
    assert render_response(again) == text
    assert (
        again.blocks == sample.blocks and again.mementos == sample.mementos and again.answer == sample.answer
    )


@needs_shared
def test_real_example_whitespace_variants_parse_the_same():
    sample = load_samples(str(SHARED / "example_response.json"))[0]
    text = render_response(sample)
    spaced = (
        text.replace(B, f"\n\n{B} ").replace(BE, f" {BE}\n").replace(S, f" {S}  ").replace(SE, f"\t{SE}\n\n")
    )
    assert render_response(parse_response(spaced, sample.problem)) == text


_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=30).filter(
    lambda t: t.strip() and not any(tag in t for tag in ALL_TAGS) and "<" not in t
)


@st.composite
def samples(draw):
    n = draw(st.integers(1, 5))
    return Sample(
        problem=draw(_text),
        blocks=draw(st.lists(_text, min_size=n, max_size=n)),
        mementos=draw(st.lists(_text, min_size=n, max_size=n)),
        answer=draw(_text),
    )


_ws = st.sampled_from(["", " ", "\n", "\n\n", " \t ", "\r\n"])


@given(samples(), st.data())
def test_parse_is_tolerant_of_whitespace_and_inverts_render(sample, data):
    text = render_response(sample)
    assert parse_response(text, sample.problem).to_dict() == sample.to_dict()
    # Re-insert random whitespace around every tag: the parse must not change.
    noisy = text
    for tag in ALL_TAGS:
        noisy = noisy.replace(tag, data.draw(_ws) + tag + data.draw(_ws))
    assert render_response(parse_response(noisy, sample.problem)) == text


@given(
    st.lists(st.sampled_from([B, BE, S, SE, "<think>", "</think>", "x", " ", "\n"]), max_size=40).map("".join)
)
def test_parse_never_crashes_on_arbitrary_tag_soup(text):
    try:
        sample = parse_response(text)
    except MementoFormatError as err:
        assert err.problem and (err.offset is None or 0 <= err.offset <= len(text))
    else:
        assert sample.blocks and len(sample.blocks) == len(sample.mementos)


GOOD = f"<think>\n{B}a{BE}\n{S}m{SE}\n</think>\nanswer"

MALFORMED = [
    ("nested_block", f"<think>{B}a{B}b{BE}{S}m{SE}</think>x", "nested <|block_start|>"),
    ("block_end_without_block", f"<think>{BE}{S}m{SE}</think>x", "<|block_end|> without an open block"),
    ("summary_before_any_block", f"<think>{S}m{SE}{B}a{BE}</think>x", "no block before it"),
    ("second_summary_for_a_block", f"<think>{B}a{BE}{S}m{SE}{S}n{SE}</think>x", "no block before it"),
    (
        "new_block_without_memento",
        f"<think>{B}a{BE}{B}b{BE}{S}m{SE}</think>x",
        "new block while block 1 has no memento",
    ),
    ("empty_memento", f"<think>{B}a{BE}{S}  \n{SE}</think>x", "memento 1 is empty"),
    ("empty_block", f"<think>{B} {BE}{S}m{SE}</think>x", "block 1 is empty"),
    ("missing_think_end", f"<think>{B}a{BE}{S}m{SE}", "missing </think>"),
    ("block_tag_inside_memento", f"<think>{B}a{BE}{S}m{B}b{SE}</think>x", "inside a memento"),
    ("nested_summary", f"<think>{B}a{BE}{S}m{S}n{SE}</think>x", "nested <|summary_start|>"),
    ("summary_inside_block", f"<think>{B}a{S}m{SE}{BE}</think>x", "inside block 1"),
    ("summary_end_without_start", f"<think>{B}a{BE}m{SE}</think>x", "stray text"),
    ("lone_summary_end", f"<think>{B}a{BE}{S}m{SE}{SE}</think>x", "<|summary_end|> without an open memento"),
    ("unclosed_block_at_think_end", f"<think>{B}a</think>x", "</think> inside block 1"),
    ("unclosed_memento_at_think_end", f"<think>{B}a{BE}{S}m</think>x", "</think> inside memento 1"),
    ("last_block_without_memento", f"<think>{B}a{BE}</think>x", "</think> while block 1 has no memento"),
    ("no_blocks", "<think>just thinking</think>x", "stray text"),
    ("no_blocks_at_all", "<think></think>x", "no blocks before </think>"),
    ("second_think", f"<think>{B}a{BE}{S}m{SE}<think></think>x", "second <think>"),
    ("tag_in_answer", f"<think>{B}a{BE}{S}m{SE}</think>x{B}", "after </think>"),
    ("empty_answer", f"<think>{B}a{BE}{S}m{SE}</think>  \n", "empty answer"),
    ("text_before_think", f"hello<think>{B}a{BE}{S}m{SE}</think>x", "stray text before <think>"),
    ("text_between_memento_and_block", f"<think>{B}a{BE}{S}m{SE}oops{B}b{BE}{S}n{SE}</think>x", "stray text"),
    ("memento_still_open_at_end", f"<think>{B}a{BE}{S}m", "a memento is still open"),
    ("block_still_open_at_end", f"<think>{B}a", "a block is still open"),
]


def test_good_trace_parses():
    sample = parse_response(GOOD, "p")
    assert (sample.blocks, sample.mementos, sample.answer) == (["a"], ["m"], "answer")


@pytest.mark.parametrize(("case", "text", "message"), MALFORMED, ids=[c[0] for c in MALFORMED])
def test_malformed_catalogue(case, text, message):
    with pytest.raises(MementoFormatError) as info:
        parse_response(text, where="trace.jsonl:7")
    err = info.value
    assert message in str(err)
    assert str(err).startswith("trace.jsonl:7: "), "errors name where the trace came from"
    assert err.offset is not None and 0 <= err.offset <= len(text)
    assert "at character" in str(err)


def test_catalogue_has_distinct_problems():
    assert len({m for _, _, m in MALFORMED}) >= 12


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"problem": "p", "blocks": ["a"], "mementos": [], "answer": "x"}, "1 blocks but 0 mementos"),
        ({"problem": "p", "blocks": ["a"], "mementos": [""], "answer": "x"}, "mementos[0] is empty"),
        ({"problem": "p", "blocks": [f"a{SE}"], "mementos": ["m"], "answer": "x"}, "contains the tag"),
        ({"problem": "", "blocks": ["a"], "mementos": ["m"], "answer": "x"}, "'problem' is empty"),
        ({"problem": "p", "blocks": ["a"], "mementos": ["m"]}, "missing string field(s) answer"),
        ({"problem": "p", "segments": [{"type": "summary", "text": "m"}]}, "summary with no block"),
        (
            {"problem": "p", "segments": [{"type": "block", "text": "a"}, {"type": "block", "text": "b"}]},
            "no summary",
        ),
        ({"problem": "p", "segments": [{"kind": "block"}]}, "needs 'type'"),
        ({"question": "p"}, "unknown record shape"),
        ([1, 2], "expected a JSON object"),
    ],
)
def test_bad_records(record, message):
    with pytest.raises(MementoFormatError, match="rec:") as info:
        sample_from_record(record, where="rec")
    assert message in str(info.value)


def test_openmementos_row_shape():
    row = {"problem": "p", "response": GOOD, "domain": "math", "source": "s", "difficulty": 3}
    sample = sample_from_record(row)
    assert sample.meta == {"domain": "math", "source": "s", "difficulty": 3}


def test_load_samples_errors_name_file_and_line(tmp_path):
    good = json.dumps({"problem": "p", "response": GOOD})
    path = tmp_path / "t.jsonl"
    path.write_text(good + "\n\n" + "{not json\n")
    with pytest.raises(MementoFormatError, match=r"t\.jsonl:3: invalid JSON"):
        load_samples(str(path))
    path.write_text(good + "\n" + json.dumps({"problem": "p", "response": "<think>x"}) + "\n")
    with pytest.raises(MementoFormatError, match=r"t\.jsonl:2: "):
        load_samples(str(path))
    empty = tmp_path / "e.json"
    empty.write_text("  \n")
    with pytest.raises(MementoFormatError, match="file is empty"):
        load_samples(str(empty))
    binary = tmp_path / "b.txt"
    binary.write_bytes(b"\xff\xfe<think>")
    with pytest.raises(MementoFormatError, match="not UTF-8"):
        load_samples(str(binary))
    with pytest.raises(MementoFormatError, match="no such file"):
        load_samples(str(tmp_path / "missing.json"))
    raw = tmp_path / "r.txt"
    raw.write_text(GOOD)
    assert load_samples(str(raw))[0].blocks == ["a"]
    listed = tmp_path / "l.json"
    listed.write_text(json.dumps([{"problem": "p", "response": GOOD}, {"problem": "p"}]))
    with pytest.raises(MementoFormatError, match=r"l\.json\[1\]"):
        load_samples(str(listed))


@needs_shared
def test_official_raw_trace_is_not_a_memento_trace():
    """example_trace.jsonl is raw CoT (input of the data builders): refused with a clear reason."""
    with pytest.raises(MementoFormatError, match=r"example_trace\.jsonl:1: unknown record shape"):
        load_samples(str(SHARED / "example_trace.jsonl"))
