"""Answer extraction and scoring, `memento-train eval` on a tiny trained checkpoint, `replay`."""

import json

import pytest
from test_format import SHARED, needs_shared
from train_helpers import tiny_config, write_samples

from memento_train.cli import main
from memento_train.evaluate import extract_answer, is_correct, load_items, normalize


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so the answer is \\boxed{42}.", "42"),
        ("\\boxed{\\frac{1}{2}} and later \\boxed{x^{2}+1}", "x^{2}+1"),
        ("Final Answer: 17 apples\nmore text", "17 apples"),
        ("We get 3, then 5, finally 12.5", "12.5"),
        ("no answer here", None),
        ("\\boxed{}", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    ("predicted", "gold", "correct"),
    [
        ("42", "42", True), ("$42$", "42", True), ("1,000", "1000", True), ("0.5", "\\frac{1}{2}", True),
        ("\\dfrac{1}{2}", "\\frac{1}{2}", True), ("\\text{C}", "c", True), ("41", "42", False), (None, "42", False),
        ("3/4", "0.75", True),
    ],
)  # fmt: skip
def test_is_correct(predicted, gold, correct):
    assert is_correct(predicted, gold) is correct


def test_sympy_equivalence_is_optional():
    assert not is_correct("2*x+2", "2*(x+1)")
    assert is_correct("2*x+2", "2*(x+1)", use_sympy=True)
    assert normalize(" $\\left(1, 2\\right)$. ") == "(1,2)"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from memento_train.train import run_training

    tmp = tmp_path_factory.mktemp("eval")
    data = write_samples(tmp / "data.jsonl", 12)
    run_training(tiny_config(tmp, data, 1, training={"max_steps": 4}))
    run_training(tiny_config(tmp, data, 2, init_from=str(tmp / "stage1"), training={"max_steps": 2}))
    return tmp / "stage2", data


def test_eval_end_to_end(checkpoint, tmp_path, capsys):
    ckpt, data = checkpoint
    out = tmp_path / "eval"
    code = main(["eval", "--model", str(ckpt), "--data", str(data), "--samples", "3", "--output", str(out),
                 "--max-new-tokens", "40", "--max-block-tokens", "8", "--no-progress"])  # fmt: skip
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["modes"]) == {"full", "memento", "restart"}
    for mode in summary["modes"].values():
        for key in ("accuracy", "stderr", "peak_kv_tokens", "kv_auc", "tokens_per_s", "blocks_per_answer",
                    "compression", "unparseable"):  # fmt: skip
            assert key in mode
    items = [json.loads(x) for x in (out / "items.jsonl").read_text().splitlines()]
    assert len(items) == 9 and all("predicted" in r and "correct" in r for r in items)
    assert all(not r["correct"] for r in items if r["unparseable"]), "unparseable answers count as wrong"
    assert (out / "kv_curve.png").stat().st_size > 5000 and (out / "modes.png").stat().st_size > 5000
    assert "| memento |" in capsys.readouterr().out


def test_eval_bad_inputs(checkpoint, tmp_path, capsys):
    ckpt, data = checkpoint
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert main(["eval", "--model", str(ckpt), "--data", str(empty), "--output", str(tmp_path / "o")]) == 2
    assert "no items to evaluate" in capsys.readouterr().err
    assert main(["eval", "--model", str(ckpt), "--data", str(tmp_path / "nope.jsonl")]) == 2
    assert "no such data file" in capsys.readouterr().err
    # a checkpoint without block_masking_config.json: evaluated with the default policy, and said so
    (ckpt / "block_masking_config.json").rename(tmp_path / "saved.json")
    try:
        assert main(["eval", "--model", str(ckpt), "--data", str(data), "--samples", "1", "--modes", "memento",
                     "--max-new-tokens", "5", "--output", str(tmp_path / "o2"), "--no-progress"]) == 0  # fmt: skip
        assert "has no block_masking_config.json" in capsys.readouterr().err
    finally:
        (tmp_path / "saved.json").rename(ckpt / "block_masking_config.json")


def test_eval_refuses_a_model_without_memento_tokens(tmp_path, capsys):
    from models import tiny_model

    from memento_train.toy_tokenizer import build_tokenizer

    tokenizer = build_tokenizer(["plain text only"], 300, with_tags=False)
    tiny_model("llama", vocab_size=len(tokenizer)).save_pretrained(tmp_path / "plain")
    tokenizer.save_pretrained(tmp_path / "plain")
    data = write_samples(tmp_path / "d.jsonl", 1)
    assert main(["eval", "--model", str(tmp_path / "plain"), "--data", str(data)]) == 2
    assert "has no memento tokens" in capsys.readouterr().err


def test_load_items_needs_a_reference(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps({"problem": "p"}) + "\n")
    from memento_train.format import MementoFormatError

    with pytest.raises(MementoFormatError, match="reference answer"):
        load_items(path)


@needs_shared
def test_replay_on_the_real_examples(capsys):
    files = [str(SHARED / f"example_{n}.json") for n in ("response", "code", "science")]
    assert main(["replay", *files, "--json"]) == 0
    reports = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert len(reports) == 3
    for report in reports:
        assert {"file", "peak_kv_ratio", "auc_ratio"} <= set(report)
        assert 0.3 < report["peak_kv_ratio"] < 0.6 and 0.2 < report["auc_ratio"] < 0.7
