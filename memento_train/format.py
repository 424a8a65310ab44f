"""The memento trace format: special tokens, the `Sample` schema, canonical render and tolerant parse.

A trace's assistant turn is ``<think>`` + (block, memento)* + ``</think>`` + answer (design.md §1).
Parsing accepts any whitespace around the tags; rendering always writes one canonical layout, so
render → parse → render is the identity and training data never depends on a source's spacing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

BLOCK_START = "<|block_start|>"
BLOCK_END = "<|block_end|>"
SUMMARY_START = "<|summary_start|>"
SUMMARY_END = "<|summary_end|>"
THINK_START = "<think>"
THINK_END = "</think>"
MEMENTO_TAGS = (BLOCK_START, BLOCK_END, SUMMARY_START, SUMMARY_END)
ALL_TAGS = (*MEMENTO_TAGS, THINK_START, THINK_END)

_TAG_RE = re.compile("|".join(re.escape(t) for t in ALL_TAGS))


class MementoFormatError(ValueError):
    """A trace that does not follow the format; names the problem, where it is, and what is there."""

    def __init__(self, problem: str, offset: int | None = None, text: str | None = None, where: str = ""):
        self.problem = problem
        self.offset = offset
        self.excerpt = _excerpt(text, offset) if text is not None and offset is not None else ""
        self.where = where
        msg = f"{where}: {problem}" if where else problem
        if offset is not None:
            msg += f" (at character {offset}"
            msg += f": {self.excerpt})" if self.excerpt else ")"
        super().__init__(msg)


def _excerpt(text: str, offset: int, radius: int = 40) -> str:
    lo, hi = max(0, offset - radius), min(len(text), offset + radius)
    return ("…" if lo else "") + repr(text[lo:hi])[1:-1] + ("…" if hi < len(text) else "")


@dataclass(frozen=True)
class MementoTokens:
    """Token ids of the format's tags in one tokenizer."""

    block_start: int
    block_end: int
    summary_start: int
    summary_end: int
    think_start: int | None = None
    think_end: int | None = None

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> MementoTokens:
        ids = {}
        for name, tag in zip(
            ("block_start", "block_end", "summary_start", "summary_end", "think_start", "think_end"),
            ALL_TAGS,
            strict=True,
        ):
            encoded = tokenizer.encode(tag, add_special_tokens=False)
            if len(encoded) != 1:
                if name.startswith("think"):
                    ids[name] = None
                    continue
                raise MementoFormatError(
                    f"tokenizer encodes {tag!r} as {len(encoded)} tokens, not one; "
                    "call memento_train.tokens.add_memento_tokens(tokenizer, model) first"
                )
            ids[name] = encoded[0]
        return cls(**ids)

    @property
    def memento_ids(self) -> tuple[int, int, int, int]:
        return (self.block_start, self.block_end, self.summary_start, self.summary_end)


@dataclass
class Sample:
    """One problem solved as blocks of reasoning, each closed by a memento, then an answer."""

    problem: str
    blocks: list[str]
    mementos: list[str]
    answer: str
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.problem = self.problem.strip()
        self.blocks = [b.strip() for b in self.blocks]
        self.mementos = [m.strip() for m in self.mementos]
        self.answer = self.answer.strip()

    def validate(self, where: str = "", require_problem: bool = True) -> Sample:
        """Raise MementoFormatError unless the sample renders into a parseable trace
        (and, for training data, has a problem to condition on)."""

        def fail(problem: str) -> None:
            raise MementoFormatError(problem, where=where)

        if require_problem and not self.problem:
            fail("field 'problem' is empty")
        if not self.blocks:
            fail("field 'blocks' is empty: a memento trace needs at least one block")
        if len(self.blocks) != len(self.mementos):
            fail(
                f"{len(self.blocks)} blocks but {len(self.mementos)} mementos: every block needs one memento"
            )
        for kind, texts in (("blocks", self.blocks), ("mementos", self.mementos)):
            for i, text in enumerate(texts):
                if not text:
                    fail(f"{kind}[{i}] is empty")
                tag = _TAG_RE.search(text)
                if tag:
                    fail(f"{kind}[{i}] contains the tag {tag.group()!r} at character {tag.start()}")
        if not self.answer:
            fail("field 'answer' is empty")
        tag = _TAG_RE.search(self.answer) or _TAG_RE.search(self.problem)
        if tag:
            fail(f"problem or answer contains the tag {tag.group()!r}")
        return self

    def to_dict(self) -> dict[str, Any]:
        return {
            "problem": self.problem,
            "blocks": list(self.blocks),
            "mementos": list(self.mementos),
            "answer": self.answer,
            "meta": dict(self.meta),
        }


