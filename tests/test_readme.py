"""The README's two commands are what users paste and what CI runs: keep them honest."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _commands() -> list[str]:
    lines = (ROOT / "README.md").read_text().splitlines()
    return [line for line in lines if line.startswith("python3 -m venv .venv")]


def test_readme_has_exactly_two_commands_at_the_top():
    commands = _commands()
    assert len(commands) == 2
    assert commands[0].endswith("memento-train quickstart")
    assert commands[1].endswith("pytest -q")
    text = (ROOT / "README.md").read_text()
    assert text.index(commands[1]) < text.index("## The visibility rule")


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert _commands()[1] in ci


def test_readme_benchmark_table_matches_the_benchmark_header():
    source = (ROOT / "benchmarks" / "mask_memory.py").read_text()
    assert "| S | docs | dense bool | BlockMask | ratio |" in source
    assert "| S | docs | dense bool | BlockMask | ratio |" in (ROOT / "README.md").read_text()
