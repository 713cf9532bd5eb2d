#!/usr/bin/env python3
"""Soak test of crash recovery (not part of the test suite): kill -9 a training run at random
moments, resume it with --resume each time, and check that the weights it ends with are bitwise
those of an undisturbed run.

A tiny model on a tiny synthetic corpus keeps each attempt to about a second, most of it start-up,
so the kills land everywhere: while starting, while training, inside the asynchronous checkpoint
writes and their commits, during the final evaluation and save. When a run completes before the
requested number of kills, its final checkpoint is compared with the reference and a new run
starts in a fresh directory (a "round"), until --kills kills have been delivered.

    benchmarks/soak_kill_resume.py --kills 200            # uses build/$ZAYA_PRESET/zaya

Exit status 0 when every round ended bitwise equal to the reference and no attempt that was not
killed failed; 1 otherwise (the failing attempt's log is printed).
"""
import argparse
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from toy_corpus import MODEL, write_corpus  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_config(path, prefix, out_dir, args):
    with open(path, "w") as f:
        f.write(MODEL + f"""[data]
train = ["{prefix}"]
val = "{prefix}"
[train]
steps = {args.steps}
micro_batch = 2
seq_len = 16
grad_accum = 2
eval_every = 0
eval_samples = 4
progress = false
out_dir = "{out_dir}"
[optim]
lr = 3e-3
warmup_steps = 5
balance_lr = 1e-3
[ckpt]
every = {args.every}
keep_last = 3
snapshot = "{args.snapshot}"
""")


def has_checkpoint(run_dir):
    return os.path.isdir(run_dir) and any(re.fullmatch(r"step_\d{7,}", n) for n in os.listdir(run_dir))


