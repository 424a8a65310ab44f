"""Typed, validated training configuration: YAML with inheritance, key=value overrides, sweeps.

Every section is a dataclass; an unknown or mistyped key is an error that names the key and the
closest valid one. `training:` is passed through to `transformers.TrainingArguments` and checked
against its fields the same way.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import itertools
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A configuration that cannot be used as written."""


class _Loader(yaml.SafeLoader):
    """YAML 1.1 reads `1e-5` as a string; every training config writes learning rates that way."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\d[\d_]*\.?\d*|\.\d+)[eE][-+]?\d+$|^[-+]?(?:\d[\d_]*)?\.\d+$|^[-+]?\d[\d_]*\.$"),
    list("-+0123456789."),
)


def _yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)


@dataclass
class ModelConfig:
    name_or_path: str | None = None  # hub name or local dir
    gguf_file: str | None = None
    tiny: dict[str, Any] | None = None  # build from a config instead: {arch: llama|qwen3, hidden_size: …}
    attn_implementation: str = "auto"  # auto: flex_attention on CUDA, sdpa on CPU
    dtype: str = "float32"  # float32 | bfloat16 | float16 | auto
    trust_remote_code: bool = False
    gradient_checkpointing: bool = False


@dataclass
class DataConfig:
    train_files: list[str] = field(default_factory=list)  # samples.jsonl from build-data
    eval_files: list[str] = field(default_factory=list)
    max_seq_len: int = 4096
    packing: bool = True
    num_proc: int = 1
    tokenizer_corpus_size: int = 2048  # tiny models: vocabulary of the in-process tokenizer


@dataclass
class MaskConfig:
    keep_last_n_blocks: int = 0
    mask_delimiters: bool = False
    answer_sees_last_block: bool = False


@dataclass
class RetentionConfig:
    weight: float = 0.3  # λ; 0 reproduces the paper's plain SFT
    teacher: str = "self"  # self: same weights, detached | frozen: a copy of the stage-2 initialization
    temperature: float = 1.0


@dataclass
class LoraSection:
    enabled: bool = False
    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )


@dataclass
class HubConfig:
    push: bool = False
    repo_id: str | None = None
    private: bool = True


@dataclass
class TrainConfig:
    stage: int = 2
    init_from: str | None = None  # stage 2: the stage-1 checkpoint to start from
    output_dir: str = "outputs/run"
    run_name: str | None = None
    seed: int = 0
    resume_from_checkpoint: str | None = None  # a checkpoint dir, or "latest"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    mask: MaskConfig = field(default_factory=MaskConfig)
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    lora: LoraSection = field(default_factory=LoraSection)
    hub: HubConfig = field(default_factory=HubConfig)
    training: dict[str, Any] = field(default_factory=dict)  # transformers.TrainingArguments fields

    def validate(self) -> TrainConfig:
        def need(ok: bool, message: str) -> None:
            if not ok:
                raise ConfigError(message)

        need(self.stage in (1, 2), f"stage must be 1 or 2, got {self.stage}")
        need(
            bool(self.model.name_or_path) != bool(self.model.tiny),
            "model: give exactly one of name_or_path (hub name or dir) and tiny (a config to build)",
        )
        need(
            self.model.attn_implementation in ("auto", "sdpa", "eager", "flex_attention"),
            f"model.attn_implementation must be auto, sdpa, eager or flex_attention, got "
            f"{self.model.attn_implementation!r} (flash-attention cannot express memento masks)",
        )
        need(
            self.model.dtype in ("float32", "bfloat16", "float16", "auto"),
            f"bad model.dtype {self.model.dtype!r}",
        )
        need(self.data.max_seq_len >= 16, "data.max_seq_len must be >= 16")
        need(self.mask.keep_last_n_blocks >= 0, "mask.keep_last_n_blocks must be >= 0")
        need(self.retention.weight >= 0, "retention.weight must be >= 0")
        need(self.retention.teacher in ("self", "frozen"), "retention.teacher must be self or frozen")
        need(self.retention.temperature > 0, "retention.temperature must be > 0")
        need(not self.hub.push or bool(self.hub.repo_id), "hub.push needs hub.repo_id")
        _check_training_args(self.training)
        return self


def _check_training_args(training: dict[str, Any]) -> None:
    from transformers import TrainingArguments

    valid = {f.name for f in dataclasses.fields(TrainingArguments)}
    ours = {"output_dir", "run_name", "seed", "remove_unused_columns"}
    for key in training:
        if key in ours:
            raise ConfigError(
                f"training.{key} is set by memento-train itself; use the top-level key instead"
                if key != "remove_unused_columns"
                else "training.remove_unused_columns must stay false"
            )
        if key not in valid:
            raise ConfigError(
                f"unknown key 'training.{key}'{_suggest(key, valid)} (not a TrainingArguments field)"
            )


def _suggest(key: str, options: typing.Iterable[str]) -> str:
    close = difflib.get_close_matches(key, list(options), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _coerce(value: Any, annotation: Any, where: str) -> Any:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for option in (a for a in args if a is not type(None)):
            try:
                return _coerce(value, option, where)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0])
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{where} must be a list, got {value!r}")
        return [_coerce(v, args[0], f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a mapping, got {value!r}")
        return dict(value)
    if annotation is Any:
        return value
    if dataclasses.is_dataclass(annotation):
        return _build(annotation, value, where)
    if annotation is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, got {value!r}")
        return value
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} must be an integer, got {value!r}")
        return value
    if annotation is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where} must be a number, got {value!r}")
        return float(value)
    if annotation is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where} must be a string, got {value!r}")
        return value
    raise ConfigError(f"{where}: unsupported type {annotation!r}")


def _build(cls: type, data: Any, where: str = "") -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'} must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in names:
            raise ConfigError(f"unknown key '{path}'{_suggest(str(key), names)}")
        kwargs[key] = _coerce(value, hints[key], path)
    return cls(**kwargs)


def _merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and key != "_":
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def load_yaml(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A YAML mapping with `base:` (a path or a list of paths, relative to this file) merged under it."""
    path = Path(path).resolve()
    if path in _seen:
        raise ConfigError(f"{path}: 'base' chain loops back to itself")
    if not path.is_file():
        raise ConfigError(f"no such config file: {path}")
    try:
        data = _yaml(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: invalid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    bases = data.pop("base", None) or []
    merged: dict[str, Any] = {}
    for base in [bases] if isinstance(bases, str) else bases:
        merged = _merge(merged, load_yaml(path.parent / base, (*_seen, path)))
    return _merge(merged, data)


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """`a.b.c=value` (value parsed as YAML: numbers, true/false, lists, null)."""
    out = copy.deepcopy(data)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r} is not KEY=VALUE")
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {part} is not a section")
        node[parts[-1]] = _yaml(raw)
    return out


