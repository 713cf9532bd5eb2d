#!/usr/bin/env bash
# How much CPU time the hypervisor is taking right now: loads every vCPU with a busy loop for N
# seconds (default 5) and prints the share of that time /proc/stat counts as stolen. On a shared VM
# a benchmark run while this reads more than a few percent times the neighbours, not the code.
#   tools/steal_probe.sh [SECONDS]
set -euo pipefail
secs=${1:-5}
cpus=$(nproc)
for _ in $(seq "$cpus"); do timeout "$secs" sh -c 'while :; do :; done' & done
read -r _ a1 a2 a3 a4 a5 a6 a7 a8 _ < /proc/stat
sleep "$secs"
read -r _ b1 b2 b3 b4 b5 b6 b7 b8 _ < /proc/stat
wait
total=$(( (b1-a1) + (b2-a2) + (b3-a3) + (b4-a4) + (b5-a5) + (b6-a6) + (b7-a7) + (b8-a8) ))
(( total > 0 )) || total=1
echo "steal $(( 100 * (b8 - a8) / total ))% over ${secs} s on ${cpus} busy CPUs"
