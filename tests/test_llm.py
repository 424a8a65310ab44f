"""The LLM path against a local OpenAI-compatible server: canned JSON, malformed JSON, wrong counts,
HTTP 500 and a hang → retries, then a reject with its reason; nothing lost; the cache saves calls."""

import json

import pytest
from llm_server import FakeLLM

from data_builders.build import BuildConfig, run_build
from data_builders.llm import JSONClient, LLMError, LLMScorer, LLMWriter, OpenAIBackend, TransformersBackend
from data_builders.loaders import RawTrace
from data_builders.sentences import split_sentences


def _client(server, **kw):
    backend = OpenAIBackend(server.base_url, "fake-model", timeout=kw.pop("timeout", 2.0))
    return JSONClient(backend, backoff=0.0, **kw)


def test_retries_through_every_failure_kind(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-secret")
    with FakeLLM() as server:
        server.script = [("status", 500), ("text", "not json at all"), ("json", {"scores": [1]}),
                         ("hang", 1.5), ("json", {"scores": [1, 2]})]  # fmt: skip
        sleeps = []
        client = JSONClient(OpenAIBackend(server.base_url, "m", timeout=0.5), retries=5, backoff=0.1,
                            sleep=sleeps.append)  # fmt: skip

        def validate(v):
            return None if len(v["scores"]) == 2 else f"expected exactly 2 scores, got {len(v['scores'])}"

        assert client.ask([{"role": "user", "content": "x"}], validate) == {"scores": [1, 2]}
        assert client.calls == 5 and sleeps == [0.1, 0.2, 0.4, 0.8], "exponential backoff between attempts"
        # the wrong-count reply is fed back so the model can correct itself
        assert "expected exactly 2 scores" in server.requests[3]["messages"][-1]["content"]


def test_gives_up_with_every_reason():
    with FakeLLM(default=("status", 500)) as server:
        server.script = [("text", "{broken"), ("json", {"scores": "nope"}), ("hang", 1.0)]
        client = JSONClient(OpenAIBackend(server.base_url, "m", timeout=0.3), retries=3, backoff=0.0)
        with pytest.raises(LLMError) as info:
            client.ask(
                [{"role": "user", "content": "x"}],
                lambda v: None if isinstance(v.get("scores"), list) else "bad",
            )
    message = str(info.value)
    assert "gave up after 4 attempts" in message
    for reason in ("malformed JSON", "bad", "timed out", "HTTP 500"):
        assert reason in message


def test_client_errors_are_not_retried():
    with FakeLLM(default=("status", 401)) as server:
        client = _client(server, retries=3)
        with pytest.raises(LLMError, match="HTTP 401"):
            client.ask([{"role": "user", "content": "x"}], lambda v: None)
        assert client.calls == 1


def test_cache_makes_reruns_free(tmp_path):
    with FakeLLM(default=("json", {"ok": True})) as server:
        first = _client(server, cache_dir=tmp_path)
        assert first.ask([{"role": "user", "content": "x"}], lambda v: None) == {"ok": True}
        second = _client(server, cache_dir=tmp_path)
        assert second.ask([{"role": "user", "content": "x"}], lambda v: None) == {"ok": True}
        assert len(server.requests) == 1 and second.calls == 0


def _scores_reply(request):
    prompt = request["messages"][-1]["content"]
    n = int(prompt.split("For each of the ")[1].split(" ")[0])
    return ("json", {"scores": [3 if k % 4 == 3 else 1 for k in range(n)]})


TEXT = " ".join(f"Sentence number {i} says something about the problem at hand." for i in range(60))


def test_llm_scorer_windows_and_merges():
    with FakeLLM(default=_scores_reply) as server:
        scorer = LLMScorer(window=20, overlap=5, backend=OpenAIBackend(server.base_url, "m"), backoff=0.0)
        sentences = split_sentences(TEXT)
        scores = scorer(TEXT, sentences)
    assert len(scores) == len(sentences) - 1 and set(scores) <= {1, 3}
    assert len(server.requests) == 4  # windows start at 0, 15, 30, 45


def _writer_reply(request):
    prompt = request["messages"][-1]["content"]
    if "Write one memento per block" in prompt:
        n = prompt.count("[Block ")
        return ("json", {"mementos": [f"memento {i}" for i in range(n)]})
    if prompt.startswith("Problem:") and "Score from 0 to 10" in prompt:
        good = "refined" in prompt.split("Memento:")[1]
        return ("json", {"score": 9 if good else 5, "feedback": "keep the computed values"})
    return ("json", {"memento": "refined memento with values"})


def test_llm_writer_judges_and_refines():
    with FakeLLM(default=_writer_reply) as server:
        writer = LLMWriter(OpenAIBackend(server.base_url, "m"), threshold=8, rounds=2, backoff=0.0)
        result = writer("problem", ["block one", "block two"])
    assert result.texts == ["refined memento with values"] * 2
    assert result.scores == [9.0, 9.0] and result.rounds == [1, 1]


def test_build_with_a_failing_llm_rejects_with_reason_and_loses_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-secret")
    traces = [RawTrace(f"t{i}", "broken problem" if i == 1 else "problem", TEXT, "answer") for i in range(3)]

    def reply(request):  # scores always work; the memento writer fails for the "broken" trace only
        prompt = request["messages"][-1]["content"]
        if "For each of the" in prompt:
            return _scores_reply(request)
        if "broken" in prompt:
            return ("text", "{not json")
        return _writer_reply(request)

    with FakeLLM(default=reply) as server:
        backend = {"base_url": server.base_url, "model": "m", "timeout": 0.5}
        config = BuildConfig(
            scorer="llm", writer="llm", min_block_tokens=40, max_block_tokens=200,
            scorer_options={"backend_options": backend, "backoff": 0.0, "retries": 1, "cache_dir": tmp_path / "c"},
            writer_options={"backend": backend, "backoff": 0.0, "retries": 1, "cache_dir": tmp_path / "c"},
        )  # fmt: skip
        counts = run_build(traces, tmp_path / "out", config, progress=False)
        assert all(r["messages"] for r in server.requests)
    assert (counts["samples"], counts["rejects"]) == (2, 1)
    (reject,) = [json.loads(x) for x in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()]
    assert reject["id"] == "t1" and reject["stage"] == "memento" and "malformed JSON" in reject["reason"]
    samples = [json.loads(x) for x in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    assert [s["id"] for s in samples] == ["t0", "t2"] and samples[0]["meta"]["judge_scores"][0] == 9.0
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert "sk-test-secret" not in path.read_text(errors="ignore"), f"API key written to {path}"


def test_transformers_backend_generates_text():
    from models import tiny_model

    from memento_train.toy_tokenizer import build_tokenizer

    tokenizer = build_tokenizer(["some words to learn from"], 300)
    backend = TransformersBackend(tiny_model("llama", vocab_size=len(tokenizer)), tokenizer, max_new_tokens=5)
    out = backend.complete([{"role": "user", "content": "hello"}])
    assert isinstance(out, str) and backend.identity().startswith("transformers:")


def test_model_writer_with_an_untrained_model_rejects_cleanly(tmp_path):
    """The `model` writer runs the same prompts through a local transformers model; a model that
    cannot answer in JSON ends as a reject with the reason, not a traceback."""
    from models import tiny_model

    from data_builders.writers import make_writer
    from memento_train.toy_tokenizer import build_tokenizer

    tokenizer = build_tokenizer([TEXT], 300)
    model = tiny_model("llama", vocab_size=len(tokenizer))
    writer = make_writer(
        "model", backend={"model": model, "tokenizer": tokenizer, "max_new_tokens": 8}, retries=1, backoff=0.0
    )
    assert isinstance(writer, LLMWriter)
    config = BuildConfig(min_block_tokens=40, max_block_tokens=200)
    from data_builders.build import Builder

    builder = Builder(config)
    builder.writer = writer
    result = builder(RawTrace("t", "problem", TEXT, "answer"))
    assert result.stage == "memento" and "gave up after 2 attempts" in result.reason
