#!/bin/bash
# A stand-in for `zaya train` that speaks the Aegis contract (heartbeat files, exit codes), for
# the supervisor's tests. Usage: fake_job.sh OUT_DIR STEPS PLAN [ARGS...]
# PLAN is a comma-separated list of modes, one per attempt (ZAYA_INJECT_ATTEMPT, 1-based; the last
# repeats): ok | crash@K | exit2@K | hang@K | nan@K | spike@K | oom@K | xid@K | timeout@K | kill9@K |
# silent-crash (no heartbeats, exit 1) | silent-ok (no heartbeats, exit 0) | silent-hang (no heartbeats, sleeps) |
# stuck-after-timeout | slow (rank 1 of 2 is 4x slower).
# Heartbeats are polled (every 0.2 s), so the modes whose evidence is one heartbeat hold it longer.
# FAKE_STEP_S sets the step time (default 0.02 s).
# The ARGS (what the supervisor appended) are printed first, so tests can check them.
out=$1; steps=$2; plan=$3; shift 3
attempt=${ZAYA_INJECT_ATTEMPT:-1}
IFS=, read -ra modes <<< "$plan"
mode=${modes[$((attempt - 1))]:-${modes[${#modes[@]} - 1]}}
kind=${mode%@*}; at=${mode#*@}
echo "fake_job attempt=$attempt mode=$mode args: $*"
mkdir -p "$out/heartbeat"
declare -A seq
host=$(hostname)
hb() {  # rank world step phase loss nonfinite step_time
  local r=$1 f
  seq[$r]=$((${seq[$r]:-0} + 1))
  f=$(printf '%s/heartbeat/rank_%05d.json' "$out" "$r")
  printf '{"rank":%d,"world":%d,"pid":%d,"host":"%s","seq":%d,"step":%d,"phase":"%s","time":%s,"loss":%s,"grad_norm":1.0,"step_time":%s,"nonfinite":%s,"error":null}\n' \
    "$r" "$2" $$ "$host" "${seq[$r]}" "$3" "$4" "$(date +%s.%N)" "$5" "$7" "$6" > "$f.tmp" && mv "$f.tmp" "$f"
}
case $kind in
  silent-crash) sleep 0.2; echo "failing without heartbeats"; exit 1 ;;
  silent-ok) sleep 0.2; exit 0 ;;
  silent-hang) sleep 1000 ;;
  stuck-after-timeout)  # reports a collective timeout, then never exits (a stopped rank holds the launcher)
    echo "zaya: error: collective #4 (all_reduce) on rank 0 of 2 timed out after 5 s: rank 1 never arrived (no answer)"
    sleep 1000 ;;
esac
world=1; [ "$kind" = slow ] && world=2
for ((r = 0; r < world; r++)); do hb $r $world 0 start null false null; done
for ((s = 1; s <= steps; s++)); do
  sleep "${FAKE_STEP_S:-0.02}"
  if [ "$s" = "$at" ]; then
    case $kind in
      crash) echo "something broke at step $s"; exit 1 ;;
      exit2) echo "zaya: error: bad config key"; exit 2 ;;
      hang) sleep 1000 ;;
      nan) hb 0 1 $s train null true 0.02; echo "non-finite loss at step $s"; exit 4 ;;
      spike) hb 0 1 $s train 100.0 false 0.02; sleep 0.6; continue ;;  # long enough to be polled
      oom) echo "terminate called after throwing an instance of 'std::bad_alloc'"; exit 134 ;;
      xid) echo "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."; exit 1 ;;
      timeout) echo "zaya: error: collective #12 (all_reduce) on rank 0 of 2 timed out after 5 s: rank 1 never arrived (no answer)"; exit 3 ;;
      kill9) kill -9 $$ ;;
    esac
  fi
  loss=$(printf '2.%03d' $((999 - s % 1000)))
  hb 0 $world $s train "$loss" false 0.02
  # Each slow step lasts beyond the supervisor's poll interval, so every one is seen.
  [ "$kind" = slow ] && hb 1 $world $s train "$loss" false 0.08 && sleep 0.3
done
for ((r = 0; r < world; r++)); do hb $r $world $steps done null false null; done
exit 0
