"""tools/plot_metrics.py reads a run's metrics.jsonl as one curve (issue 35, finding 7): a torn
last line (a run killed in the middle of a write) is skipped instead of rejecting the file, and a
step written twice (records replayed after a resume, in a file from before zaya dropped them on
resume) is taken from the later record.

Run: .venv/bin/python -m pytest tests/python/test_plot_metrics.py
"""
import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")
ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("plot_metrics", ROOT / "tools" / "plot_metrics.py")
plot_metrics = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plot_metrics)


def rec(step, loss, **kw):
    return json.dumps({"step": step, "tokens": 100 * step, "loss": loss, "lr": 1e-3, "grad_norm": 1.0, **kw})


def test_torn_tail_and_replayed_steps_give_one_curve(tmp_path):
    lines = [rec(s, 10.0 - s) for s in range(1, 9)]           # the first run, killed after step 8
    lines.append(json.dumps({"step": 5, "tokens": 500, "val_loss": 4.0}))
    lines += [rec(s, 20.0 - s) for s in range(6, 11)]          # resumed from step 5: 6..10 again
    text = "\n".join(lines) + "\n" + '{"step": 11, "loss": 9.'  # killed mid-write at step 11
    (tmp_path / "metrics.jsonl").write_text(text)
    train, val = plot_metrics.load(str(tmp_path))
    assert [r["step"] for r in train] == list(range(1, 11))
    assert [r["loss"] for r in train[5:]] == [20.0 - s for s in range(6, 11)]  # the resumed run's
    assert [r["step"] for r in val] == [5]


def test_a_broken_line_inside_the_file_is_still_an_error(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(rec(1, 3.0) + "\n{not json\n" + rec(2, 2.0) + "\n")
    with pytest.raises(SystemExit, match="metrics.jsonl:2: not JSON"):
        plot_metrics.load(str(tmp_path))


def test_without_matplotlib_it_names_the_venv(tmp_path):
    # -S: no site-packages, as the system Python without matplotlib
    import subprocess
    import sys
    res = subprocess.run([sys.executable, "-S", str(ROOT / "tools" / "plot_metrics.py"), str(tmp_path)],
                         capture_output=True, text=True)
    assert res.returncode == 1 and ".venv/bin/python tools/plot_metrics.py" in res.stderr, res.stderr
