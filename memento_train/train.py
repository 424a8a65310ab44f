"""The two-stage recipe on transformers.Trainer.

Stage 1 learns the format with causal attention (document mask only). Stage 2 starts from a
stage-1 checkpoint and trains under the memento mask, with the retention loss pulling masked
predictions towards the model's own full-attention predictions. Checkpointing, resume, gradient
accumulation, DeepSpeed, report_to and push_to_hub are the Trainer's.
"""

from __future__ import annotations

import copy
import json
import logging
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
import yaml
from transformers import Trainer, TrainingArguments

from .config import TrainConfig, to_dict
from .data import PAD_DOCUMENT, MementoCollator, RowsDataset, packed_rows, tokenized_dataset
from .format import MementoTokens
from .losses import completion_ce, restricted_positions, retention_kl
from .masking import NEVER, MaskPolicy, expiry, mask_from_expiry

log = logging.getLogger("memento_train")


class MementoTrainer(Trainer):
    """Trainer whose loss builds the stage's attention mask from the batch and adds retention."""

    def __init__(
        self,
        *args,
        memento: TrainConfig,
        tokens: MementoTokens,
        backend: str,
        teacher: torch.nn.Module | None = None,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        self.memento, self.tokens, self.backend, self.teacher = memento, tokens, backend, teacher
        self.policy = MaskPolicy(**vars(memento.mask)) if memento.stage == 2 else None
        self._metrics: dict[str, list[float]] = defaultdict(list)
        self._last_log = time.perf_counter()
        self._tokens_since_log = 0

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        ids, labels = inputs["input_ids"], inputs["labels"]
        positions, docs = inputs["position_ids"], inputs["document_ids"]
        dtype = next(model.parameters()).dtype
        exp = expiry(
            ids, self.tokens, self.policy, docs
        )  # once: the mask and the retention positions share it
        mask = mask_from_expiry(self.backend, exp, docs, dtype)
        outputs = model(input_ids=ids, attention_mask=mask, position_ids=positions)
        ce = completion_ce(outputs.logits, labels, num_items_in_batch)
        loss = ce
        real = docs != PAD_DOCUMENT
        restricted = restricted_positions(exp, docs) if self.policy is not None else None
        weight = self.memento.retention.weight
        if restricted is not None and weight > 0:
            teacher = self.teacher if self.teacher is not None else model
            causal = mask_from_expiry(self.backend, torch.full_like(exp, NEVER), docs, dtype)
            with torch.no_grad():
                full = teacher(input_ids=ids, attention_mask=causal, position_ids=positions)
            temperature = self.memento.retention.temperature
            kl, _ = retention_kl(outputs.logits, full.logits.detach(), labels, restricted, temperature)
            loss = ce + weight * kl
            self._metrics["retention_kl"].append(kl.item())
        completion = labels != -100
        self._metrics["ce"].append(ce.item())
        self._metrics["padding_fraction"].append(1.0 - real.float().mean().item())
        if restricted is not None:
            share = (restricted & completion).sum().item() / max(1, completion.sum().item())
            self._metrics["masked_fraction"].append(share)
        self._tokens_since_log += int(real.sum().item())
        return (loss, outputs) if return_outputs else loss

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs:  # training logs: add our per-step averages and throughput
            for key, values in self._metrics.items():
                if values:
                    logs[key] = round(sum(values) / len(values), 6)
            now = time.perf_counter()
            logs["tokens_per_s"] = round(self._tokens_since_log / max(now - self._last_log, 1e-9), 2)
            self._metrics.clear()
            self._tokens_since_log, self._last_log = 0, now
        super().log(logs, start_time)


def _corpus(files: list[str]) -> list[str]:
    texts = []
    for path in files:
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            if line.strip():
                record = json.loads(line)
                texts += [record["problem"], *record["blocks"], *record["mementos"], record["answer"]]
    return texts


def training_arguments(cfg: TrainConfig) -> TrainingArguments:
    defaults = {"per_device_train_batch_size": 1, "logging_steps": 1, "save_strategy": "no", "report_to": "none",
                "use_cpu": not torch.cuda.is_available()}  # fmt: skip
    args = {**defaults, **cfg.training}
    return TrainingArguments(output_dir=cfg.output_dir, run_name=cfg.run_name, seed=cfg.seed,
                             remove_unused_columns=False, **args)  # fmt: skip


def build_trainer(cfg: TrainConfig) -> tuple[MementoTrainer, dict[str, Any]]:
    """Model, tokenizer, data and Trainer for one stage; returns the trainer and a data report."""
    from .modeling import apply_lora, load_model_and_tokenizer, resolve_attention

    torch.manual_seed(cfg.seed)
    if not cfg.data.train_files:
        raise ValueError("data.train_files is empty: point it at samples.jsonl files from build-data")
    missing = [f for f in [*cfg.data.train_files, *cfg.data.eval_files] if not Path(f).is_file()]
    if missing:
        raise FileNotFoundError(
            f"data file(s) not found: {', '.join(missing)} (build them with memento-train build-data)"
        )
    init_from = cfg.init_from if cfg.stage == 2 else None
    if cfg.stage == 2 and init_from is None:
        log.warning("stage 2 without init_from: starting from the base model (the paper starts from stage 1)")
    corpus = _corpus(cfg.data.train_files) if cfg.model.tiny and init_from is None else None
    model, tokenizer, tokens = load_model_and_tokenizer(
        cfg.model, init_from, corpus, cfg.data.tokenizer_corpus_size
    )
    backend = resolve_attention(cfg.model.attn_implementation)
    teacher = None
    if cfg.stage == 2 and cfg.retention.weight > 0 and cfg.retention.teacher == "frozen":
        teacher = copy.deepcopy(model).eval().requires_grad_(False)
    if cfg.lora.enabled:
        out = Path(cfg.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        base = {
            "base": init_from or cfg.model.name_or_path,
            "gguf_file": None if init_from else cfg.model.gguf_file,
        }
        if cfg.model.tiny and init_from is None:  # a base built from a config must travel with its adapter
            model.save_pretrained(out / "base")
            base = {"base": "base", "gguf_file": None}
        (out / "memento_base.json").write_text(json.dumps(base))  # what `merge` loads the adapter onto
        model = apply_lora(model, cfg.lora, tokens)
    dataset = tokenized_dataset(cfg.data.train_files, tokenizer, cfg.data.num_proc)
    rows, report = packed_rows(dataset, cfg.data.max_seq_len, cfg.data.packing)
    if not rows:
        raise ValueError(
            f"no trainable sample: {report.samples} read, {report.invalid} invalid, "
            f"{report.too_long} longer than data.max_seq_len={cfg.data.max_seq_len}"
        )
    eval_rows = None
    if cfg.data.eval_files:
        eval_rows, _ = packed_rows(tokenized_dataset(cfg.data.eval_files, tokenizer, cfg.data.num_proc),
                                   cfg.data.max_seq_len, cfg.data.packing)  # fmt: skip
    collator = MementoCollator(tokenizer.pad_token_id, 128 if backend == "flex_attention" else None)
    trainer = MementoTrainer(
        model=model, args=training_arguments(cfg), data_collator=collator, train_dataset=RowsDataset(rows),
        eval_dataset=RowsDataset(eval_rows) if eval_rows else None, processing_class=tokenizer,
        memento=cfg, tokens=tokens, backend=backend, teacher=teacher,
    )  # fmt: skip
    summary = {**vars(report), "real_token_fraction": round(report.real_fraction, 4), "attention": backend}
    return trainer, summary


def run_training(cfg: TrainConfig) -> dict[str, Any]:
    """Train one stage and save an HF checkpoint with the tokenizer, the serving config and the run config."""
    from .hub import write_serving_files

    trainer, summary = build_trainer(cfg)
    log.info("data: %s", summary)
    resume = cfg.resume_from_checkpoint
    result = trainer.train(resume_from_checkpoint=True if resume == "latest" else resume)
    out = Path(cfg.output_dir)
    trainer.save_model(str(out))
    history = [e for e in trainer.state.log_history if "loss" in e]
    report = {"data": summary, "train": result.metrics, "log": history}
    if not trainer.is_world_process_zero():
        return report
    (out / "memento_train.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    (out / "memento_train_report.json").write_text(json.dumps(report, indent=2))
    write_serving_files(out, trainer.processing_class, cfg)
    if cfg.hub.push:
        from .hub import push

        push(out, cfg.hub.repo_id, private=cfg.hub.private)
    return report