def final_weights(run_dir, steps):
    path = os.path.join(run_dir, "step_%07d" % steps, "rank_00000.safetensors")
    with open(path, "rb") as f:
        return f.read()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    preset = os.environ.get("ZAYA_PRESET", "cuda" if shutil.which("nvcc") or os.path.exists("/usr/local/cuda/bin/nvcc") else "cpu")
    ap.add_argument("--binary", default=os.path.join(REPO, "build", preset, "zaya"))
    ap.add_argument("--kills", type=int, default=200, help="kill -9s to deliver (default 200)")
    ap.add_argument("--max-minutes", type=float, default=0, help="stop earlier after this long (0: no limit)")
    ap.add_argument("--steps", type=int, default=100, help="steps of each run")
    ap.add_argument("--max-delay", type=float, default=0,
                    help="kill moments uniform in [0, this] seconds after each start (0: from the reference run)")
    ap.add_argument("--every", type=int, default=2, help="ckpt.every")
    ap.add_argument("--snapshot", default="deferred", choices=["deferred", "copy", "fork"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1, help="seed of the kill moments")
    ap.add_argument("--workdir", default="", help="where runs go (default: a temporary directory, removed)")
    args = ap.parse_args()

    rng = random.Random(args.seed)
    work = args.workdir or tempfile.mkdtemp(prefix="zaya_soak_")
    os.makedirs(work, exist_ok=True)
    prefix = os.path.join(work, "toy")
    write_corpus(prefix)
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    base = [args.binary, "--threads", str(args.threads), "train"]

    # The reference: one undisturbed run. Its start-up (until the first metrics record) and wall time
    # set the range of the kill moments: from the start to the middle of a fresh run's training, so a
    # run takes several kills before one attempt lives long enough to finish it.
    ref_dir = os.path.join(work, "reference")
    write_config(os.path.join(work, "reference.toml"), prefix, ref_dir, args)
    t0 = time.monotonic()
    with open(os.path.join(work, "reference.log"), "w") as log:
        p = subprocess.Popen(base + ["--config", os.path.join(work, "reference.toml")], env=env, stdout=log,
                             stderr=subprocess.STDOUT)
        metrics = os.path.join(ref_dir, "metrics.jsonl")
        while p.poll() is None and not (os.path.exists(metrics) and os.path.getsize(metrics) > 0):
            time.sleep(0.005)
        startup = time.monotonic() - t0
        p.wait()
    wall = time.monotonic() - t0
    if p.returncode != 0:
        print(open(os.path.join(work, "reference.log")).read())
        sys.exit("reference run failed")
    reference = final_weights(ref_dir, args.steps)
    max_delay = args.max_delay or startup + 0.5 * (wall - startup)
    print(f"soak: reference run of {args.steps} steps (ckpt.every {args.every}, snapshot {args.snapshot}) "
          f"took {wall:.2f} s, {startup:.2f} s of it start-up; kill moments uniform in [0, {max_delay:.2f}] s "
          f"after each start")

    kills = attempts = rounds = 0
    seen = {"latest_disagreed": 0, "rejected": 0, "leftover_removed": 0, "nothing_to_do": 0, "resumed": 0}
    start = time.monotonic()
    log_path = os.path.join(work, "attempt.log")
    failures = 0
    while kills < args.kills:
        if args.max_minutes and time.monotonic() - start > 60 * args.max_minutes:
            print(f"soak: stopping after {args.max_minutes} minutes")
            break
        rounds += 1
        run_dir = os.path.join(work, "run_%04d" % rounds)
        cfg = os.path.join(work, "run.toml")
        write_config(cfg, prefix, run_dir, args)
        round_kills = 0
        while True:
            attempts += 1
            cmd = base + ["--config", cfg] + (["--resume"] if has_checkpoint(run_dir) else [])
            with open(log_path, "w") as log:
                p = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
                delay = rng.uniform(0, max_delay)
                try:
                    p.wait(timeout=delay)
                except subprocess.TimeoutExpired:
                    p.send_signal(signal.SIGKILL)
                    p.wait()
            with open(log_path) as f:
                text = f.read()
            seen["latest_disagreed"] += "`latest` names" in text
            seen["rejected"] += "fails verification" in text
            seen["leftover_removed"] += "removed leftover" in text
            seen["nothing_to_do"] += "nothing to do" in text
            seen["resumed"] += "resumed from" in text
            if p.returncode == -signal.SIGKILL:
                kills += 1
                round_kills += 1
                if kills >= args.kills:
                    break
                continue
            if p.returncode != 0:
                failures += 1
                print(f"soak: FAILURE: attempt {attempts} ({' '.join(cmd)}) exited {p.returncode}:\n{text}")
                break
            break  # the run completed
        if failures:
            break
        if kills >= args.kills and not os.path.exists(os.path.join(run_dir, "step_%07d" % args.steps)):
            # The last kill interrupted this round: finish it undisturbed, so it is checked too.
            resume = ["--resume"] if has_checkpoint(run_dir) else []
            r = subprocess.run(base + ["--config", cfg] + resume, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
            attempts += 1
            if r.returncode != 0:
                failures += 1
                print(f"soak: FAILURE: the final resume exited {r.returncode}:\n{r.stdout}")
                break
        same = final_weights(run_dir, args.steps) == reference
        verify = subprocess.run([args.binary, "ckpt", "verify", run_dir], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        print(f"soak: round {rounds}: {round_kills} kills, final weights "
              f"{'bitwise equal to' if same else 'DIFFERENT FROM'} the reference, ckpt verify exit {verify.returncode}")
        if not same or verify.returncode != 0:
            failures += 1
            break
        shutil.rmtree(run_dir)

    minutes = (time.monotonic() - start) / 60
    print(f"soak: {kills} kills in {attempts} attempts over {rounds} rounds, {minutes:.1f} minutes; "
          f"resumes {seen['resumed']}, `latest` disagreed {seen['latest_disagreed']}, "
          f"checkpoints failing verification {seen['rejected']}, leftover .tmp removed {seen['leftover_removed']}, "
          f"'nothing to do' {seen['nothing_to_do']}")
    print("soak: PASS" if failures == 0 else "soak: FAIL")
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if failures == 0 else 1)


if __name__ == "__main__":
    main()