def config_from_dict(data: dict[str, Any]) -> TrainConfig:
    return _build(TrainConfig, data).validate()


def load_config(
    path: str | Path | None, overrides: list[str] | None = None, stage: int | None = None
) -> TrainConfig:
    data = load_yaml(path) if path else {}
    if stage is not None:
        data["stage"] = stage
    return config_from_dict(apply_overrides(data, overrides or []))


def to_dict(config: TrainConfig) -> dict[str, Any]:
    return dataclasses.asdict(config)


def expand_sweep(data: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """axolotl sweep semantics: every list-valued leaf is an axis of a Cartesian product; entries of
    the `_` list are bundles of keys that vary together. Returns (run suffix, config dict) pairs.

    Keys whose value is a list by nature (data.train_files, lora.target_modules, …) are not axes;
    to sweep them, give a list of lists.
    """
    data = copy.deepcopy(data)
    bundles = data.pop("_", None) or [{}]
    if not isinstance(bundles, list) or not all(isinstance(b, dict) for b in bundles):
        raise ConfigError("sweep '_' must be a list of mappings (bundles of keys that vary together)")
    axes: list[tuple[str, list[Any]]] = []

    def walk(node: dict[str, Any], prefix: str, schema: Any) -> None:
        hints = typing.get_type_hints(schema) if dataclasses.is_dataclass(schema) else {}
        for key, value in node.items():
            path = f"{prefix}{key}"
            hint = hints.get(key)
            if isinstance(value, dict) and dataclasses.is_dataclass(hint):
                walk(value, f"{path}.", hint)
            elif path == "training" and isinstance(value, dict):
                for (
                    name,
                    item,
                ) in value.items():  # TrainingArguments: a list is an axis unless the field is a list
                    if isinstance(item, list) and (name not in _list_training_fields() or _all_lists(item)):
                        axes.append((f"training.{name}", item))
            elif (isinstance(value, list) and hint is not None and typing.get_origin(hint) is not list) or (
                isinstance(value, list) and _all_lists(value)
            ):
                axes.append((path, value))

    walk(data, "", TrainConfig)
    runs = []
    for bundle in bundles:
        for combo in itertools.product(*[values for _, values in axes]) if axes else [()]:
            run = _merge(data, {})
            overrides = [f"{k}={yaml.safe_dump(v, default_flow_style=True).strip()}" for k, v in flat(bundle)]
            overrides += [
                f"{path}={yaml.safe_dump(v, default_flow_style=True).strip()}"
                for (path, _), v in zip(axes, combo, strict=True)
            ]
            run = apply_overrides(run, overrides)
            parts = [_label(o) for o in overrides]
            runs.append(("_".join(parts) or "base", run))
    return runs


def _all_lists(values: list[Any]) -> bool:
    return bool(values) and all(isinstance(v, list) for v in values)


def _list_training_fields() -> set[str]:
    from transformers import TrainingArguments

    return {f.name for f in dataclasses.fields(TrainingArguments) if "list" in str(f.type).lower()}


def flat(node: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for key, value in node.items():
        if isinstance(value, dict):
            out += flat(value, f"{prefix}{key}.")
        else:
            out.append((f"{prefix}{key}", value))
    return out


def _label(override: str) -> str:
    key, _, value = override.partition("=")
    short = key.split(".")[-1]
    return "".join(c if c.isalnum() or c in ".-" else "-" for c in f"{short}-{value}").strip("-")
