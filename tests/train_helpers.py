"""Small synthetic datasets and configs for trainer tests (tiny models built from configs)."""

from __future__ import annotations

import json
from pathlib import Path

from data_builders.synthetic import SyntheticConfig, synthetic_samples
from memento_train.config import config_from_dict


def write_samples(path: Path, n: int = 16, **synthetic) -> Path:
    config = SyntheticConfig(**{"n_blocks": 3, "steps_per_block": 2, "filler": 0, **synthetic})
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        for sample in synthetic_samples(n, config):
            handle.write(json.dumps({"id": sample.meta["id"], **sample.to_dict()}) + "\n")
    return path


def tiny_config(tmp_path: Path, samples: Path, stage: int = 1, arch: str = "llama", **sections):
    base = {
        "stage": stage,
        "output_dir": str(tmp_path / f"stage{stage}"),
        "model": {"tiny": {"arch": arch, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16},
                  "attn_implementation": "sdpa", "dtype": "float32"},
        "data": {"train_files": [str(samples)], "max_seq_len": 1024, "tokenizer_corpus_size": 400},
        "training": {"per_device_train_batch_size": 2, "learning_rate": 3e-3, "max_steps": 6, "logging_steps": 1,
                     "save_strategy": "no", "report_to": "none", "lr_scheduler_type": "constant", "use_cpu": True},
    }  # fmt: skip
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    return config_from_dict(base)
