"""Synthetic multi-step tasks with gold blocks and gold mementos.

Variables are updated step by step across blocks; the final answer needs values that were
computed in earlier blocks, so a model that evicts a block must have carried its results in the
memento. A passcode can be hidden in one block (and never in its memento) for the probe of how
much a memento's KV carries beyond its text (paper §6.2).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from memento_train.format import Sample

from .loaders import RawTrace

VARIABLES = "abcdefgh"
PASSCODES = (
    "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet",
    "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango",
)  # fmt: skip
FILLER = (
    "Let me double-check that arithmetic before moving on.",
    "That result looks consistent with the previous values.",
    "I should keep track of every variable carefully here.",
    "Nothing else changes in this step.",
    "Good, the update is applied correctly.",
)


@dataclass(frozen=True)
class SyntheticConfig:
    n_blocks: int = 4
    steps_per_block: int = 3
    n_vars: int = 3
    max_value: int = 20  # difficulty: start values and constants are drawn up to this
    filler: int = 1  # length knob: checking sentences added per step
    passcode_block: int | None = None  # 0-based block that hides a passcode
    passcode_choices: int = 10  # k-way passcode; chance = 1/k
    seed: int = 0
    modulus: int | None = None  # keep every value modulo this (10: single digits, an easier task)

    def __post_init__(self) -> None:
        if not 1 <= self.n_vars <= len(VARIABLES):
            raise ValueError(f"n_vars must be in 1..{len(VARIABLES)}")
        if self.n_blocks < 1 or self.steps_per_block < 1 or self.max_value < 2 or self.filler < 0:
            raise ValueError("n_blocks, steps_per_block >= 1, max_value >= 2, filler >= 0")
        if self.passcode_block is not None and not 0 <= self.passcode_block < self.n_blocks:
            raise ValueError(f"passcode_block must be in 0..{self.n_blocks - 1}")
        if not 2 <= self.passcode_choices <= len(PASSCODES):
            raise ValueError(f"passcode_choices must be in 2..{len(PASSCODES)}")


def _step(rng: random.Random, values: dict[str, int], names: str, max_value: int,
          modulus: int | None = None) -> tuple[str, str, str]:  # fmt: skip
    """One update `x = expr`: returns (instruction, worked sentence, target variable)."""
    target = rng.choice(names)
    other = rng.choice(names)
    kind = rng.choice(["add_var", "sub_const", "mul_const", "add_const"])
    old = values[target]
    if kind == "add_var":
        new = old + values[other]
        instruction, work = f"{target} = {target} + {other}", f"{target} = {old} + {values[other]} = {new}"
    elif kind == "sub_const":
        c = rng.randint(1, max_value)
        new = old - c
        instruction, work = f"{target} = {target} - {c}", f"{target} = {old} - {c} = {new}"
    elif kind == "mul_const":
        c = rng.randint(2, 3)
        new = old * c
        instruction, work = f"{target} = {target} * {c}", f"{target} = {old} * {c} = {new}"
    else:
        c = rng.randint(1, max_value)
        new = old + c
        instruction, work = f"{target} = {target} + {c}", f"{target} = {old} + {c} = {new}"
    if modulus:
        new %= modulus
        work = f"{work} = {new} (mod {modulus})" if new != int(work.rsplit("= ", 1)[1]) else work
    values[target] = new
    return instruction, work, target


def synthetic_sample(index: int, config: SyntheticConfig = SyntheticConfig()) -> Sample:
    rng = random.Random(f"memento-synthetic:{config.seed}:{index}")
    names = VARIABLES[: config.n_vars]
    values = {v: rng.randint(1, config.max_value) for v in names}
    start = ", ".join(f"{v} = {values[v]}" for v in names)
    instructions, blocks, mementos = [], [], []
    passcode = None
    step_no = 0
    for b in range(config.n_blocks):
        sentences = [f"Now I apply steps {step_no + 1} to {step_no + config.steps_per_block}."]
        for _ in range(config.steps_per_block):
            step_no += 1
            instruction, work, _ = _step(rng, values, names, config.max_value, config.modulus)
            instructions.append(f"{step_no}) {instruction}")
            sentences.append(f"Step {step_no}: {work}.")
            sentences += [rng.choice(FILLER) for _ in range(config.filler)]
        if config.passcode_block == b:
            passcode = PASSCODES[rng.randrange(config.passcode_choices)]
            sentences.insert(rng.randint(1, len(sentences)), f"By the way, the passcode is {passcode}.")
        state = ", ".join(f"{v} = {values[v]}" for v in names)
        sentences.append(f"After step {step_no}: {state}.")
        blocks.append(" ".join(sentences))
        mementos.append(f"After step {step_no}: {state}.")
    # The question combines the first variable's final value with a value fixed in block 1.
    first, last = names[0], names[-1]
    answer_value = values[first] + values[last]
    total = f"{answer_value}"
    if config.modulus:
        answer_value %= config.modulus
        total = f"{total} = {answer_value} (mod {config.modulus})" if f"{answer_value}" != total else total
    problem = (
        f"Start with {start}. Apply these updates in order: {'; '.join(instructions)}. "
        f"What is {first} + {last}{f' modulo {config.modulus}' if config.modulus else ''} at the end?"
    )
    answer = (f"At the end {first} = {values[first]} and {last} = {values[last]}, so {first} + {last} = "
              f"{total}.\n\nFinal Answer: \\boxed{{{answer_value}}}")  # fmt: skip
    meta = {
        "id": f"synthetic-{config.seed}-{index}",
        "source": "synthetic",
        "reference_answer": str(answer_value),
    }
    if passcode is not None:
        meta.update(
            passcode=passcode, passcode_block=config.passcode_block, passcode_choices=config.passcode_choices
        )
    return Sample(problem, blocks, mementos, answer, meta).validate()


def synthetic_samples(n: int, config: SyntheticConfig = SyntheticConfig()) -> list[Sample]:
    return [synthetic_sample(i, config) for i in range(n)]


def as_raw_trace(sample: Sample) -> RawTrace:
    """The gold sample as an unannotated chain of thought, to test builders against gold blocks."""
    return RawTrace(
        id=str(sample.meta.get("id")),
        problem=sample.problem,
        cot="\n\n".join(sample.blocks),
        answer=sample.answer,
        source="synthetic",
        meta={"gold_blocks": len(sample.blocks)},
    )