def render_response(sample: Sample) -> str:
    """The canonical assistant turn: one tag layout, whatever the source's whitespace was."""
    sample.validate(require_problem=False)
    parts = [THINK_START]
    for block, memento in zip(sample.blocks, sample.mementos, strict=True):
        parts.append(f"{BLOCK_START}{block}{BLOCK_END}")
        parts.append(f"{SUMMARY_START}{memento}{SUMMARY_END}")
    parts.append(THINK_END)
    return "\n".join(parts) + "\n\n" + sample.answer


def parse_response(
    text: str, problem: str = "", meta: dict[str, Any] | None = None, where: str = ""
) -> Sample:
    """Parse an assistant turn (OpenMementos `response`, generated text) into a Sample.

    Whitespace around tags is free; everything else must follow the grammar, and the first
    violation raises MementoFormatError with its character offset. A missing leading ``<think>``
    is accepted (Qwen3-style prompts end with it, so generations start after it).
    """
    if not isinstance(text, str):
        raise MementoFormatError(f"response must be a string, got {type(text).__name__}", where=where)

    def fail(problem_text: str, offset: int) -> None:
        raise MementoFormatError(problem_text, offset, text, where)

    blocks: list[str] = []
    mementos: list[str] = []
    state = "start"  # start | think | block | after_block | memento | done
    cursor = 0  # end of the previous tag
    open_at = 0  # offset of the tag that opened the current block/memento
    answer = ""
    for match in _TAG_RE.finditer(text):
        tag, at = match.group(), match.start()
        between = text[cursor:at]
        if state in ("start", "think", "after_block") and between.strip():
            where_text = (
                "before <think>"
                if state == "start" and tag == THINK_START
                else "outside any block or memento"
            )
            fail(f"stray text {where_text}", cursor + len(between) - len(between.lstrip()))
        if state == "done":
            fail(f"tag {tag} after </think>: the answer must not contain format tags", at)

        if tag == THINK_START:
            if state != "start":
                fail("second <think>: a trace has exactly one reasoning section", at)
            state = "think"
        elif tag == BLOCK_START:
            if state == "block":
                fail("nested <|block_start|>: the block opened earlier has no <|block_end|>", at)
            if state == "memento":
                fail("tag <|block_start|> inside a memento", at)
            if state == "after_block":
                fail(f"new block while block {len(blocks)} has no memento", at)
            state, open_at = "block", at
        elif tag == BLOCK_END:
            if state != "block":
                fail("<|block_end|> without an open block", at)
            if not between.strip():
                fail(f"block {len(blocks) + 1} is empty", open_at)
            blocks.append(between)
            state = "after_block"
        elif tag == SUMMARY_START:
            if state == "block":
                fail(f"<|summary_start|> inside block {len(blocks) + 1}: close the block first", at)
            if state == "memento":
                fail("nested <|summary_start|> inside a memento", at)
            if state != "after_block":
                fail("<|summary_start|> with no block before it that lacks a memento", at)
            state, open_at = "memento", at
        elif tag == SUMMARY_END:
            if state != "memento":
                fail("<|summary_end|> without an open memento", at)
            if not between.strip():
                fail(f"memento {len(mementos) + 1} is empty", open_at)
            mementos.append(between)
            state = "think"
        elif tag == THINK_END:
            if state == "block":
                fail(f"</think> inside block {len(blocks) + 1}: the block has no <|block_end|>", at)
            if state == "memento":
                fail(f"</think> inside memento {len(mementos) + 1}: it has no <|summary_end|>", at)
            if state == "after_block":
                fail(f"</think> while block {len(blocks)} has no memento", at)
            if not blocks:
                fail("no blocks before </think>: a memento trace needs at least one block", at)
            state = "done"
            answer = text[match.end() :]
        cursor = match.end()

    if state != "done":
        open_what = {"block": "a block is still open", "memento": "a memento is still open"}.get(state, "")
        fail("missing </think>" + (f" ({open_what})" if open_what else ""), len(text))
    if not answer.strip():
        fail("empty answer after </think>", len(text))
    return Sample(problem=problem, blocks=blocks, mementos=mementos, answer=answer, meta=dict(meta or {}))


