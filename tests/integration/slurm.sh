# A real one-node Slurm cluster for the tests: the launcher titan's users have (issue 10).
# Sourced, not run; needs root and Debian's slurm-wlm and munge (scripts/setup.sh). slurm_start
# writes a slurm.conf naming this host with its CPUs and memory (slurmd -C), starts munged (a
# key of its own), slurmctld and slurmd on it, and exports SLURM_CONF so that srun, sbatch,
# scancel and squeue talk to it; it stops them on exit. Everything (config, sockets, spool,
# state, logs) lives in one scratch folder and the daemons listen on ports picked at random,
# so that test suites running at once on one machine each have their own cluster.
#
#   source tests/integration/slurm.sh
#   slurm_start
#   srun -n 2 ./titan ...          # MpiDefault=pmix: Open MPI ranks bootstrap through PMIx

SLURM_DIR=     # the scratch folder, made by slurm_start
SLURM_PIDS=()  # munged, slurmctld, slurmd: the daemons slurm_start started

slurm_fail() { echo "FAIL: slurm: $*" >&2; exit 1; }

# slurm_wait_for SECONDS CONDITION...: polls CONDITION every 0.1 s.
slurm_wait_for() {
  local deadline=$((SECONDS + $1)); shift
  until "$@"; do [ "$SECONDS" -lt "$deadline" ] || return 1; sleep 0.1; done
}

# Two TCP ports in a row that nothing listens on (bash connects to probe): slurmctld's and
# slurmd's.
slurm_listening() { (: </dev/tcp/127.0.0.1/"$1") 2>/dev/null; }
slurm_free_port() {
  local port
  while :; do
    port=$((20000 + RANDOM % 20000))
    slurm_listening "$port" || slurm_listening $((port + 1)) || break
  done
  echo "$port"
}

slurm_write_conf() {
  local node port=$1
  node=$(slurmd -C | head -n 1)  # NodeName=<host> CPUs=... RealMemory=...: what slurmd checks
  cat >"$SLURM_DIR/slurm.conf" <<EOF
ClusterName=titan$port
SlurmctldHost=$(hostname -s)(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SLURM_DIR/munge.socket
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmix
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
StateSaveLocation=$SLURM_DIR/state
SlurmdSpoolDir=$SLURM_DIR/spool
SlurmctldPidFile=$SLURM_DIR/slurmctld.pid
SlurmdPidFile=$SLURM_DIR/slurmd.pid
SlurmctldLogFile=$SLURM_DIR/slurmctld.log
SlurmdLogFile=$SLURM_DIR/slurmd.log
$node NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
EOF
}

slurm_queue_empty() { ! squeue -h -o %i 2>/dev/null | grep -q .; }
slurm_node_idle() { sinfo -h -N -o %T 2>/dev/null | grep -qx idle; }

slurm_start() {
  [ "$(id -u)" -eq 0 ] || slurm_fail "the test cluster runs its daemons as root"
  local tool
  for tool in munged mungekey slurmctld slurmd srun sbatch scancel sinfo; do
    command -v "$tool" >/dev/null ||
      slurm_fail "$tool is not installed (scripts/setup.sh installs slurm-wlm and munge)"
  done
  trap 'slurm_stop' EXIT
  SLURM_DIR=$(mktemp -d /tmp/titan-slurm.XXXXXX)
  mkdir -p "$SLURM_DIR/state" "$SLURM_DIR/spool"
  mungekey -c -k "$SLURM_DIR/munge.key"
  munged -F --force --key-file="$SLURM_DIR/munge.key" --socket="$SLURM_DIR/munge.socket" \
    --pid-file="$SLURM_DIR/munged.pid" --log-file="$SLURM_DIR/munged.log" \
    --seed-file="$SLURM_DIR/munged.seed" >"$SLURM_DIR/munged.out" 2>&1 &
  SLURM_PIDS+=($!)
  slurm_wait_for 10 test -S "$SLURM_DIR/munge.socket" || slurm_fail "munged did not start"
  slurm_write_conf "$(slurm_free_port)"
  export SLURM_CONF=$SLURM_DIR/slurm.conf
  slurmctld -D -i >"$SLURM_DIR/slurmctld.out" 2>&1 &
  SLURM_PIDS+=($!)
  slurmd -D -N "$(sed -n 's/^NodeName=\([^ ]*\).*/\1/p' "$SLURM_CONF")" \
    >"$SLURM_DIR/slurmd.out" 2>&1 &
  SLURM_PIDS+=($!)
  slurm_wait_for 30 slurm_node_idle ||
    slurm_fail "the node is not idle after 30 s: $(sinfo -N 2>&1 | tail -n 1);" \
      "$(tail -n 5 "$SLURM_DIR/slurmctld.log" "$SLURM_DIR/slurmd.log" 2>&1)"
}

# Cancels what is still queued or running, then stops the daemons this script started and
# removes the folder. The EXIT trap, replacing lib.sh's, so it removes lib.sh's scratch too.
slurm_stop() {
  local pid
  if [ "${SLURM_CONF:-}" = "$SLURM_DIR/slurm.conf" ]; then  # ours, not a real cluster's
    scancel --full --signal=KILL --user=root 2>/dev/null || true
    slurm_wait_for 10 slurm_queue_empty || true
  fi
  for pid in "${SLURM_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${SLURM_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "${SLURM_DIR:-/nonexistent}" "${SCRATCH:-/nonexistent}"
}
