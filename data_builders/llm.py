"""Language-model steps of the builder: boundary scoring and memento writing with judge + refine.

Backends: any OpenAI-compatible endpoint (base URL, key from an environment variable) or a local
transformers model, behind one `complete(messages) -> str`. Every structured answer is JSON that
is validated (shape and counts); transport errors, timeouts, malformed JSON and wrong counts are
retried with exponential backoff, then raised as `LLMError` (the build turns that into a reject).
Validated answers are cached on disk by a hash of the request, so a rerun costs no calls.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .scorers import MAX_SCORE
from .sentences import Sentence
from .writers import Mementos

Message = dict[str, str]


class LLMError(RuntimeError):
    """An LLM step that failed after all its retries."""


class OpenAIBackend:
    """POST {base_url}/chat/completions; the API key is read from `api_key_env`, never stored."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str = "OPENAI_API_KEY",
        timeout: float = 120.0,
        temperature: float = 0.0,
        max_tokens: int = 4096,
    ):
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.api_key_env = model, api_key_env
        self.timeout, self.temperature, self.max_tokens = timeout, temperature, max_tokens

    def identity(self) -> str:
        return f"openai:{self.url}:{self.model}:{self.temperature}"

    def complete(self, messages: list[Message]) -> str:
        body = {
            "model": self.model,
            "messages": messages,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.api_key_env)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        request = urllib.request.Request(self.url, json.dumps(body).encode(), headers, method="POST")
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
            payload = json.loads(response.read().decode("utf-8"))
        try:
            return payload["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise ValueError(f"response has no choices[0].message.content: {str(payload)[:200]}") from None


class TransformersBackend:
    """A local causal LM with a chat template; greedy decoding, so the same prompt gives the same text."""

    def __init__(
        self, model: Any, tokenizer: Any = None, max_new_tokens: int = 1024, gguf_file: str | None = None
    ):
        if isinstance(model, str):
            from transformers import AutoModelForCausalLM, AutoTokenizer

            kwargs = {"gguf_file": gguf_file} if gguf_file else {}
            tokenizer = tokenizer or AutoTokenizer.from_pretrained(model, **kwargs)
            self.name = model
            model = AutoModelForCausalLM.from_pretrained(model, **kwargs)
        else:
            self.name = type(model).__name__
        self.model, self.tokenizer, self.max_new_tokens = model.eval(), tokenizer, max_new_tokens

    def identity(self) -> str:
        return f"transformers:{self.name}"

    def complete(self, messages: list[Message]) -> str:
        import torch

        from memento_train.tokens import chat_template_of

        ids = self.tokenizer.apply_chat_template(
            messages,
            add_generation_prompt=True,
            return_tensors="pt",
            chat_template=chat_template_of(self.tokenizer),
            return_dict=True,
        )["input_ids"]
        with torch.no_grad():
            out = self.model.generate(
                ids,
                max_new_tokens=self.max_new_tokens,
                do_sample=False,
                pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id,
            )
        return self.tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


def make_backend(kind: str, **options) -> OpenAIBackend | TransformersBackend:
    if kind == "llm":
        if not options.get("base_url") or not options.get("model"):
            raise ValueError("the llm backend needs base_url and model (--llm-base-url, --llm-model)")
        return OpenAIBackend(**options)
    if kind == "model":
        if not options.get("model"):
            raise ValueError("the model backend needs a local model name or directory (--model)")
        return TransformersBackend(**options)
    raise ValueError(f"unknown backend {kind!r}")


def extract_json(text: str) -> Any:
    """The first JSON object in a reply, tolerating ```json fences and prose around it."""
    fenced = re.search(r"```(?:json)?\s*(.*?)```", text, re.DOTALL)
    candidate = fenced.group(1) if fenced else text
    start = candidate.find("{")
    if start < 0:
        raise ValueError("no JSON object in the reply")
    obj, _ = json.JSONDecoder().raw_decode(candidate[start:])
    return obj


class JSONClient:
    """complete → parse → validate, with retries, backoff and an on-disk cache of validated replies."""

    def __init__(
        self,
        backend: Any,
        retries: int = 3,
        backoff: float = 1.0,
        max_backoff: float = 30.0,
        cache_dir: str | Path | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.backend, self.retries, self.backoff, self.max_backoff = backend, retries, backoff, max_backoff
        self.cache = Path(cache_dir) if cache_dir else None
        self.sleep = sleep
        self.calls = 0

    def _key(self, messages: list[Message]) -> str:
        blob = json.dumps([self.backend.identity(), messages], sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(blob.encode()).hexdigest()

    def ask(self, messages: list[Message], validate: Callable[[Any], str | None]) -> Any:
        key = self._key(messages)
        if self.cache is not None and (self.cache / f"{key}.json").exists():
            return json.loads((self.cache / f"{key}.json").read_text(encoding="utf-8"))
        errors: list[str] = []
        conversation = list(messages)
        for attempt in range(self.retries + 1):
            if attempt:
                self.sleep(min(self.max_backoff, self.backoff * 2 ** (attempt - 1)))
            self.calls += 1
            try:
                reply = self.backend.complete(conversation)
            except urllib.error.HTTPError as err:
                errors.append(f"HTTP {err.code}")
                if err.code < 500 and err.code != 429:
                    break  # a client error will not get better by retrying
                continue
            except (urllib.error.URLError, TimeoutError, OSError, ValueError) as err:
                errors.append(f"{type(err).__name__}: {getattr(err, 'reason', err)}")
                continue
            try:
                value = extract_json(reply)
            except ValueError as err:
                errors.append(f"malformed JSON ({err})")
                continue
            problem = validate(value)
            if problem:
                errors.append(problem)
                conversation = [
                    *messages,
                    {"role": "assistant", "content": reply},
                    {
                        "role": "user",
                        "content": f"That reply is invalid: {problem}. Answer again, JSON only.",
                    },
                ]
                continue
            if self.cache is not None:
                self.cache.mkdir(parents=True, exist_ok=True)
                (self.cache / f"{key}.json").write_text(
                    json.dumps(value, ensure_ascii=False), encoding="utf-8"
                )
            return value
        raise LLMError(f"gave up after {len(errors)} attempts: {'; '.join(errors)}")


SCORER_SYSTEM = (
    "You segment chain-of-thought reasoning into blocks. A good block boundary falls where one "
    "coherent step of reasoning ends and another begins (a new approach, a verification, a new "
    "sub-problem), never inside a calculation or right after a colon or an equals sign."
)


def _list_validator(key: str, expected: int, item_ok: Callable[[Any], bool], item_rule: str):
    """Validates {key: [exactly `expected` items, each item_ok]}; returns the problem, or None."""

    def validate(value: Any) -> str | None:
        items = value.get(key) if isinstance(value, dict) else None
        if not isinstance(items, list):
            return f'expected {{"{key}": [...]}}'
        if len(items) != expected:
            return f"expected exactly {expected} {key}, got {len(items)}"
        if not all(item_ok(item) for item in items):
            return item_rule
        return None

    return validate


def _scores_validator(expected: int) -> Callable[[Any], str | None]:
    return _list_validator(
        "scores",
        expected,
        lambda s: isinstance(s, int) and not isinstance(s, bool) and 0 <= s <= MAX_SCORE,
        f"every score must be an integer from 0 to {MAX_SCORE}",
    )


class LLMScorer:
    """Windowed boundary scoring: each window lists numbered sentences and asks for one score per
    boundary; overlapping windows are merged by trusting the window where a boundary is most central."""

    name = "llm"

    def __init__(
        self, window: int = 40, overlap: int = 10, concurrency: int = 4, max_chars: int = 600, **client
    ):
        if not 0 <= overlap < window:
            raise ValueError("need 0 <= overlap < window")
        backend = client.pop("backend", None) or make_backend("llm", **client.pop("backend_options", {}))
        self.client = JSONClient(backend, **client)
        self.window, self.overlap, self.concurrency, self.max_chars = window, overlap, concurrency, max_chars

    def _ask(self, texts: list[str]) -> list[int]:
        listing = "\n".join(f"[{i + 1}] {t[: self.max_chars]}" for i, t in enumerate(texts))
        prompt = (
            f"Sentences of a reasoning trace:\n{listing}\n\nFor each of the {len(texts) - 1} boundaries between "
            f"sentence k and k+1 (k = 1..{len(texts) - 1}), rate it as a block boundary from 0 (never) to 3 (ideal). "
            f'Reply with JSON only: {{"scores": [{len(texts) - 1} integers]}}.'
        )
        messages = [{"role": "system", "content": SCORER_SYSTEM}, {"role": "user", "content": prompt}]
        return self.client.ask(messages, _scores_validator(len(texts) - 1))["scores"]

    def __call__(self, text: str, sentences: list[Sentence]) -> list[int]:
        n = len(sentences)
        if n < 2:
            return []
        texts = [s.text(text) for s in sentences]
        step = self.window - self.overlap
        starts = list(range(0, max(1, n - self.overlap), step))
        windows = [(a, min(n, a + self.window)) for a in starts if min(n, a + self.window) - a >= 2]
        with ThreadPoolExecutor(self.concurrency) as pool:
            results = list(pool.map(lambda w: self._ask(texts[w[0] : w[1]]), windows))
        best: list[tuple[float, int]] = [(-1.0, 0)] * (n - 1)
        for (a, b), scores in zip(windows, results, strict=True):
            for k, score in enumerate(scores):
                boundary = a + k  # between sentence a+k and a+k+1
                centrality = min(k + 1, b - a - 1 - k)
                if centrality > best[boundary][0]:
                    best[boundary] = (centrality, score)
        return [score for _, score in best]


WRITER_SYSTEM = (
    "You write mementos: terse summaries of one block of reasoning that keep exactly the state needed "
    "to continue without the block: definitions, formulas, computed values, decisions and dead ends. "
    "No narration. About 10-20% of the block's length."
)


def _mementos_validator(expected: int) -> Callable[[Any], str | None]:
    return _list_validator("mementos", expected, lambda m: isinstance(m, str) and bool(m.strip()),
                           "every memento must be a non-empty string")  # fmt: skip


def _judge_validator(value: Any) -> str | None:
    score = value.get("score") if isinstance(value, dict) else None
    if not isinstance(score, (int, float)) or isinstance(score, bool) or not 0 <= score <= 10:
        return 'expected {"score": 0-10, "feedback": "..."}'
    return None


def _memento_validator(value: Any) -> str | None:
    memento = value.get("memento") if isinstance(value, dict) else None
    return None if isinstance(memento, str) and memento.strip() else 'expected {"memento": "..."}'


class LLMWriter:
    """One compressor call per trace, a 0–10 judge per memento, and up to `rounds` refinements of
    each memento the judge scores below `threshold`, with the judge's feedback."""

    name = "llm"

    def __init__(self, backend: Any, threshold: float = 8.0, rounds: int = 2, concurrency: int = 4, **client):
        self.client = JSONClient(backend, **client)
        self.threshold, self.rounds, self.concurrency = threshold, rounds, concurrency

    def _judge(self, problem: str, block: str, memento: str) -> dict[str, Any]:
        prompt = (
            f"Problem:\n{problem}\n\nBlock of reasoning:\n{block}\n\nMemento:\n{memento}\n\n"
            "Score from 0 to 10 how well the memento alone lets one continue the reasoning (all values, "
            'formulas and decisions kept; terse). Reply with JSON only: {"score": N, "feedback": "..."}.'
        )
        return self.client.ask(
            [{"role": "system", "content": WRITER_SYSTEM}, {"role": "user", "content": prompt}],
            _judge_validator,
        )

    def _refine(self, problem: str, block: str, memento: str, feedback: str) -> str:
        prompt = (
            f"Problem:\n{problem}\n\nBlock of reasoning:\n{block}\n\nCurrent memento:\n{memento}\n\n"
            f'A reviewer said: {feedback}\nWrite a better memento. Reply with JSON only: {{"memento": "..."}}.'
        )
        return self.client.ask(
            [{"role": "system", "content": WRITER_SYSTEM}, {"role": "user", "content": prompt}],
            _memento_validator,
        )["memento"].strip()

    def _polish(self, problem: str, block: str, memento: str) -> tuple[str, float, int]:
        verdict = self._judge(problem, block, memento)
        rounds = 0
        while verdict["score"] < self.threshold and rounds < self.rounds:
            rounds += 1
            memento = self._refine(problem, block, memento, str(verdict.get("feedback", "")))
            verdict = self._judge(problem, block, memento)
        return memento, float(verdict["score"]), rounds

    def __call__(self, problem: str, blocks: list[str], split=None) -> Mementos:
        listing = "\n\n".join(f"[Block {i + 1}]\n{b}" for i, b in enumerate(blocks))
        prompt = (
            f"Problem:\n{problem}\n\n{listing}\n\nWrite one memento per block, in order. "
            f'Reply with JSON only: {{"mementos": [{len(blocks)} strings]}}.'
        )
        first = self.client.ask(
            [{"role": "system", "content": WRITER_SYSTEM}, {"role": "user", "content": prompt}],
            _mementos_validator(len(blocks)),
        )["mementos"]
        with ThreadPoolExecutor(self.concurrency) as pool:
            polished = list(
                pool.map(lambda pair: self._polish(problem, *pair), zip(blocks, first, strict=True))
            )
        return Mementos([p[0] for p in polished], [p[1] for p in polished], [p[2] for p in polished])
