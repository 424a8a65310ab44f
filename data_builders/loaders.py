"""Loaders: raw chain-of-thought traces and already-annotated memento data, from files or HF datasets.

Every loader yields `RawTrace`, `Sample` or `Reject` items: a bad record never stops a build and
never disappears; it becomes a reject naming where it came from and why.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memento_train.format import THINK_END, THINK_START, MementoFormatError, Sample, parse_response

DEFAULT_FIELDS: dict[str, tuple[str, ...]] = {
    "id": ("id", "task_id", "uid"),
    "problem": ("problem", "question", "prompt", "input"),
    "cot": ("cot", "response", "reasoning", "completion", "output", "generation"),
    "answer": ("answer", "final_answer", "solution_answer"),
    "source": ("source", "dataset", "domain"),
}


@dataclass
class RawTrace:
    id: str
    problem: str
    cot: str  # the reasoning alone, without <think> tags
    answer: str  # what follows </think>, or the record's answer field
    source: str = ""
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Reject:
    id: str
    stage: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"id": self.id, "stage": self.stage, "reason": self.reason}


def parse_field_map(spec: str | None) -> dict[str, tuple[str, ...]]:
    """`problem=question,cot=response` → field map overriding the defaults."""
    fields = dict(DEFAULT_FIELDS)
    for item in filter(None, (spec or "").split(",")):
        key, _, name = item.partition("=")
        if key.strip() not in DEFAULT_FIELDS or not name.strip():
            raise ValueError(
                f"bad --fields entry {item!r}: use KEY=COLUMN with KEY in {', '.join(DEFAULT_FIELDS)}"
            )
        fields[key.strip()] = (name.strip(),)
    return fields


def _pick(record: dict[str, Any], names: tuple[str, ...]) -> Any:
    for name in names:
        if name in record and record[name] is not None:
            return record[name]
    return None


def split_think(text: str) -> tuple[str, str]:
    """(reasoning, answer) from a response that may wrap its reasoning in <think> … </think>."""
    if THINK_START in text or THINK_END in text:
        if THINK_END not in text:
            raise MementoFormatError("no </think>: the reasoning never ends")
        head, _, answer = text.partition(THINK_END)
        return head.replace(THINK_START, "", 1).strip(), answer.strip()
    return text.strip(), ""


_FINAL_ANSWER = re.compile(r"\n[ \t]*(?:\*\*|#+ *)?Final Answer(?:\*\*)?:?(?:\*\*)?[ \t]*\n?", re.IGNORECASE)
_BOXED_LINE = re.compile(r"^.*\\boxed\{.*$", re.MULTILINE)


def split_final_answer(reasoning: str) -> tuple[str, str]:
    """Traces that put the answer inside the reasoning (OpenThoughts: '**Final Answer**' before
    </think>): split off the last Final Answer section, or else copy the last \\boxed line."""
    heads = list(_FINAL_ANSWER.finditer(reasoning))
    if heads:
        head = heads[-1]
        answer = reasoning[head.end() :].strip()
        if answer:
            return reasoning[: head.start()].strip(), answer
    boxed = list(_BOXED_LINE.finditer(reasoning))
    return reasoning, boxed[-1].group().strip() if boxed else ""


def raw_from_record(record: Any, fields: dict[str, tuple[str, ...]], fallback_id: str) -> RawTrace | Reject:
    if not isinstance(record, dict):
        return Reject(fallback_id, "load", f"expected a JSON object, got {type(record).__name__}")
    trace_id = str(_pick(record, fields["id"]) or fallback_id)
    problem, cot = _pick(record, fields["problem"]), _pick(record, fields["cot"])
    for key, value in (("problem", problem), ("cot", cot)):
        if not isinstance(value, str) or not value.strip():
            wanted = "/".join(fields[key])
            return Reject(trace_id, "load", f"missing or empty field {key} (looked for: {wanted})")
    try:
        reasoning, tail = split_think(cot)
    except MementoFormatError as err:
        return Reject(trace_id, "load", str(err))
    if not reasoning:
        return Reject(trace_id, "load", "empty chain of thought")
    answer = tail or str(_pick(record, fields["answer"]) or "").strip()
    if not answer:
        reasoning, answer = split_final_answer(reasoning)
    source = str(_pick(record, fields["source"]) or "")
    used = {name for key in fields for name in fields[key]}
    meta = {k: v for k, v in record.items() if k not in used and isinstance(v, (str, int, float, bool))}
    return RawTrace(trace_id, problem.strip(), reasoning, answer, source, meta)


def iter_jsonl(path: str | Path) -> Iterator[tuple[str, Any]]:
    """(where, record) per line; undecodable lines yield (where, Reject)."""
    path = Path(path)
    with path.open("rb") as handle:
        for lineno, raw in enumerate(handle, 1):
            where = f"{path.name}:{lineno}"
            if not raw.strip():
                continue
            try:
                yield where, json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as err:
                yield where, Reject(where, "load", f"not UTF-8 (byte {err.start} of the line)")
            except json.JSONDecodeError as err:
                yield where, Reject(where, "load", f"invalid JSON: {err.msg} (column {err.colno})")


def iter_raw_jsonl(
    path: str | Path, fields: dict[str, tuple[str, ...]] | None = None
) -> Iterator[RawTrace | Reject]:
    fields = fields or DEFAULT_FIELDS
    for where, record in iter_jsonl(path):
        yield record if isinstance(record, Reject) else raw_from_record(record, fields, where)


def _load_dataset(name: str, config: str | None, split: str, data_files: list[str] | None):
    import datasets

    if data_files:
        suffix = Path(data_files[0]).suffix.lstrip(".")
        builder = {"jsonl": "json", "json": "json", "parquet": "parquet", "csv": "csv"}.get(suffix)
        if builder is None:
            raise ValueError(f"cannot load {data_files[0]}: use .jsonl, .json, .parquet or .csv")
        return datasets.load_dataset(builder, data_files=data_files, split=split)
    return datasets.load_dataset(name, config, split=split)


def iter_hf_raw(
    name: str,
    split: str = "train",
    config: str | None = None,
    fields: dict[str, tuple[str, ...]] | None = None,
    data_files: list[str] | None = None,
) -> Iterator[RawTrace | Reject]:
    """Any HF dataset (hub name, or local files through the same `datasets.load_dataset` path)."""
    fields = fields or DEFAULT_FIELDS
    for index, record in enumerate(_load_dataset(name, config, split, data_files)):
        yield raw_from_record(record, fields, f"{name}[{index}]")


def openmementos_sample(record: dict[str, Any], config: str, where: str) -> Sample:
    """One OpenMementos row: `default` parses `response`; `full` assembles blocks from `sentences`,
    `blocks` ([start, end] sentence indices, inclusive) and `block_summaries`."""
    meta = {k: record.get(k) for k in ("domain", "source", "difficulty") if k in record}
    if config == "default":
        return parse_response(record.get("response"), str(record.get("problem") or ""), meta, where).validate(
            where
        )
    sentences, spans, summaries = record.get("sentences"), record.get("blocks"), record.get("block_summaries")
    if not isinstance(sentences, list) or not isinstance(spans, list) or not isinstance(summaries, list):
        raise MementoFormatError(
            "config 'full' needs list fields sentences, blocks and block_summaries", where=where
        )
    if len(spans) != len(summaries):
        raise MementoFormatError(f"{len(spans)} blocks but {len(summaries)} block_summaries", where=where)
    blocks = []
    for i, span in enumerate(spans):
        if not (isinstance(span, list) and len(span) == 2 and 0 <= span[0] <= span[1] < len(sentences)):
            raise MementoFormatError(
                f"blocks[{i}] = {span!r} is not [start, end] within the sentences", where=where
            )
        blocks.append(" ".join(str(s).strip() for s in sentences[span[0] : span[1] + 1]))
    answer = ""
    if isinstance(record.get("response"), str):
        answer = split_think(record["response"])[1]
    sample = Sample(str(record.get("problem") or ""), blocks, [str(s) for s in summaries], answer, meta)
    return sample.validate(where)


def iter_openmementos(
    name: str = "microsoft/OpenMementos",
    config: str = "default",
    split: str = "train",
    data_files: list[str] | None = None,
) -> Iterator[tuple[str, Sample | Reject]]:
    if config not in ("default", "full"):
        raise ValueError(f"OpenMementos config must be 'default' or 'full', got {config!r}")
    for index, record in enumerate(_load_dataset(name, config, split, data_files)):
        trace_id = str(record.get("id") or f"openmementos-{split}-{index}")
        try:
            yield trace_id, openmementos_sample(record, config, f"{name}[{index}]")
        except MementoFormatError as err:
            yield trace_id, Reject(trace_id, "load", str(err))


def iter_segment_jsons(paths: Iterable[str | Path]) -> Iterator[tuple[str, Sample | Reject]]:
    """The official Memento example generations (`segments`)."""
    from memento_train.format import load_samples

    for path in paths:
        trace_id = Path(path).stem
        try:
            for sample in load_samples(str(path)):
                yield trace_id, sample
        except MementoFormatError as err:
            yield trace_id, Reject(trace_id, "load", str(err))
