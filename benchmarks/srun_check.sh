#!/usr/bin/env bash
# `srun zaya train` on a real one-node Slurm: starts one on this machine (scripts/slurm_local.sh),
# trains the demo model for a few steps at 1 rank, under `mpirun -np 2` and under `srun -n 2`, in
# the order-independent reduction mode (parallel.grad_reduce = "f64"), and checks that the three
# runs' per-step losses and final weights are bitwise equal; then runs the suite's Srun.* tests
# (tests/train/test_srun.cc: 2 and 3 ranks, threads per rank from the step, a batch script without
# srun, a killed rank). Stops Slurm at the end and prints the result.
#   benchmarks/srun_check.sh [STEPS]     (root; the demo part needs data/pydocs_*: scripts/demo.sh
#                                         makes it, and is skipped without it)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
cd "$ZAYA_ROOT"
steps="${1:-10}"
zaya="$ZAYA_BUILD/zaya"
[[ -x "$zaya" ]] || { echo "srun_check: build zaya first ($zaya)" >&2; exit 1; }
export OMP_WAIT_POLICY=PASSIVE

work="$(mktemp -d)"
cleanup() {
  scripts/slurm_local.sh stop >/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
eval "$(scripts/slurm_local.sh start)"
echo "srun_check: local Slurm up (SLURM_CONF=$SLURM_CONF); srun --mpi=list:"
srun --mpi=list 2>&1 | sed 's/^/  /'

failed=0
if [[ -f data/pydocs_train.idx ]]; then
  # A small step of the demo model: 4 micro-batches of 2 x 128 tokens, spread over the ranks.
  train() {  # NAME RANKS LAUNCHER...
    local name="$1" ranks="$2"
    shift 2
    "$@" "$zaya" --threads 1 train --config configs/demo.toml --set train.steps="$steps" \
      --set train.micro_batch=2 --set train.seq_len=128 --set train.grad_accum=$((4 / ranks)) \
      --set train.eval_every=0 --set train.progress=false --set optim.warmup_steps=5 \
      --set ckpt.every=0 --set ckpt.save_final=true --set 'parallel.grad_reduce="f64"' \
      --set train.out_dir="\"$work/$name\"" >"$work/$name.log" 2>&1 ||
      { echo "srun_check: the $name run failed:" >&2; tail -30 "$work/$name.log" >&2; return 1; }
    "$zaya" ckpt export-hf "$work/$name" --out "$work/$name.hf" --no-tokenizer >/dev/null
  }
  echo "srun_check: demo model, $steps steps, f64 reduction: 1 rank, mpirun -np 2, srun -n 2"
  train one 1
  train mpirun 2 mpirun --oversubscribe -np 2
  train srun 2 srun -N 1 -n 2
  echo "  srun's start-up summary:"
  grep -E "world: |batch: " "$work/srun.log" | sed 's/^[^]]*] /    /'
  python3 - "$work" "$steps" <<'PY' || failed=1
import hashlib, json, sys
work, steps = sys.argv[1], int(sys.argv[2])
def losses(name):
    return [json.loads(l)["loss"] for l in open(f"{work}/{name}/metrics.jsonl") if '"loss"' in l]
def weights(name):
    return hashlib.sha256(open(f"{work}/{name}.hf/model.safetensors", "rb").read()).hexdigest()
one = losses("one")
ok = len(one) == steps
for name in ("mpirun", "srun"):
    l = losses(name)
    same_losses = l == one
    same_weights = weights(name) == weights("one")
    ok &= same_losses and same_weights
    print(f"  {name:6s} vs 1 rank: losses of {len(l)} steps {'bitwise equal' if same_losses else 'DIFFER'}, "
          f"final weights {'bitwise equal' if same_weights else 'DIFFER'} (sha256 {weights(name)[:16]})")
print(f"  1 rank: loss {one[0]!r} at step 1, {one[-1]!r} at step {len(one)}")
sys.exit(0 if ok else 1)
PY
else
  echo "srun_check: no data/pydocs_* (scripts/demo.sh prepares it): skipping the demo-model comparison"
fi

echo "srun_check: the suite's Srun.* tests (toy model)"
if [[ -x "$ZAYA_BUILD/tests/test_train" ]]; then
  "$ZAYA_BUILD/tests/test_train" --gtest_filter='Srun.*' --gtest_brief=1 2>&1 | sed 's/^/  /' || failed=1
else
  echo "  not built (cmake --build $ZAYA_BUILD --target test_train)"
  failed=1
fi

if ((failed)); then
  echo "srun_check: FAILED"
  exit 1
fi
echo "srun_check: OK: srun -n 2 trains the model that 1 rank and mpirun -np 2 train, bitwise"