def sample_from_segments(record: dict[str, Any], where: str = "") -> Sample:
    """The official Memento example JSON: ``segments`` = [{type: block|summary|answer, block_idx, text}]."""
    blocks: list[str] = []
    mementos: list[str] = []
    answers: list[str] = []
    segments = record.get("segments")
    if not isinstance(segments, list) or not segments:
        raise MementoFormatError("field 'segments' must be a non-empty list", where=where)
    for i, seg in enumerate(segments):
        kind, text = (seg.get("type"), seg.get("text")) if isinstance(seg, dict) else (None, None)
        if kind not in ("block", "summary", "answer") or not isinstance(text, str):
            raise MementoFormatError(
                f"segments[{i}] needs 'type' in block|summary|answer and a string 'text'", where=where
            )
        if answers and kind != "answer":
            raise MementoFormatError(f"segments[{i}] is a {kind} after the answer", where=where)
        if kind == "block":
            if len(blocks) != len(mementos):
                raise MementoFormatError(f"segments[{i}]: block {len(blocks)} has no summary", where=where)
            blocks.append(text)
        elif kind == "summary":
            if len(blocks) != len(mementos) + 1:
                raise MementoFormatError(f"segments[{i}]: summary with no block before it", where=where)
            mementos.append(text)
        else:
            answers.append(text)
    meta = {k: v for k, v in record.items() if k not in ("segments", "problem")}
    sample = Sample(
        problem=str(record.get("problem", "")),
        blocks=blocks,
        mementos=mementos,
        answer="\n".join(answers),
        meta=meta,
    )
    return sample.validate(where)


def sample_from_record(record: Any, where: str = "") -> Sample:
    """Any of the shapes we read: our own samples, OpenMementos rows, official example JSONs."""
    if not isinstance(record, dict):
        raise MementoFormatError(f"expected a JSON object, got {type(record).__name__}", where=where)
    if "segments" in record:
        return sample_from_segments(record, where)
    if "blocks" in record and "mementos" in record:
        missing = [k for k in ("problem", "answer") if not isinstance(record.get(k), str)]
        if missing:
            raise MementoFormatError(f"missing string field(s) {', '.join(missing)}", where=where)
        if not all(isinstance(x, str) for x in [*record["blocks"], *record["mementos"]]):
            raise MementoFormatError("'blocks' and 'mementos' must be lists of strings", where=where)
        meta = dict(record.get("meta") or {})
        meta.update(
            {k: v for k, v in record.items() if k not in ("problem", "blocks", "mementos", "answer", "meta")}
        )
        return Sample(
            record["problem"], record["blocks"], record["mementos"], record["answer"], meta
        ).validate(where)
    if "response" in record:
        meta = {k: v for k, v in record.items() if k not in ("problem", "response")}
        sample = parse_response(record["response"], str(record.get("problem", "")), meta, where)
        return sample.validate(where)
    raise MementoFormatError(
        "unknown record shape: expected 'segments', 'blocks'+'mementos', or 'response' "
        f"(found keys: {', '.join(sorted(record)) or 'none'})",
        where=where,
    )


def load_samples(path: str, where_prefix: str | None = None) -> list[Sample]:
    """Read samples from .json (one object or a list), .jsonl, or a raw response in any other file.

    Errors name the file and line (JSONL) or item (JSON list) of the bad record.
    """
    import json
    from pathlib import Path

    file = Path(path)
    name = where_prefix or str(file)
    if not file.is_file():
        raise MementoFormatError(f"no such file: {file}")
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise MementoFormatError(f"not UTF-8 text (byte {err.start})", where=name) from None
    if not text.strip():
        raise MementoFormatError("file is empty", where=name)
    if file.suffix == ".jsonl":
        samples = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise MementoFormatError(
                    f"invalid JSON: {err.msg} (column {err.colno})", where=f"{name}:{lineno}"
                ) from None
            samples.append(sample_from_record(record, where=f"{name}:{lineno}"))
        return samples
    if file.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise MementoFormatError(f"invalid JSON: {err.msg} (line {err.lineno})", where=name) from None
        if isinstance(data, list):
            return [sample_from_record(r, where=f"{name}[{i}]") for i, r in enumerate(data)]
        return [sample_from_record(data, where=name)]
    return [parse_response(text, where=name)]  # a raw assistant turn: no problem attached
