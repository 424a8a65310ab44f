"""`memento-train demo` and `memento-train mask` as a user runs them."""

import json
import subprocess
import sys

import pytest
from test_format import SHARED, needs_shared

from memento_train.cli import main
from memento_train.toy_tokenizer import build_tokenizer


def test_demo_prints_accounting_and_draws(tmp_path, capsys):
    png = tmp_path / "mask.png"
    assert main(["demo", "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert "peak KV tokens" in out and "ratio" in out and str(png) in out
    assert png.stat().st_size > 10_000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_console_script_entry_point(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "memento_train.cli", "demo", "--json", "--png", str(tmp_path / "m.png")],
        capture_output=True,
        text=True,
        check=True,
    )
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["blocks"] == 4 and 0 < report["peak_kv_ratio"] < 0.6 and report["auc_ratio"] < 1


@needs_shared
@pytest.mark.parametrize("name", ["example_response.json", "example_code.json", "example_science.json"])
def test_mask_on_real_examples(name, capsys):
    assert main(["mask", "--trace", str(SHARED / name), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["peak_kv_memento"] < report["peak_kv_full"] == report["tokens"]
    # Policies only ever keep more: keeping one block more cannot lower the peak.
    assert main(["mask", "--trace", str(SHARED / name), "--json", "--keep-last-n-blocks", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["peak_kv_memento"] >= report["peak_kv_memento"]


def test_mask_with_a_local_tokenizer_dir(tmp_path, capsys):
    tokenizer = build_tokenizer(["some text to train on, block summary"], 300, with_tags=False)
    tokenizer.save_pretrained(tmp_path / "tok")
    from memento_train.cli import example_trace_path

    code = main(
        ["mask", "--trace", str(example_trace_path()), "--tokenizer", str(tmp_path / "tok"), "--json"]
    )
    assert code == 0
    assert json.loads(capsys.readouterr().out)["blocks"] == 4


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "file is empty"),
        ('{"problem": "p", "response": "<think><|block_start|>a</think>x"}', "inside block 1"),
        ("{oops", "invalid JSON"),
    ],
)
def test_mask_bad_input_is_a_clear_error(tmp_path, capsys, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    assert main(["mask", "--trace", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err


def test_mask_index_out_of_range(capsys):
    from memento_train.cli import example_trace_path

    with pytest.raises(SystemExit, match="out of range"):
        main(["mask", "--trace", str(example_trace_path()), "--index", "3"])
