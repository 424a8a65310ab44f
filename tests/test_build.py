"""The build end to end: synthetic and real traces, the malformed-input catalogue, resume after a
kill, multiprocessing, stats, and the two CLI commands."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from test_format import SHARED, needs_shared

from data_builders.build import BuildConfig, Output, run_build
from data_builders.loaders import iter_raw_jsonl
from data_builders.stats import dataset_stats, predicted_peak_kv_ratio
from data_builders.synthetic import SyntheticConfig, as_raw_trace, synthetic_sample, synthetic_samples
from memento_train.cli import main
from memento_train.format import sample_from_record


def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_synthetic_tasks_need_earlier_blocks():
    config = SyntheticConfig(n_blocks=5, passcode_block=2, passcode_choices=4, seed=3)
    a, b = synthetic_sample(7, config), synthetic_sample(7, config)
    assert a.to_dict() == b.to_dict(), "deterministic for a seed"
    assert len(a.blocks) == len(a.mementos) == 5
    assert a.meta["passcode"] in a.blocks[2] and all(a.meta["passcode"] not in m for m in a.mementos)
    assert a.meta["reference_answer"] in a.answer
    assert synthetic_sample(7, SyntheticConfig(seed=4)).problem != a.problem
    with pytest.raises(ValueError):
        SyntheticConfig(passcode_block=9)


def test_gold_synthetic_build(tmp_path):
    counts = run_build(synthetic_samples(20), tmp_path, BuildConfig(), progress=False)
    assert counts == {"samples": 20, "rejects": 0, "skipped": 0}
    records = _lines(tmp_path / "samples.jsonl")
    assert all(sample_from_record(r).blocks == r["blocks"] for r in records)
    stats = dataset_stats(tmp_path)
    assert stats["samples"] == 20 and stats["blocks_per_trace"]["mean"] == 4
    assert 0 < stats["predicted_peak_kv_ratio"]["mean"] < 1 and 0 < stats["compression_ratio"] < 1


def test_raw_synthetic_build_segments_and_summarizes(tmp_path):
    raws = [as_raw_trace(s) for s in synthetic_samples(10, SyntheticConfig(n_blocks=6, filler=2))]
    run_build(raws, tmp_path, BuildConfig(min_block_tokens=40, max_block_tokens=120), progress=False)
    records = _lines(tmp_path / "samples.jsonl")
    assert len(records) == 10
    for record in records:
        meta = record["meta"]
        assert len(record["blocks"]) >= 2 and all(40 <= t <= 120 for t in meta["block_tokens"])
        assert all(m < b for m, b in zip(meta["memento_tokens"], meta["block_tokens"], strict=True))
        assert "\\boxed" in record["answer"]


@needs_shared
def test_real_trace_build(tmp_path):
    counts = run_build(
        iter_raw_jsonl(SHARED / "example_trace.jsonl"), tmp_path, BuildConfig(), progress=False
    )
    assert counts["samples"] == 1
    (record,) = _lines(tmp_path / "samples.jsonl")
    assert 4 <= len(record["blocks"]) <= 20 and all(200 <= t <= 1600 for t in record["meta"]["block_tokens"])
    assert 0.05 < record["meta"]["compression"] < 0.25
    assert record["answer"].startswith("\\boxed")


CATALOGUE = [
    ("missing_problem", {"id": "a", "cot": "x " * 300}, "load", "missing or empty field problem"),
    ("missing_cot", {"id": "b", "problem": "p"}, "load", "missing or empty field cot"),
    ("empty_cot", {"id": "c", "problem": "p", "cot": "   "}, "load", "missing or empty field cot"),
    ("only_think_tags", {"id": "d", "problem": "p", "cot": "<think> </think> 5"}, "load", "empty chain of thought"),
    ("no_think_end", {"id": "e", "problem": "p", "cot": "<think> reasoning " * 50}, "load", "no </think>"),
    ("problem_not_text", {"id": "f", "problem": 12, "cot": "x"}, "load", "missing or empty field problem"),
    ("too_short", {"id": "g", "problem": "p", "cot": "Short. <think>", "answer": "1"}, "load", "no </think>"),
    ("below_min_block", {"id": "h", "problem": "p", "cot": "Only a few words here.", "answer": "1"},
     "segment", "fewer than min_block_tokens"),
    ("one_20k_token_sentence", {"id": "i", "problem": "p", "cot": "word " * 20000, "answer": "1"},
     "segment", "largest sentence 20000 tokens"),
    ("no_answer_anywhere", {"id": "j", "problem": "p", "cot": "We reason at length here. " * 60},
     "validate", "no answer"),
    ("tags_in_reasoning", {"id": "k", "problem": "p", "answer": "1",
                           "cot": ("Step one is done. " * 40) + "<|summary_end|> " + ("More. " * 40)},
     "validate", "contains the tag"),
    ("duplicate_id", {"id": "l", "problem": "p", "cot": "Fine reasoning goes here. " * 60, "answer": "1"},
     "load", "duplicate id"),
]  # fmt: skip


def test_malformed_catalogue_becomes_rejects(tmp_path):
    path = tmp_path / "raw.jsonl"
    good = {"id": "good", "problem": "p", "cot": "Fine reasoning goes here. " * 60, "answer": "1"}
    lines = [json.dumps(good).encode()]
    lines += [json.dumps(record).encode() for _, record, _, _ in CATALOGUE]
    lines.append(json.dumps(CATALOGUE[-1][1]).encode())  # the duplicate
    lines += [b'{"id": "bad-json", "problem": ', b'["a list"]', b'{"id": "\xff\xfe bytes"}']
    path.write_bytes(b"\n".join(lines) + b"\n")
    counts = run_build(iter_raw_jsonl(path), tmp_path / "out", BuildConfig(), progress=False)
    rejects = {r["id"]: r for r in _lines(tmp_path / "out" / "rejects.jsonl")}
    for case, record, stage, reason in CATALOGUE[:-1]:
        assert rejects[record["id"]]["stage"] == stage, case
        assert reason in rejects[record["id"]]["reason"], (case, rejects[record["id"]]["reason"])
    assert "duplicate id" in rejects["l#duplicate1"]["reason"]
    by_reason = {r["reason"].split(" (")[0] for r in rejects.values()}
    assert "invalid JSON: Expecting value" in by_reason and any("not UTF-8" in r for r in by_reason)
    assert any("expected a JSON object" in r for r in by_reason)
    assert counts["samples"] == 2 and counts["rejects"] == len(CATALOGUE) + 3  # good + l; every bad line
    assert len(set(rejects)) == counts["rejects"], "one reject per bad record"


def test_partial_line_is_repaired_and_redone(tmp_path):
    run_build(synthetic_samples(5), tmp_path, BuildConfig(), progress=False)
    path = tmp_path / "samples.jsonl"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 40])  # a kill mid-write
    out = Output(tmp_path)
    out.close()
    assert len(out.done) == 4 and path.read_bytes().endswith(b"\n")
    counts = run_build(synthetic_samples(5), tmp_path, BuildConfig(), progress=False)
    assert counts["skipped"] == 4 and [r["id"] for r in _lines(path)] == [
        f"synthetic-0-{i}" for i in range(5)
    ]


def _cli_build(out, n, extra=()):
    return [sys.executable, "-m", "memento_train.cli", "build-data", "--format", "synthetic", "--as-raw",
            "--n", str(n), "--filler", "4", "--blocks", "8", "--min-block-tokens", "60", "--max-block-tokens",
            "300", "--checkpoint-every", "3", "--no-progress", "--output", str(out), *extra]  # fmt: skip


def test_kill_midway_then_resume_equals_uninterrupted(tmp_path):
    n = 400
    reference = tmp_path / "reference"
    subprocess.run(_cli_build(reference, n), check=True, capture_output=True)
    resumed = tmp_path / "resumed"
    proc = subprocess.Popen(_cli_build(resumed, n), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    samples = resumed / "samples.jsonl"
    deadline = time.time() + 60
    while time.time() < deadline and (not samples.exists() or samples.stat().st_size < 60_000):
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    partial = samples.read_bytes().count(b"\n")
    assert 0 < partial < n, "the kill must land midway"
    subprocess.run(_cli_build(resumed, n), check=True, capture_output=True)
    assert samples.read_bytes() == (reference / "samples.jsonl").read_bytes(), "identical, in order, no dupes"
    assert json.loads((resumed / "progress.json").read_text())["samples"] == n


def test_two_workers_match_one(tmp_path):
    raws = [as_raw_trace(s) for s in synthetic_samples(12, SyntheticConfig(n_blocks=6, filler=2))]
    config = BuildConfig(min_block_tokens=40, max_block_tokens=150)
    run_build(raws, tmp_path / "one", config, progress=False)
    run_build(raws, tmp_path / "two", BuildConfig(min_block_tokens=40, max_block_tokens=150, workers=2),
              progress=False)  # fmt: skip
    assert (tmp_path / "one" / "samples.jsonl").read_bytes() == (
        tmp_path / "two" / "samples.jsonl"
    ).read_bytes()


def test_predicted_peak_kv_ratio_by_hand():
    # 100 prompt + <think>; 3 blocks of 100 (+2 tags) each with a 10-token memento (+2); </think> + 10.
    total = 101 + 3 * 114 + 11
    peak = (
        101 + 2 * 14 + 102 + 11
    )  # last memento token: prompt, 2 old mementos+tags, block 3, <|summary_start|>+10
    assert predicted_peak_kv_ratio(100, [100] * 3, [10] * 3, 10) == pytest.approx(peak / total)


def test_cli_build_and_stats(tmp_path, capsys):
    out = tmp_path / "data"
    assert (
        main(["build-data", "--format", "synthetic", "--n", "8", "--output", str(out), "--no-progress"]) == 0
    )
    printed = capsys.readouterr().out
    assert "8 samples, 0 rejects" in printed and "predicted peak-KV ratio" in printed
    stats = json.loads((out / "stats.json").read_text())
    assert stats["samples"] == 8 and stats["build_config"]["min_block_tokens"] == 200
    assert (
        main(["build-data", "--format", "synthetic", "--n", "10", "--output", str(out), "--no-progress"]) == 0
    )
    assert "(8 already done, skipped)" in capsys.readouterr().out
    assert main(["stats", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["samples"] == 10
    with pytest.raises(SystemExit, match=r"no samples\.jsonl"):
        main(["stats", str(tmp_path / "missing")])
