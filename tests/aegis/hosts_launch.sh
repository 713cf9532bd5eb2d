#!/usr/bin/env bash
# A launch template that plays several hosts on one machine, for `zaya supervise --hosts`:
#   hosts_launch.sh {hosts} <zaya> [zaya options] train ARGS...
# Each "name:slots" of the hosts list (as the supervisor substitutes {hosts}) becomes one part of
# an MPMD mpirun, in list order, so ranks fill the hosts by slot as the supervisor assumes. The
# ranks of the host named by $ZAYA_TEST_FAIL_HOST get $ZAYA_TEST_FAIL_INJECT as an extra --inject:
# a fault that happens only "on that host". The global batch of $ZAYA_TEST_GLOBAL_BATCH
# micro-batches is kept at every world size (--set train.grad_accum), as a resume at another world
# size requires.
set -euo pipefail
hosts=$1
shift
IFS=, read -ra list <<< "$hosts"
np=0
for h in "${list[@]}"; do np=$((np + ${h##*:})); done
if (( np == 0 || ZAYA_TEST_GLOBAL_BATCH % np != 0 )); then
  echo "hosts_launch.sh: $np ranks do not divide the global batch of $ZAYA_TEST_GLOBAL_BATCH" >&2
  exit 2
fi
parts=()
for h in "${list[@]}"; do
  extra=()
  [[ "${h%%:*}" == "${ZAYA_TEST_FAIL_HOST:-}" ]] && extra=(--inject "$ZAYA_TEST_FAIL_INJECT")
  (( ${#parts[@]} > 0 )) && parts+=(:)
  parts+=(-np "${h##*:}" "$@" --set "train.grad_accum=$((ZAYA_TEST_GLOBAL_BATCH / np))" "${extra[@]}")
done
exec mpirun --oversubscribe "${parts[@]}"
