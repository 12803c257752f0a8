# Emulated hosts for mpirun on one machine, sourced by tests/dist/test_dist_hosts.sh and
# bench/bench_hosts.sh (bash). Each host is a network namespace with its own TCP stack, joined to
# the others by netns_link.py (a one-way delay and a loss rate per packet, in user space). mpirun
# runs in the first namespace and starts the daemons of the others through an rsh agent that
# enters their namespace (`ip netns exec`) instead of ssh; Open MPI sees one node per address and
# speaks TCP between them (btl tcp,self; no shared memory across hosts).
#
#   hosts_up N DELAY_MS LOSS   N namespaces qt<pid>h0.. (10.77.<pid % 250>.1, .2, ...), the link up
#   hosts_mpirun ARGS...       mpirun with one process per host (-np N, OMP_NUM_THREADS=1) + ARGS
#   hosts_ns I                 the name of host I's namespace
#   hosts_first_epoch CSV JOB  waits until a run's metrics.csv holds its first epoch's row (1 when
#                              the background job JOB ended first, or after 60 s)
#   hosts_lose_second HOW      the second host lost: kill (every process of its namespace, Open
#                              MPI's daemon included: its connections close) or partition (the
#                              link stops carrying packets: no connection closes)
#   hosts_down                 the link and the namespaces gone (also on EXIT: hosts_up sets a trap
#                              that calls it, after the caller's own EXIT trap, if any)
# Needs root (network namespaces, TUN devices): hosts_up fails with a message otherwise.

HOSTS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
HOSTS_N=0
HOSTS_PREFIX=qt$$h
HOSTS_NET=10.77.$(($$ % 250))
HOSTS_TMP=

hosts_ns() { echo "$HOSTS_PREFIX$1"; }

hosts_first_epoch() { # CSV JOB
  local i
  for ((i = 0; i < 1200; i++)); do
    [ -f "$1" ] && [ "$(wc -l <"$1")" -ge 2 ] && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}

hosts_lose_second() { # kill | partition
  if [ "$1" = kill ]; then
    local pids
    pids=$(ip netns pids "$(hosts_ns 1)" | tr '\n' ' ')
    [ -n "$pids" ] || return 1
    # shellcheck disable=SC2086
    kill -9 $pids
  else
    kill "$(cat "$HOSTS_TMP/link.pid")"
  fi
}

hosts_down() {
  [ -n "$HOSTS_TMP" ] || return 0
  kill "$(cat "$HOSTS_TMP/link.pid" 2>/dev/null)" 2>/dev/null || true
  local i
  for ((i = 0; i < HOSTS_N; i++)); do
    ip netns pids "$(hosts_ns $i)" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$(hosts_ns $i)" 2>/dev/null || true
  done
  rm -rf "$HOSTS_TMP"
  HOSTS_TMP=
}

hosts_up() { # N DELAY_MS LOSS
  local n=$1 delay=$2 loss=$3 i args=()
  [ "$(id -u)" = 0 ] || { echo "hosts_up: emulated hosts need root (network namespaces)" >&2; return 1; }
  HOSTS_TMP=$(mktemp -d)
  local prev
  prev=$(trap -p EXIT | sed -e "s/^trap -- '//" -e "s/' EXIT\$//")
  # shellcheck disable=SC2064
  trap "$prev${prev:+; }hosts_down" EXIT
  HOSTS_N=$n
  for ((i = 0; i < n; i++)); do
    ip netns add "$(hosts_ns $i)" || { echo "hosts_up: cannot create network namespace $(hosts_ns $i)" >&2; return 1; }
    args+=("$(hosts_ns $i)" "$HOSTS_NET.$((i + 1))")
    # a connection with unacknowledged data gives up after 5 retransmissions (about 13 s) instead
    # of the default 15 (about 15 minutes): how long mpirun waits for a daemon cut off by a
    # partition before it ends (docs/training.md, "A lost host")
    ip netns exec "$(hosts_ns $i)" sysctl -qw net.ipv4.tcp_retries2=5 || return 1
  done
  /usr/bin/python3 "$HOSTS_DIR/netns_link.py" "$HOSTS_TMP/ready" "$delay" "$loss" 1 "${args[@]}" \
    2>"$HOSTS_TMP/link.err" &
  echo $! >"$HOSTS_TMP/link.pid"
  for ((i = 0; i < 100; i++)); do
    [ -s "$HOSTS_TMP/ready" ] && break
    kill -0 "$(cat "$HOSTS_TMP/link.pid")" 2>/dev/null || break
    sleep 0.1
  done
  [ -s "$HOSTS_TMP/ready" ] || { echo "hosts_up: the link did not start: $(cat "$HOSTS_TMP/link.err")" >&2; return 1; }
  # the rsh agent: host address -> its namespace
  {
    echo '#!/bin/sh'
    echo 'h=$1; shift'
    echo 'case $h in'
    for ((i = 0; i < n; i++)); do echo "  $HOSTS_NET.$((i + 1))) ns=$(hosts_ns $i) ;;"; done
    echo '  *) echo "hosts rsh: unknown host $h" >&2; exit 255 ;;'
    echo 'esac'
    echo 'exec ip netns exec "$ns" sh -c "$*"'
  } >"$HOSTS_TMP/rsh"
  chmod +x "$HOSTS_TMP/rsh"
}

hosts_mpirun() {
  local i hosts=
  for ((i = 0; i < HOSTS_N; i++)); do hosts+="${hosts:+,}$HOSTS_NET.$((i + 1))"; done
  ip netns exec "$(hosts_ns 0)" mpirun --allow-run-as-root --mca plm_rsh_agent "$HOSTS_TMP/rsh" \
    --mca plm_rsh_no_tree_spawn 1 --mca btl tcp,self --mca btl_tcp_if_include qtlink \
    --mca oob_tcp_if_include qtlink --host "$hosts" -np "$HOSTS_N" --bind-to none -x OMP_NUM_THREADS=1 \
    -x OMP_WAIT_POLICY=PASSIVE "$@"
}
