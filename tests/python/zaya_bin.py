"""The zaya binary the Python tests drive: $ZAYA_BINARY (what ctest sets), else the first build
found in the checkout; a test without one skips."""
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def zaya_binary():
    env = os.environ.get("ZAYA_BINARY")
    if env:
        return env
    for cand in ("build/cuda/zaya", "build/cpu/zaya", "build/model/zaya"):
        p = ROOT / cand
        if p.exists():
            return str(p)
    pytest.skip("no zaya binary: set ZAYA_BINARY")
