"""Training data: completion-only labels, best-fit-decreasing packing, dropping (never cutting)
over-long samples, and the collator's padding."""

import json

from hypothesis import given
from hypothesis import strategies as st
from train_helpers import write_samples

from memento_train.data import (
    IGNORE,
    PAD_DOCUMENT,
    MementoCollator,
    best_fit_decreasing,
    packed_rows,
    tokenize_record,
    tokenized_dataset,
)
from memento_train.format import sample_from_record
from memento_train.tokens import render_chat
from memento_train.toy_tokenizer import build_tokenizer


@given(st.lists(st.integers(1, 100), max_size=60), st.integers(100, 300))
def test_best_fit_decreasing_places_everything_within_capacity(lengths, capacity):
    rows = best_fit_decreasing(lengths, capacity)
    placed = sorted(i for row in rows for i in row)
    assert placed == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in row) <= capacity for row in rows)
    # no two rows could be merged (a property of any-fit packing)
    loads = sorted(sum(lengths[i] for i in row) for row in rows)
    assert len(loads) < 2 or loads[0] + loads[1] > capacity


def _tokenizer(path):
    texts = []
    for line in path.read_text().splitlines():
        r = json.loads(line)
        texts += [r["problem"], *r["blocks"], *r["mementos"], r["answer"]]
    return build_tokenizer(texts, 400)


def test_labels_cover_exactly_the_completion(tmp_path):
    data = write_samples(tmp_path / "s.jsonl", 3)
    tokenizer = _tokenizer(data)
    record = json.loads(data.read_text().splitlines()[0])
    out = tokenize_record(record, tokenizer)
    prompt, completion = render_chat(sample_from_record(record), tokenizer)
    n_prompt = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    assert out["labels"][:n_prompt] == [IGNORE] * n_prompt
    assert out["labels"][n_prompt:] == out["input_ids"][n_prompt:]
    assert tokenizer.decode(out["input_ids"][n_prompt:]) == completion


def test_packing_positions_documents_and_drops(tmp_path):
    data = write_samples(tmp_path / "s.jsonl", 12)
    long_record = json.loads(data.read_text().splitlines()[0])
    long_record["id"] = "too-long"
    long_record["blocks"] = [b * 30 for b in long_record["blocks"]]
    broken = {**long_record, "id": "broken", "mementos": []}
    with data.open("a") as handle:
        handle.write(json.dumps(long_record) + "\n" + json.dumps(broken) + "\n")
    tokenizer = _tokenizer(data)
    dataset = tokenized_dataset([str(data)], tokenizer)
    rows, report = packed_rows(dataset, 1024, packing=True)
    assert (report.samples, report.too_long, report.invalid, report.kept) == (14, 1, 1, 12)
    assert report.rows < 12 and report.real_fraction > 0.5
    total_docs = 0
    for row in rows:
        assert len(row["input_ids"]) <= 1024
        docs = row["document_ids"]
        total_docs += len(set(docs))
        for d in set(docs):
            positions = [p for p, doc in zip(row["position_ids"], docs, strict=True) if doc == d]
            assert positions == list(range(len(positions))), "positions restart in every document"
    assert total_docs == 12
    unpacked, unpacked_report = packed_rows(dataset, 1024, packing=False)
    assert len(unpacked) == 12 and unpacked_report.real_fraction == 1.0


def test_collator_padding():
    rows = [{"input_ids": [5, 6, 7], "labels": [-100, 6, 7], "position_ids": [0, 1, 2], "document_ids": [0, 0, 0]},
            {"input_ids": [8], "labels": [8], "position_ids": [0], "document_ids": [0]}]  # fmt: skip
    batch = MementoCollator(pad_token_id=1, pad_to_multiple_of=4)(rows)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 1], [8, 1, 1, 1]]
    assert batch["labels"][1].tolist() == [8, IGNORE, IGNORE, IGNORE]
    assert batch["document_ids"][1].tolist() == [0, PAD_DOCUMENT, PAD_DOCUMENT, PAD_DOCUMENT]
