"""Entry points (scripts/train.py under torchrun with 2 CPU processes, the CLI), the serving files
and pushing to the Hub (HfApi replaced by a recorder: no network here)."""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import pytest
from train_helpers import tiny_config, write_samples

from memento_train.cli import main
from memento_train.config import to_dict
from memento_train.hub import block_masking_config, push, write_serving_files

ROOT = Path(__file__).resolve().parents[1]


def _torchrun(tmp_path, config, processes: int, **env):
    """scripts/train.py under torchrun, as a user launches it."""
    import yaml

    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(to_dict(config)))
    torchrun = Path(sys.executable).with_name("torchrun")
    result = subprocess.run([str(torchrun), "--nproc_per_node", str(processes), str(ROOT / "scripts" / "train.py"),
                             "--config", str(path)], capture_output=True, text=True, cwd=tmp_path,
                            env={**os.environ, "WANDB_MODE": "offline", **env})  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]


def test_two_cpu_processes_with_torchrun(tmp_path):
    data = write_samples(tmp_path / "data.jsonl", 12)
    _torchrun(tmp_path, tiny_config(tmp_path, data, 1, training={"max_steps": 3, "logging_steps": 1}), 2,
              OMP_NUM_THREADS="1")  # fmt: skip
    report = json.loads((tmp_path / "stage1" / "memento_train_report.json").read_text())
    assert len(report["log"]) == 3
    state = report["train"]
    assert state["train_samples_per_second"] > 0
    assert "world_size" not in state or state["world_size"] == 2


def test_cli_train_reports_and_errors(tmp_path, capsys):
    data = write_samples(tmp_path / "data.jsonl", 6)
    config = tiny_config(tmp_path, data, 1, training={"max_steps": 2})
    path = tmp_path / "config.yaml"
    import yaml

    path.write_text(yaml.safe_dump(to_dict(config)))
    assert main(["train", "--config", str(path), "training.logging_steps=1"]) == 0
    assert "stage 1 done: 2 logged steps" in capsys.readouterr().out
    assert main(["train", "--config", str(path), "data.train_files=[missing.jsonl]"]) == 2
    assert "data file(s) not found: missing.jsonl" in capsys.readouterr().err
    assert main(["train", "--config", str(path), "mask.keep_last_n_block=1"]) == 2
    assert "did you mean 'keep_last_n_blocks'" in capsys.readouterr().err


def test_block_masking_config_follows_the_policy(tmp_path):
    data = write_samples(tmp_path / "data.jsonl", 2)
    config = tiny_config(tmp_path, data, 2, mask={"keep_last_n_blocks": 0, "mask_delimiters": True,
                                                   "answer_sees_last_block": True})  # fmt: skip
    exported = block_masking_config(config)
    assert exported["enable"] and exported["mask_delimiters"] and exported["keep_last_block_for_answer"]
    assert exported["summary_end_token"] == "<|summary_end|>"
    bad = tiny_config(tmp_path, data, 2, mask={"keep_last_n_blocks": 1, "answer_sees_last_block": True})
    with pytest.raises(ValueError, match="keep_last_n_blocks=0"):
        block_masking_config(bad)
    assert not block_masking_config(tiny_config(tmp_path, data, 1))["enable"], "stage 1 trains no eviction"


class RecordingApi:
    calls: ClassVar[list] = []

    def __init__(self, token=None):
        RecordingApi.calls.append(("init", token))

    def create_repo(self, repo_id, private, exist_ok):
        RecordingApi.calls.append(("create_repo", repo_id, private))

    def upload_folder(self, folder_path, repo_id, ignore_patterns):
        RecordingApi.calls.append(("upload_folder", folder_path, repo_id))
        return f"uploaded {repo_id}"


def test_push_uses_hf_token_only(tmp_path, monkeypatch):
    import huggingface_hub

    from memento_train.toy_tokenizer import build_tokenizer

    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    monkeypatch.setattr(huggingface_hub, "HfApi", RecordingApi)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with pytest.raises(RuntimeError, match="set HF_TOKEN"):
        push(checkpoint, "me/model")
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    with pytest.raises(FileNotFoundError, match=r"block_masking_config\.json"):
        push(checkpoint, "me/model")
    data = write_samples(tmp_path / "data.jsonl", 2)
    write_serving_files(checkpoint, build_tokenizer(["x y z"], 300), tiny_config(tmp_path, data, 2))
    assert main(["push", str(checkpoint), "--repo-id", "me/model", "--private"]) == 0
    assert ("init", "hf_secret_value") in RecordingApi.calls and (
        "create_repo",
        "me/model",
        True,
    ) in RecordingApi.calls
    for path in checkpoint.iterdir():
        assert "hf_secret_value" not in path.read_text(), f"token written to {path}"
    card = (checkpoint / "README.md").read_text()
    assert "Mask policy: keep_last_n_blocks=0" in card and "Stage: 2" in card


@pytest.mark.skipif(
    __import__("importlib").util.find_spec("deepspeed") is None,
    reason="deepspeed is not installed (pip install -e '.[deepspeed]'; the dev extra includes it)",
)
def test_deepspeed_zero2_step_on_cpu(tmp_path):
    data = write_samples(tmp_path / "data.jsonl", 6)
    config = tiny_config(tmp_path, data, 2, training={"max_steps": 2, "logging_steps": 1,
                                                      "deepspeed": str(ROOT / "configs" / "deepspeed" / "zero2.json")})  # fmt: skip
    _torchrun(tmp_path, config, 1, DS_ACCELERATOR="cpu")
    report = json.loads((tmp_path / "stage2" / "memento_train_report.json").read_text())
    assert len(report["log"]) == 2 and all(e["loss"] > 0 for e in report["log"])
