"""Training data: samples → token ids with completion-only labels (datasets.map, cached), packing
by best-fit decreasing with per-document positions and ids, and the collator."""

from __future__ import annotations

import bisect
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .format import MementoFormatError, render_response, sample_from_record
from .tokens import chat_template_of, render_chat

IGNORE = -100
PAD_DOCUMENT = -1


def _read_samples(files: list[str], signature: list[tuple[str, float, int]]):
    """Generator for datasets.Dataset.from_generator; `signature` (path, mtime, size) is part of the
    fingerprint, so an edited file is re-read instead of served from a stale cache."""
    del signature
    for path in files:
        with open(path, encoding="utf-8") as handle:
            for lineno, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                record = json.loads(line)
                yield {
                    "id": str(record.get("id") or f"{Path(path).name}:{lineno}"),
                    "problem": record["problem"],
                    "blocks": record["blocks"],
                    "mementos": record["mementos"],
                    "answer": record["answer"],
                }


def load_samples_dataset(files: list[str]):
    import datasets

    missing = [f for f in files if not Path(f).is_file()]
    if missing:
        raise FileNotFoundError(f"data file(s) not found: {', '.join(missing)}")
    signature = [(str(Path(f).resolve()), os.path.getmtime(f), os.path.getsize(f)) for f in files]
    return datasets.Dataset.from_generator(
        _read_samples, gen_kwargs={"files": [s[0] for s in signature], "signature": signature}
    )


def tokenize_record(record: dict[str, Any], tokenizer: Any) -> dict[str, Any]:
    """Prompt through the chat template (no loss), completion with loss on every token."""
    record = {key: record[key] for key in ("id", "problem", "blocks", "mementos", "answer")}  # a datasets row
    try:
        sample = sample_from_record(record, where=record["id"])
    except MementoFormatError as err:
        return {"input_ids": [], "labels": [], "length": 0, "error": str(err)}
    prompt, completion = render_chat(sample, tokenizer)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    completion_ids = tokenizer(completion, add_special_tokens=False)["input_ids"]
    ids = prompt_ids + completion_ids
    return {
        "input_ids": ids,
        "labels": [IGNORE] * len(prompt_ids) + completion_ids,
        "length": len(ids),
        "error": "",
    }


@dataclass
class DataReport:
    samples: int
    invalid: int
    too_long: int
    kept: int
    rows: int
    real_tokens: int
    row_tokens: int

    @property
    def real_fraction(self) -> float:
        return self.real_tokens / max(1, self.row_tokens)


def _tokenizer_signature(tokenizer: Any) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    body = backend.to_str() if backend is not None else json.dumps(tokenizer.get_vocab(), sort_keys=True)
    return hashlib.sha256((body + chat_template_of(tokenizer)).encode()).hexdigest()


def tokenized_dataset(files: list[str], tokenizer: Any, num_proc: int = 1):
    """Tokenized through datasets.map and cached on disk under an explicit fingerprint: the data
    files (path, mtime, size), the tokenizer (vocabulary, merges, chat template) and this code."""
    import inspect

    raw = load_samples_dataset(files)
    code = (
        inspect.getsource(tokenize_record)
        + inspect.getsource(render_chat)
        + inspect.getsource(render_response)
    )
    fingerprint = hashlib.sha256(
        f"{raw._fingerprint}|{_tokenizer_signature(tokenizer)}|{code}".encode()
    ).hexdigest()
    return raw.map(
        tokenize_record,
        fn_kwargs={"tokenizer": tokenizer},
        remove_columns=["problem", "blocks", "mementos", "answer"],
        num_proc=num_proc if num_proc > 1 else None,
        new_fingerprint=fingerprint[:16],
        desc="tokenize",
    )


def best_fit_decreasing(lengths: list[int], capacity: int) -> list[list[int]]:
    """Rows of sample indices, each summing to at most `capacity` tokens: longest first, each into
    the fullest row it still fits (a sorted list of free space makes each placement O(log rows))."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    free: list[tuple[int, int]] = []  # (free space, row index), sorted
    rows: list[list[int]] = []
    for i in order:
        pos = bisect.bisect_left(free, (lengths[i], -1))
        if pos < len(free):
            space, row = free.pop(pos)
        else:
            space, row = capacity, len(rows)
            rows.append([])
        rows[row].append(i)
        bisect.insort(free, (space - lengths[i], row))
    return rows


def packed_rows(dataset, max_seq_len: int, packing: bool) -> tuple[list[dict[str, list[int]]], DataReport]:
    """Rows ready for the collator. Samples longer than `max_seq_len` are dropped and counted, never
    cut (a cut could split a block from its memento)."""
    lengths = dataset["length"]
    errors = dataset["error"]
    valid = [i for i, (n, e) in enumerate(zip(lengths, errors, strict=True)) if not e and n > 0]
    kept = [i for i in valid if lengths[i] <= max_seq_len]
    groups = (
        best_fit_decreasing([lengths[i] for i in kept], max_seq_len)
        if packing
        else [[k] for k in range(len(kept))]
    )
    ids_col, labels_col = dataset["input_ids"], dataset["labels"]
    rows = []
    for group in groups:
        row: dict[str, list[int]] = {"input_ids": [], "labels": [], "position_ids": [], "document_ids": []}
        for doc, local in enumerate(sorted(group)):
            index = kept[local]
            n = lengths[index]
            row["input_ids"] += ids_col[index]
            row["labels"] += labels_col[index]
            row["position_ids"] += list(range(n))
            row["document_ids"] += [doc] * n
        rows.append(row)
    row_tokens = len(rows) * max_seq_len if packing else sum(len(r["input_ids"]) for r in rows)
    report = DataReport(
        samples=len(lengths), invalid=len(lengths) - len(valid), too_long=len(valid) - len(kept), kept=len(kept),
        rows=len(rows), real_tokens=sum(lengths[i] for i in kept), row_tokens=row_tokens,
    )  # fmt: skip
    return rows, report


class RowsDataset(torch.utils.data.Dataset):
    def __init__(self, rows: list[dict[str, list[int]]]):
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, list[int]]:
        return self.rows[i]


@dataclass
class MementoCollator:
    """Right-pads a batch; padding gets label −100, position 0 and its own document id (−1), so it
    never attends to, or is attended by, real tokens. `pad_to_multiple_of=128` suits FlexAttention."""

    pad_token_id: int
    pad_to_multiple_of: int | None = None
    fixed_length: int | None = None

    def __call__(self, rows: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
        length = self.fixed_length or max(len(r["input_ids"]) for r in rows)
        if self.pad_to_multiple_of:
            length = -(-length // self.pad_to_multiple_of) * self.pad_to_multiple_of
        pads = {
            "input_ids": self.pad_token_id,
            "labels": IGNORE,
            "position_ids": 0,
            "document_ids": PAD_DOCUMENT,
        }
        batch = {}
        for key, pad in pads.items():
            batch[key] = torch.tensor(
                [r[key] + [pad] * (length - len(r[key])) for r in rows], dtype=torch.long
            )
        return batch
