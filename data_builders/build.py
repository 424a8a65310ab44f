"""The build: raw traces → split → score → segment → mementos → samples.jsonl, resumably.

Output directory:
  samples.jsonl   {id, problem, blocks, mementos, answer, source, meta}
  rejects.jsonl   {id, stage, reason}
  progress.json   counts at the last checkpoint
  stats.json      written at the end (data_builders.stats)

Re-running into the same directory skips every id already in samples or rejects; a line cut off
by a kill is dropped on restart and its trace redone, so nothing is duplicated or lost.
"""

from __future__ import annotations

import functools
import itertools
import json
import multiprocessing
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from memento_train.format import MementoFormatError, Sample

from .loaders import RawTrace, Reject
from .scorers import make_scorer
from .segment import LAMBDA, segment
from .sentences import approx_tokens, split_sentences
from .writers import make_writer


@dataclass
class BuildConfig:
    scorer: str = "heuristic"
    writer: str = "extractive"
    min_block_tokens: int = 200
    max_block_tokens: int | None = 1600
    lam: float = LAMBDA
    tokenizer: str | None = None  # HF name or dir for token counts; None: approximate counts
    gguf_file: str | None = None
    workers: int = 1
    checkpoint_every: int = 50
    scorer_options: dict[str, Any] = field(default_factory=dict)
    writer_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.min_block_tokens < 1:
            raise ValueError("min_block_tokens must be >= 1")
        if self.max_block_tokens is not None and self.max_block_tokens < self.min_block_tokens:
            raise ValueError("max_block_tokens must be >= min_block_tokens")
        if self.workers < 1 or self.checkpoint_every < 1:
            raise ValueError("workers and checkpoint_every must be >= 1")


@functools.lru_cache(maxsize=4)
def make_counter(tokenizer: str | None = None, gguf_file: str | None = None) -> Callable[[str], int]:
    """Token counts with the target tokenizer, or an approximate word/punctuation count."""
    if tokenizer is None:
        return approx_tokens
    from transformers import AutoTokenizer

    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    tok = AutoTokenizer.from_pretrained(tokenizer, **kwargs)
    return lambda text: len(tok(text, add_special_tokens=False)["input_ids"])


class Builder:
    """Turns one RawTrace into a sample record or a Reject; holds the scorer, writer and counter."""

    def __init__(self, config: BuildConfig):
        self.config = config
        self.count = make_counter(config.tokenizer, config.gguf_file)
        self.scorer = make_scorer(config.scorer, **config.scorer_options)
        self.writer = make_writer(config.writer, self.count, **config.writer_options)

    def __call__(self, raw: RawTrace) -> dict[str, Any] | Reject:
        cfg = self.config
        text = raw.cot
        sentences = split_sentences(text)
        if not sentences:
            return Reject(raw.id, "split", "empty chain of thought")
        texts = [s.text(text) for s in sentences]
        sizes = [self.count(t) for t in texts]
        try:
            scores = self.scorer(text, sentences)
        except Exception as err:  # a remote scorer that gave up after its retries
            return Reject(raw.id, "score", f"{type(err).__name__}: {err}")
        found = segment(sizes, scores, cfg.min_block_tokens, cfg.max_block_tokens, cfg.lam)
        if found is None:
            total, biggest = sum(sizes), max(sizes)
            if total < cfg.min_block_tokens:
                reason = f"trace has {total} tokens, fewer than min_block_tokens={cfg.min_block_tokens}"
            else:
                reason = (
                    f"no segmentation fits the limits (largest sentence {biggest} tokens, "
                    f"max_block_tokens={cfg.max_block_tokens})"
                )
            return Reject(raw.id, "segment", reason)
        bounds = [0, *found.cuts, len(sentences)]
        blocks = [
            text[sentences[a].start : sentences[b - 1].end].strip() for a, b in itertools.pairwise(bounds)
        ]
        try:
            split = [(texts[a:b], sizes[a:b]) for a, b in itertools.pairwise(bounds)]
            mementos = self.writer(raw.problem, blocks, split)
        except Exception as err:  # a remote writer that gave up after its retries
            return Reject(raw.id, "memento", f"{type(err).__name__}: {err}")
        if not raw.answer:
            return Reject(raw.id, "validate", "no answer: neither text after </think> nor an answer field")
        try:
            sample = Sample(raw.problem, blocks, mementos.texts, raw.answer).validate(raw.id)
        except MementoFormatError as err:
            return Reject(raw.id, "validate", str(err))
        block_tokens = [sum(sizes[a:b]) for a, b in itertools.pairwise(bounds)]
        memento_tokens = [self.count(m) for m in sample.mementos]
        meta = {
            **raw.meta,
            "scorer": cfg.scorer,
            "writer": cfg.writer,
            "cut_scores": [scores[c - 1] for c in found.cuts],
            "objective": round(found.objective, 6),
            "block_tokens": block_tokens,
            "memento_tokens": memento_tokens,
            "compression": round(sum(memento_tokens) / max(1, sum(block_tokens)), 4),
            "judge_scores": mementos.scores,
            "refine_rounds": mementos.rounds,
        }
        return sample_record(raw.id, sample, raw.source, meta)


