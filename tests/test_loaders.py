"""Loaders: raw JSONL/HF datasets with field maps, OpenMementos (default and full) through the real
`datasets.load_dataset` path on local files, official example JSONs."""

import json

import datasets
import pytest
from test_format import SHARED, needs_shared

from data_builders.loaders import (
    RawTrace,
    Reject,
    iter_hf_raw,
    iter_openmementos,
    iter_raw_jsonl,
    iter_segment_jsons,
    parse_field_map,
    split_think,
)
from memento_train.format import Sample, render_response

B, BE, S, SE = "<|block_start|>", "<|block_end|>", "<|summary_start|>", "<|summary_end|>"
RESPONSE = (
    f"<think>\n{B}First part.{BE}\n{S}m1{SE}\n{B}Second part.{BE}\n{S}m2{SE}\n</think>\n\nThe answer is 4."
)


@needs_shared
def test_official_raw_trace_shape():
    items = list(iter_raw_jsonl(SHARED / "example_trace.jsonl"))
    assert len(items) == 1 and isinstance(items[0], RawTrace)
    trace = items[0]
    assert trace.id == "ot3-train-0000030" and trace.problem and "<think>" not in trace.cot
    assert trace.answer.startswith("\\boxed{ -12\\sqrt{2}") and trace.meta == {}
    assert "Final Answer" not in trace.cot[-200:], "the answer section moves out of the reasoning"
    assert trace.source  # source/domain kept


def test_field_map_and_think_extraction(tmp_path):
    path = tmp_path / "raw.jsonl"
    path.write_text(
        json.dumps({"uid": 7, "question": "Q?", "generation": "plain reasoning", "final": "42"}) + "\n"
    )
    fields = parse_field_map("id=uid,problem=question,cot=generation,answer=final")
    (trace,) = iter_raw_jsonl(path, fields)
    assert (trace.id, trace.problem, trace.cot, trace.answer) == ("7", "Q?", "plain reasoning", "42")
    assert split_think("<think> a b </think> ans") == ("a b", "ans")
    with pytest.raises(ValueError, match="bad --fields entry"):
        parse_field_map("nonsense=col")


def test_hf_dataset_raw_from_local_parquet(tmp_path):
    rows = [
        {"id": f"r{i}", "problem": f"p{i}", "response": f"<think>reasoning {i}</think>answer {i}"}
        for i in range(3)
    ]
    path = tmp_path / "raw.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    items = list(iter_hf_raw("local", data_files=[str(path)]))
    assert [t.id for t in items] == ["r0", "r1", "r2"] and items[1].answer == "answer 1"


def _openmementos_rows():
    sentences = ["First part.", "Still first.", "Second part."]
    good = {
        "problem": "What is 2+2?", "response": RESPONSE, "domain": "math", "source": "s", "difficulty": 1,
        "sentences": sentences, "blocks": [[0, 1], [2, 2]], "block_summaries": ["m1", "m2"],
    }  # fmt: skip
    bad_default = {**good, "response": f"<think>{B}x{BE}</think>y"}
    bad_full = {**good, "blocks": [[0, 1], [2, 9]]}
    return good, bad_default, bad_full


@pytest.mark.parametrize("suffix", ["parquet", "jsonl"])
def test_openmementos_default_and_full(tmp_path, suffix):
    good, bad_default, bad_full = _openmementos_rows()
    path = tmp_path / f"om.{suffix}"
    ds = datasets.Dataset.from_list([good, bad_default, bad_full])
    ds.to_parquet(str(path)) if suffix == "parquet" else ds.to_json(str(path))
    default = dict(iter_openmementos(config="default", data_files=[str(path)]))
    samples = [v for v in default.values() if isinstance(v, Sample)]
    rejects = [v for v in default.values() if isinstance(v, Reject)]
    assert len(samples) == 2 and len(rejects) == 1 and "has no memento" in rejects[0].reason
    assert samples[0].blocks == ["First part.", "Second part."] and samples[0].meta["domain"] == "math"
    full = list(iter_openmementos(config="full", data_files=[str(path)]))
    full_samples = [v for _, v in full if isinstance(v, Sample)]
    assert full_samples[0].blocks == ["First part. Still first.", "Second part."]
    assert full_samples[0].mementos == ["m1", "m2"] and full_samples[0].answer == "The answer is 4."
    assert any(isinstance(v, Reject) and "blocks[1]" in v.reason for _, v in full)
    with pytest.raises(ValueError, match="default' or 'full"):
        next(iter_openmementos(config="other", data_files=[str(path)]))


@needs_shared
def test_segment_jsons():
    items = dict(iter_segment_jsons(sorted(SHARED.glob("example_*.json"))))
    assert set(items) == {"example_code", "example_response", "example_science"}
    assert all(isinstance(s, Sample) and render_response(s) for s in items.values())
