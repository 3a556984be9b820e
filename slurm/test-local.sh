#!/usr/bin/env bash
# The PMPI tests under a real single-node Slurm started here: munged, slurmctld and slurmd from
# the distribution's packages, configured in a temporary directory (nothing in /etc is changed,
# the daemons run on their own ports and are stopped at the end), then
#   * mpi-tests/pmpi/pmpi_test.c (an unmodified MPI program) with `srun -n 4`, without and with
#     `--export=ALL,LD_PRELOAD=libzcomm_mpi.so`: every check passes, pass-through results are bit
#     for bit those of the run without the library, the JSON report shows compressed calls;
#   * mpi-tests/pmpi/pmpi_test.py (mpi4py) the same way, when mpi4py and numpy import, and
#     mpi-tests/pmpi/pmpi_test.f90 (use mpi) when mpif90 works;
#   * slurm/pmpi.sbatch submitted with sbatch (the script users run), its report checked.
#
# Exit status: 0 passed, 1 failed, 77 skipped: Slurm could not be installed or started here
# (the reason is printed; never a pass). Needs root (slurmd runs as root) unless the daemons are
# already installed and ZCOMM_SLURM_USER_OK=1 says slurmd may run as this user.
#
# Usage: slurm/test-local.sh            (installs slurm-wlm + munge with apt-get when missing and
#                                        root; ZCOMM_SLURM_NO_INSTALL=1 forbids that)
# Env: ZCOMM_SLURM_KEEP=1 keeps the temporary directory (logs, configuration).
set -uo pipefail
cd "$(dirname "$0")/.."
SKIP=77

skip() {
    echo "SKIPPED: slurm/test-local.sh: $*"
    exit "$SKIP"
}
die() {
    echo "FAILED: slurm/test-local.sh: $*"
    exit 1
}