def sample_record(trace_id: str, sample: Sample, source: str, meta: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": trace_id,
        "problem": sample.problem,
        "blocks": sample.blocks,
        "mementos": sample.mementos,
        "answer": sample.answer,
        "source": source,
        "meta": meta,
    }


def _repair(path: Path) -> set[str]:
    """Drop a trailing line cut off by a kill; return the ids already written."""
    if not path.exists():
        return set()
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        data = data[: data.rfind(b"\n") + 1]
        path.write_bytes(data)
    return {json.loads(line)["id"] for line in data.splitlines() if line.strip()}


class Output:
    """Append-only JSONL output with checkpoints; knows which ids are finished."""

    def __init__(self, directory: str | Path, checkpoint_every: int = 50):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.samples_path, self.rejects_path = self.dir / "samples.jsonl", self.dir / "rejects.jsonl"
        written, rejected = _repair(self.samples_path), _repair(self.rejects_path)
        self.done = written | rejected
        self.counts = {"samples": len(written), "rejects": len(rejected)}
        self.checkpoint_every = checkpoint_every
        self._since = 0
        self._samples = self.samples_path.open("a", encoding="utf-8")
        self._rejects = self.rejects_path.open("a", encoding="utf-8")

    def write(self, item: dict[str, Any] | Reject) -> None:
        if isinstance(item, Reject):
            self._rejects.write(json.dumps(item.to_dict(), ensure_ascii=False) + "\n")
            self.counts["rejects"] += 1
            self.done.add(item.id)
        else:
            self._samples.write(json.dumps(item, ensure_ascii=False) + "\n")
            self.counts["samples"] += 1
            self.done.add(item["id"])
        self._since += 1
        if self._since >= self.checkpoint_every:
            self.checkpoint()

    def checkpoint(self) -> None:
        for handle in (self._samples, self._rejects):
            handle.flush()
            os.fsync(handle.fileno())
        (self.dir / "progress.json").write_text(json.dumps(self.counts))
        self._since = 0

    def close(self) -> None:
        self.checkpoint()
        self._samples.close()
        self._rejects.close()


_WORKER: Builder | None = None


def _init_worker(config: BuildConfig) -> None:
    global _WORKER
    _WORKER = Builder(config)


def _work(raw: RawTrace) -> dict[str, Any] | Reject:
    assert _WORKER is not None
    return _WORKER(raw)


def run_build(
    items: Iterable[RawTrace | Sample | Reject | tuple[str, Sample | Reject]],
    output: str | Path,
    config: BuildConfig,
    progress: bool = True,
    total: int | None = None,
) -> dict[str, int]:
    """Build every item not yet in `output`; raw traces go through the builder, annotated samples
    (OpenMementos, example JSONs, synthetic) are validated and written as they are."""
    from tqdm import tqdm

    out = Output(output, config.checkpoint_every)
    seen: dict[str, int] = {}  # id -> times seen in this input
    skipped = 0

    def pending() -> Iterator[RawTrace]:
        nonlocal skipped
        for item in items:
            trace_id, payload = _identify(item)
            if trace_id in seen:  # rejected under its own id, so that a resumed run skips it too
                seen[trace_id] += 1
                trace_id = f"{trace_id}#duplicate{seen[_identify(item)[0]] - 1}"
                payload = Reject(trace_id, "load", "duplicate id: an earlier record has the same id")
            else:
                seen[trace_id] = 1
            if trace_id in out.done:
                skipped += 1
            elif isinstance(payload, RawTrace):
                yield payload
            elif isinstance(payload, Reject):
                out.write(payload)
            else:
                out.write(_annotated_record(trace_id, payload, config))

    bar = tqdm(total=total, desc="build-data", unit="trace", disable=not progress)
    try:
        if config.workers > 1:
            ctx = multiprocessing.get_context("spawn")
            with ctx.Pool(config.workers, initializer=_init_worker, initargs=(config,)) as pool:
                for result in pool.imap(_work, pending(), chunksize=4):
                    out.write(result)
                    bar.update()
        else:
            builder = Builder(config)
            for raw in pending():
                out.write(builder(raw))
                bar.update()
    finally:
        bar.close()
        out.close()
    return {**out.counts, "skipped": skipped}


def _identify(item) -> tuple[str, Any]:
    if isinstance(item, tuple):
        return item
    if isinstance(item, (RawTrace, Reject)):
        return item.id, item
    if isinstance(item, Sample):
        return str(item.meta.get("id")), item
    raise TypeError(f"cannot build from {type(item).__name__}")


def _annotated_record(trace_id: str, sample: Sample, config: BuildConfig) -> dict[str, Any] | Reject:
    try:
        sample.validate(trace_id)
    except MementoFormatError as err:
        return Reject(trace_id, "validate", str(err))
    count = make_counter(config.tokenizer, config.gguf_file)
    block_tokens = [count(b) for b in sample.blocks]
    memento_tokens = [count(m) for m in sample.mementos]
    meta = {
        **{k: v for k, v in sample.meta.items() if k not in ("id", "source")},
        "writer": "given",
        "block_tokens": block_tokens,
        "memento_tokens": memento_tokens,
        "compression": round(sum(memento_tokens) / max(1, sum(block_tokens)), 4),
    }
    return sample_record(trace_id, sample, str(sample.meta.get("source", "")), meta)


def config_dict(config: BuildConfig) -> dict[str, Any]:
    return asdict(config)
