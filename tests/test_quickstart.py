"""`memento-train quickstart --fast` end to end, and the passcode probe at a tiny size."""

import json

import pytest

from memento_train.cli import main
from memento_train.probe import wilson


@pytest.fixture(scope="module")
def quickstart_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("quickstart")
    assert main(["quickstart", "--fast", "--output", str(out), "--no-progress"]) == 0
    return out


def test_quickstart_fast_report_is_well_formed(quickstart_dir):
    report = json.loads((quickstart_dir / "report.json").read_text())
    assert set(report["modes"]) == {"full", "memento", "restart"}
    for mode in report["modes"].values():
        for key in ("accuracy", "stderr", "peak_kv_tokens", "kv_auc", "tokens_per_s", "blocks_per_answer"):
            assert isinstance(mode[key], (int, float))
    assert report["training"]["stage1"] and report["training"]["stage2"]
    assert "retention_kl" in report["training"]["stage2"][0], "stage 2 trains with the retention loss"
    assert report["config"]["size"] == "fast" and report["config"]["task"]["modulus"] == 10
    assert {
        "memento_accuracy_within_5pp_of_full",
        "peak_kv_ratio_memento_over_full",
        "restart_accuracy_drop",
    } <= set(report["targets"])
    for plot in report["plots"]:
        assert json.dumps(plot) and (quickstart_dir / "eval" / plot.split("/")[-1]).exists()


def test_probe_control_stays_at_chance(quickstart_dir, tmp_path, capsys):
    assert main(["probe", "--model", str(quickstart_dir / "stage2"), "--output", str(tmp_path), "--n", "120",
                 "--choices", "4"]) == 0  # fmt: skip
    report = json.loads((tmp_path / "probe.json").read_text())
    assert set(report["probes"]) == {"M1_causal_control", "M2_direct", "M3_masked"}
    low, high = report["probes"]["M1_causal_control"]["ci95"]
    assert low <= report["chance"] <= high, (
        "memento 1 was computed before block 2: it cannot know the passcode"
    )
    assert (tmp_path / "probe.png").stat().st_size > 5000
    assert "M2_direct" in capsys.readouterr().out


def test_wilson_interval():
    low, high = wilson(25, 100)
    assert low < 0.25 < high and round(low, 3) == 0.175 and round(high, 3) == 0.343
    assert wilson(0, 0) == (0.0, 1.0)
