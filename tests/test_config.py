"""Config: shipped YAML files validate, inheritance and overrides, errors that name the key, sweeps."""

from pathlib import Path

import pytest
import yaml

from memento_train.cli import main
from memento_train.config import (
    ConfigError,
    apply_overrides,
    config_from_dict,
    expand_sweep,
    load_config,
    load_yaml,
)

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.mark.parametrize("name", ["base.yaml", "stage1.yaml", "stage2.yaml", "lora.yaml", "quickstart.yaml"])
def test_shipped_configs_validate(name):
    data = load_yaml(CONFIGS / name)
    if "name_or_path" not in data.get("model", {}) and "tiny" not in data.get("model", {}):
        data = apply_overrides(data, ["model.name_or_path=some/model"])
    config_from_dict(data)


def test_inheritance_and_overrides():
    config = load_config(CONFIGS / "lora.yaml", ["training.learning_rate=2e-4", "mask.keep_last_n_blocks=1"])
    assert config.stage == 2 and config.init_from == "outputs/stage1"  # from stage2.yaml
    assert config.lora.enabled and config.lora.r == 16  # from lora.yaml
    assert config.model.name_or_path == "Qwen/Qwen3-8B"  # from stage1.yaml
    assert (
        config.training["learning_rate"] == 2e-4 and config.training["bf16"] is True
    )  # override + base.yaml
    assert config.mask.keep_last_n_blocks == 1
    assert load_config(CONFIGS / "stage2.yaml", stage=1).stage == 1


def test_deepspeed_configs_use_auto_fields():
    import json

    for name in ("zero2.json", "zero3.json"):
        ds = json.loads((CONFIGS / "deepspeed" / name).read_text())
        assert ds["train_micro_batch_size_per_gpu"] == "auto" and ds["gradient_accumulation_steps"] == "auto"
        assert ds["zero_optimization"]["stage"] == int(name[4])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["mask.keep_last_n_block=1"],
            "unknown key 'mask.keep_last_n_block' (did you mean 'keep_last_n_blocks'?)",
        ),
        (["retention.wieght=0.1"], "unknown key 'retention.wieght' (did you mean 'weight'?)"),
        (["trainng.learning_rate=1"], "unknown key 'trainng' (did you mean 'training'?)"),
        (["training.learning_rat=1"], "unknown key 'training.learning_rat' (did you mean 'learning_rate'?)"),
        (["training.output_dir=x"], "set by memento-train itself"),
        (["mask.keep_last_n_blocks=two"], "mask.keep_last_n_blocks must be an integer"),
        (["mask.mask_delimiters=1"], "mask.mask_delimiters must be true or false"),
        (["stage=3"], "stage must be 1 or 2"),
        (["retention.teacher=other"], "retention.teacher must be self or frozen"),
        (["model.attn_implementation=flash_attention_2"], "flash-attention cannot express memento masks"),
        (["model.tiny={arch: llama}"], "exactly one of name_or_path"),
        (["data.train_files=file.jsonl"], "data.train_files must be a list"),
        (["hub.push=true"], "hub.push needs hub.repo_id"),
        (["justwrong"], "is not KEY=VALUE"),
    ],
)
def test_config_errors_name_the_key(overrides, message):
    with pytest.raises(ConfigError) as info:
        load_config(CONFIGS / "stage2.yaml", overrides)
    assert message in str(info.value)


def test_yaml_errors(tmp_path):
    (tmp_path / "a.yaml").write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(ConfigError, match="loops back"):
        load_yaml(tmp_path / "a.yaml")
    (tmp_path / "bad.yaml").write_text("stage: [1\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_yaml(tmp_path / "bad.yaml")
    with pytest.raises(ConfigError, match="no such config file"):
        load_yaml(tmp_path / "missing.yaml")


def test_sweep_expansion():
    data = {
        "model": {"name_or_path": "m"},
        "data": {"train_files": ["a.jsonl", "b.jsonl"]},  # a list field, not an axis
        "retention": {"weight": [0.0, 0.3], "teacher": ["self", "frozen"]},
        "_": [
            {"mask": {"keep_last_n_blocks": 0}},
            {"mask": {"keep_last_n_blocks": 1, "answer_sees_last_block": False}},
        ],
    }
    runs = expand_sweep(data)
    assert len(runs) == 2 * 2 * 2
    names = [name for name, _ in runs]
    assert len(set(names)) == 8
    configs = [config_from_dict(run) for _, run in runs]
    assert {(c.retention.weight, c.retention.teacher, c.mask.keep_last_n_blocks) for c in configs} == {
        (w, t, k) for w in (0.0, 0.3) for t in ("self", "frozen") for k in (0, 1)
    }
    assert all(c.data.train_files == ["a.jsonl", "b.jsonl"] for c in configs)


def test_sweep_cli_dry_run(tmp_path, capsys):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({
        "base": str(CONFIGS / "stage2.yaml"), "output_dir": str(tmp_path / "out"),
        "training": {"learning_rate": [1e-5, 2e-5]}, "mask": {"keep_last_n_blocks": [0, 1]},
    }))  # fmt: skip
    assert main(["sweep", str(sweep), "--dry-run"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    commands = [line for line in lines if line.startswith("accelerate launch scripts/train.py --config")]
    assert len(commands) == 4
    for command in commands:
        path = Path(command.split("--config ")[1])
        run = load_config(path)
        assert run.output_dir == str(path.parent) and run.run_name == path.parent.name
