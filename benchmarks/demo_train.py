"""Shared by the data- and context-parallel benchmarks: `zaya train` on configs/demo.toml with
--set overrides, alone or under `mpirun --oversubscribe -np RANKS`, and the step records its
metrics.jsonl holds."""
import json
import os
import subprocess
import sys

ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_WAIT_POLICY="PASSIVE")


def train_demo(zaya, ranks, threads, sets, out):
    """Runs the training (exits naming the command on failure); returns its log and step records."""
    cmd = ([] if ranks == 1 else ["mpirun", "--oversubscribe", "-np", str(ranks)]) + [
        zaya, "--threads", str(threads), "train", "--config", "configs/demo.toml"]
    for s in sets:
        cmd += ["--set", s]
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
    recs = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if '"loss"' in l]
    return p.stdout + p.stderr, recs
