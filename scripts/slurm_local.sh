#!/usr/bin/env bash
# A throwaway single-node Slurm cluster on this machine, for checking `srun zaya train`.
#   scripts/slurm_local.sh start   install Slurm and munge if missing (Debian, as root), write a
#                                  slurm.conf for this host into a temporary directory, start
#                                  munged, slurmctld and slurmd, wait until the node is idle, and
#                                  print `export SLURM_CONF=...` (eval it to use srun and sinfo)
#   scripts/slurm_local.sh stop    stop the three daemons started by `start` (by their pid files)
#                                  and remove the directory
#   scripts/slurm_local.sh env     print the `export SLURM_CONF=...` line of a running cluster
#
# Everything lives in $ZAYA_SLURM_DIR (default: $TMPDIR/zaya-slurm, TMPDIR defaulting to /tmp):
# its own munge key and socket, state, spool, logs. Nothing is written under /etc, so the
# cluster does not touch a real Slurm installation's configuration.
#
# Choices, and why:
# - MpiDefault=pmix: Debian's Open MPI reaches its processes' rank and world through PMIx (its
#   pmix/ext3x component on the system libpmix), and Debian's Slurm ships the matching PMIx
#   plugin; a plain `srun zaya train` then wires up MPI with no launcher flag.
# - The node declares at least 4 CPUs whatever it has (SlurmdParameters=config_overrides): the
#   tests run 2 and 3 ranks of one thread each on 2-core machines, as `mpirun --oversubscribe`
#   does. zaya sizes its threads from the real core count, not from Slurm's.
# - No cgroups (proctrack/linuxproc, task/none), no accounting: nothing that needs systemd or a
#   database, so it runs in containers and CI machines as root.
set -euo pipefail

dir="${ZAYA_SLURM_DIR:-${TMPDIR:-/tmp}/zaya-slurm}"
ctld_port="${ZAYA_SLURM_CTLD_PORT:-6817}"
slurmd_port="${ZAYA_SLURM_SLURMD_PORT:-6818}"

die() {
  echo "slurm_local: $*" >&2
  exit 1
}

install_if_missing() {
  local missing=()
  for p in slurmctld slurmd slurm-client munge; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  ((${#missing[@]} == 0)) && return
  [[ $(id -u) == 0 ]] || die "Slurm is not installed (${missing[*]}) and only root can install it"
  echo "slurm_local: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # The packages' own services are not started (no init system here, and we run our own).
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# The pid in `file` if that process is alive.
live_pid() {
  local file="$1" pid
  [[ -s "$file" ]] || return 1
  pid=$(<"$file")
  kill -0 "$pid" 2>/dev/null && echo "$pid"
}

write_conf() {
  local host cpus
  host=$(hostname -s)
  cpus=$(nproc)
  ((cpus < 4)) && cpus=4
  cat >"$dir/slurm.conf" <<EOF
ClusterName=zaya-local
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$dir/slurmd
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=pmix
ReturnToService=2
InactiveLimit=0
KillWait=5
MinJobAge=60
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
}

wait_idle() {
  local state=""
  for _ in $(seq 60); do
    state=$(SLURM_CONF="$dir/slurm.conf" sinfo -h -N -o '%t' 2>/dev/null | head -1 || true)
    [[ "$state" == idle ]] && return 0
    sleep 0.5
  done
  echo "slurm_local: the node did not become idle (sinfo says '${state:-nothing}'); logs:" >&2
  tail -n 20 "$dir/slurmctld.log" "$dir/slurmd.log" >&2 2>/dev/null || true
  return 1
}

start() {
  install_if_missing
  if live_pid "$dir/slurmctld.pid" >/dev/null; then
    wait_idle || die "a cluster in $dir is running but not usable; run '$0 stop' first"
    echo "export SLURM_CONF=$dir/slurm.conf"
    return
  fi
  rm -rf "$dir"
  mkdir -p "$dir/munge" "$dir/ctld" "$dir/slurmd"
  # munged refuses group- or world-writable directories on the way to its socket and key.
  chmod 700 "$dir" "$dir/munge"
  head -c 1024 /dev/urandom >"$dir/munge/munge.key"
  chmod 400 "$dir/munge/munge.key"
  munged --force --socket="$dir/munge/munge.socket" --key-file="$dir/munge/munge.key" \
    --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/munged.seed" ||
    die "munged did not start (see $dir/munge/munged.log)"
  write_conf
  SLURM_CONF="$dir/slurm.conf" slurmctld -i || die "slurmctld did not start (see $dir/slurmctld.log)"
  SLURM_CONF="$dir/slurm.conf" slurmd -N "$(hostname -s)" || die "slurmd did not start (see $dir/slurmd.log)"
  wait_idle || {
    stop >/dev/null 2>&1
    die "local Slurm did not come up"
  }
  echo "export SLURM_CONF=$dir/slurm.conf"
}

stop() {
  local pid
  for f in "$dir/slurmd.pid" "$dir/slurmctld.pid" "$dir/munge/munged.pid"; do
    pid=$(live_pid "$f") || continue
    kill "$pid"
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  done
  rm -rf "$dir"
  echo "slurm_local: stopped"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  env)
    live_pid "$dir/slurmctld.pid" >/dev/null || die "no local Slurm is running in $dir"
    echo "export SLURM_CONF=$dir/slurm.conf"
    ;;
  *) die "usage: $0 start|stop|env" ;;
esac