# ---------------------------------------------------------------- prerequisites
need=(srun sbatch sinfo scontrol slurmctld slurmd munged)
missing() {
    local m=()
    for c in "${need[@]}"; do command -v "$c" >/dev/null 2>&1 || m+=("$c"); done
    echo "${m[*]}"
}
if [ -n "$(missing)" ]; then
    if [ "${ZCOMM_SLURM_NO_INSTALL:-0}" != 1 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "== installing slurm-wlm and munge (apt-get; missing: $(missing))"
        export DEBIAN_FRONTEND=noninteractive
        { timeout 300 apt-get update -qq &&
            timeout 300 apt-get install -y -qq --no-install-recommends slurm-wlm munge; } \
            >/tmp/zcomm-slurm-apt.log 2>&1 || skip "apt-get install slurm-wlm munge failed (see /tmp/zcomm-slurm-apt.log)"
    fi
    [ -z "$(missing)" ] || skip "missing $(missing) (install the distribution's slurm-wlm and munge packages)"
fi
if [ "$(id -u)" != 0 ] && [ "${ZCOMM_SLURM_USER_OK:-0}" != 1 ]; then
    skip "slurmd must run as root here (or set ZCOMM_SLURM_USER_OK=1)"
fi
command -v mpicc >/dev/null || skip "mpicc not found (Open MPI development package)"

# ---------------------------------------------------------------- build
cargo build --release -p zcomm-mpi || die "cargo build failed"
TARGET_DIR=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
LIB="$TARGET_DIR/release/libzcomm_mpi.so"
[ -f "$LIB" ] || die "missing $LIB"

T=$(mktemp -d /tmp/zcomm-slurm.XXXXXX)
chmod 755 "$T"
PIDS=()
cleanup() {
    # stop only the daemons this script started, by their process ids
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    sleep 1
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
    if [ "${ZCOMM_SLURM_KEEP:-0}" = 1 ]; then echo "kept $T"; else rm -rf "$T"; fi
}
trap cleanup EXIT
mpicc -O2 -Wall -o "$T/pmpi_test" mpi-tests/pmpi/pmpi_test.c -lm || die "mpicc failed"

# ---------------------------------------------------------------- munge
mkdir -p "$T/munge" "$T/state" "$T/spool" "$T/log"
dd if=/dev/urandom of="$T/munge/munge.key" bs=1024 count=1 status=none
chmod 700 "$T/munge"
chmod 400 "$T/munge/munge.key"
MUNGE_SOCK="$T/munge/munge.socket"
munged --force --socket="$MUNGE_SOCK" --key-file="$T/munge/munge.key" \
    --pid-file="$T/munge/munged.pid" --log-file="$T/log/munged.log" \
    --seed-file="$T/munge/munged.seed" --foreground >/dev/null 2>&1 &
PIDS+=($!)
for _ in $(seq 50); do [ -S "$MUNGE_SOCK" ] && break; sleep 0.1; done
[ -S "$MUNGE_SOCK" ] || { cat "$T/log/munged.log" 2>/dev/null; skip "munged did not start"; }
munge --socket="$MUNGE_SOCK" -n | unmunge --socket="$MUNGE_SOCK" >/dev/null 2>&1 ||
    skip "munge cannot encode/decode a credential (see $T/log/munged.log)"

# ---------------------------------------------------------------- slurm.conf
HOST=$(hostname -s)
CPUS=$(nproc)
# the node line as slurmd sees the hardware (sockets, cores, memory), else a plain one
NODE=$(slurmd -C 2>/dev/null | grep '^NodeName=' | head -1)
[ -n "$NODE" ] || NODE="NodeName=$HOST CPUs=$CPUS"
OVERRIDES=
if [ "$CPUS" -lt 4 ]; then
    # 4 ranks on fewer cores (a CI machine): the node is declared with 4 (config_overrides makes
    # slurmd accept it; the ranks share the cores, as with mpirun --oversubscribe)
    NODE="NodeName=$HOST CPUs=4 Boards=1 SocketsPerBoard=1 CoresPerSocket=4 ThreadsPerCore=1"
    OVERRIDES="SlurmdParameters=config_overrides"
fi
mkdir -p "$T/spool/slurmd-$HOST"
# free ports, different from a site Slurm's 6817/6818
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
CTLD_PORT=$(port)
SLURMD_PORT=$(port)
MPI_PLUGIN=none
for m in pmix pmi2; do
    for f in /usr/lib/*/slurm-wlm/mpi_$m.so /usr/lib/slurm/mpi_$m.so /usr/lib64/slurm/mpi_$m.so; do
        [ -e "$f" ] && MPI_PLUGIN=$m && break 2
    done
done
[ "$MPI_PLUGIN" = none ] && skip "neither Slurm's pmix nor pmi2 plugin is installed (Open MPI needs one to start under srun)"
export SLURM_CONF="$T/slurm.conf"
cat >"$SLURM_CONF" <<EOF
ClusterName=zcommtest
SlurmctldHost=$HOST
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=$(id -un)
SlurmdUser=$(id -un)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCK
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool/slurmd-%n
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd.pid
SlurmctldLogFile=$T/log/slurmctld.log
SlurmdLogFile=$T/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=$MPI_PLUGIN
ReturnToService=2
$OVERRIDES
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
$NODE State=UNKNOWN
PartitionName=zcomm Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
EOF
# no cgroup.conf: the cgroup plugin autodetects (proctrack/linuxproc and task/none use no cgroups)

# ---------------------------------------------------------------- daemons
slurmctld -D -i -f "$SLURM_CONF" >>"$T/log/slurmctld.out" 2>&1 &
PIDS+=($!)
sleep 1
slurmd -D -f "$SLURM_CONF" -N "$HOST" >>"$T/log/slurmd.out" 2>&1 &
PIDS+=($!)
up=0
for _ in $(seq 60); do
    state=$(sinfo -h -N -n "$HOST" -o %t 2>/dev/null | head -1)
    case "$state" in idle* | mix* | alloc*) up=1 && break ;; esac
    sleep 1
done
if [ "$up" != 1 ]; then
    echo "node state: '${state:-none}'"
    tail -n 20 "$T/log/slurmctld.log" "$T/log/slurmd.log" "$T/log/slurmctld.out" "$T/log/slurmd.out" 2>/dev/null
    skip "slurmctld/slurmd did not bring the node up (logs above)"
fi
echo "== Slurm $(sinfo -V | awk '{print $2}') up on $HOST ($CPUS CPUs), srun --mpi=$MPI_PLUGIN"
sinfo

# ---------------------------------------------------------------- tests
fail=0
FAILED=()
failed() {
    echo "FAILED: $*"
    FAILED+=("$*")
    fail=1
}
E=1e-3
export OMPI_MCA_mpi_yield_when_idle=1
export ZCOMM_PROFILE="$T/profile.json"
SRUN=(srun -n 4 --mpi="$MPI_PLUGIN" --time=5 --kill-on-bad-exit=1)
ZENV="ALL,LD_PRELOAD=$LIB,ZCOMM_ERROR_BOUND=abs:$E,ZCOMM_POLICY=always"

echo "== srun -n 4 pmpi_test (without the library)"
if ! timeout 300 "${SRUN[@]}" --export=ALL "$T/pmpi_test" "$E" >"$T/plain.txt" 2>&1; then
    cat "$T/plain.txt"
    # the very first launch tells whether MPI can start under this Slurm at all
    grep -qiE "pmix|pmi2|OPAL_ERR|orte_init|ess_init" "$T/plain.txt" &&
        skip "Open MPI cannot start under this Slurm's --mpi=$MPI_PLUGIN (output above): not a zcomm failure"
    failed "srun pmpi_test without LD_PRELOAD"
fi
echo "== srun -n 4 --export=ALL,LD_PRELOAD=libzcomm_mpi.so pmpi_test"
if timeout 300 "${SRUN[@]}" --export="$ZENV,ZCOMM_REPORT=$T/report.json" "$T/pmpi_test" "$E" >"$T/zcomm.txt" 2>&1; then
    grep -E "^(ok|FAIL)|PASSED|CHECKSUM" "$T/zcomm.txt"
    a=$(grep CHECKSUM "$T/plain.txt" || true)
    b=$(grep CHECKSUM "$T/zcomm.txt" || true)
    if [ -z "$a" ] || [ "$a" != "$b" ]; then failed "pass-through results differ from plain MPI ($a vs $b)"; fi
    python3 - "$T/report.json" <<'EOF' || failed "report"
import json, sys
r = json.load(open(sys.argv[1]))
ops = ["MPI_Allreduce", "MPI_Iallreduce", "MPI_Reduce_scatter_block", "MPI_Allgather", "MPI_Bcast",
       "MPI_Sendrecv", "MPI_Send", "MPI_Recv", "MPI_Isend", "MPI_Irecv"]
bad = [op for op in ops if not (r["total"].get(op, {}).get("compressed", 0) >= 1 and r["total"][op]["ratio"] > 1)]
print(f"  report: {r['ranks']} ranks; " + ", ".join(f"{op} x{r['total'][op]['ratio']:.1f}" for op in ops if op not in bad))
sys.exit(1 if bad or r["ranks"] != 4 else 0)
EOF
else
    cat "$T/zcomm.txt"
    failed "srun pmpi_test with LD_PRELOAD"
fi

if python3 -c "import mpi4py, numpy" 2>/dev/null; then
    echo "== srun -n 4 python3 pmpi_test.py (mpi4py) with the library"
    if timeout 300 "${SRUN[@]}" --export="$ZENV,ZCOMM_REPORT=$T/py.json" python3 mpi-tests/pmpi/pmpi_test.py "$E" \
        >"$T/py.txt" 2>&1; then
        grep -E "^(ok|FAIL)|PASSED" "$T/py.txt"
        python3 -c "
import json, sys; t = json.load(open('$T/py.json'))['total']
sys.exit(0 if t['MPI_Allreduce']['compressed'] > 0 and t['MPI_Iallreduce']['compressed'] > 0 else 1)" ||
            failed "mpi4py report"
    else
        cat "$T/py.txt"
        failed "srun mpi4py with LD_PRELOAD"
    fi
else
    echo "== mpi4py/numpy not importable: the mpi4py run is left out"
fi

if command -v mpif90 >/dev/null && mpif90 -O2 -o "$T/pmpi_test_f" mpi-tests/pmpi/pmpi_test.f90 >/dev/null 2>&1; then
    echo "== srun -n 4 pmpi_test.f90 (use mpi) with the library"
    if timeout 300 "${SRUN[@]}" --export="$ZENV,ZCOMM_REPORT=$T/f.json" "$T/pmpi_test_f" "$E" >"$T/f.txt" 2>&1; then
        grep -E "^(ok|FAIL)|PASSED" "$T/f.txt"
        python3 -c "
import json, sys; t = json.load(open('$T/f.json'))['total']
sys.exit(0 if all(t[o]['compressed'] > 0 for o in ('MPI_Allreduce', 'MPI_Iallreduce', 'MPI_Bcast')) else 1)" ||
            failed "Fortran report"
    else
        cat "$T/f.txt"
        failed "srun Fortran with LD_PRELOAD"
    fi
else
    echo "== no working mpif90/gfortran: the Fortran run is left out"
fi

echo "== sbatch slurm/pmpi.sbatch (the batch script users submit)"
OUTDIR="$T/sbatch-out"
jid=$(ZCOMM_MPI_LIB="$LIB" ZCOMM_OUT="$OUTDIR" ZCOMM_SRUN_MPI="$MPI_PLUGIN" ZCOMM_POLICY=always \
    sbatch --parsable --export=ALL --output="$T/sbatch-%j.out" --chdir="$PWD" slurm/pmpi.sbatch 2>&1)
if ! [[ "$jid" =~ ^[0-9]+ ]]; then
    failed "sbatch refused the job: $jid"
else
    for _ in $(seq 300); do
        st=$(scontrol show job "$jid" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
        case "$st" in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY) break ;; esac
        sleep 1
    done
    echo "  job $jid: ${st:-unknown}"
    grep -E "PASSED|FAILED|report:" "$T/sbatch-$jid.out" || true
    if [ "$st" != COMPLETED ] || ! grep -q PASSED "$T/sbatch-$jid.out" || [ ! -s "$OUTDIR/zcomm-report.json" ]; then
        cat "$T/sbatch-$jid.out" 2>/dev/null
        failed "sbatch slurm/pmpi.sbatch"
    fi
fi

if [ "$fail" != 0 ]; then
    echo "logs: $T/log (ZCOMM_SLURM_KEEP=1 keeps them)"
    echo "Slurm PMPI tests FAILED: ${FAILED[*]}"
    exit 1
fi
echo "Slurm PMPI tests passed"
