#!/usr/bin/env bash
# SIGTERM while a follower is still reaching the leader stops it within a second, in the
# two waits that used to ignore it; a signal that asks for no stop (SIGCHLD: a child the
# launcher ran before, such as rclone reading `latest`; HUP, USR1, USR2) stops neither:
#   1. the leader's name is looked up on a DNS server that never answers (a plain
#      getaddrinfo blocks the launcher's only thread for the resolver's timeout);
#   2. the leader's address drops SYNs (a connect attempt rides the kernel's SYN
#      retransmissions for up to 5 s).
# Runs in private network and mount namespaces: its own /etc/resolv.conf and a DNS server
# that reads queries and never replies; a veth with a static neighbour that nobody answers
# for. Root only (unshare); SKIPPED (77) otherwise.
set -euo pipefail

readonly BIN=${1:?usage: sigterm_reaching_leader_test.sh BT_LAUNCH_BINARY}
readonly STOP_BOUND_MS=1000      # "acted on within a second"
readonly RESOLVER_TIMEOUT_S=30   # what a plain getaddrinfo would wait
readonly TEST_BOUND_S=60
readonly SILENT_LEADER=10.99.0.2

if [ "${2:-}" != "--inside" ]; then
  if [ "$(id -u)" != 0 ] || ! command -v unshare >/dev/null || ! command -v ip >/dev/null; then
    echo "SKIPPED: needs root, unshare and ip (private network and mount namespaces)"
    exit 77
  fi
  exec timeout "$TEST_BOUND_S" unshare --net --mount --propagation private "$0" "$BIN" --inside
fi

work=$(mktemp -d /tmp/bt-reach-XXXXXX)
server_pid=""
launcher_pid=""
cleanup() {
  [ -n "$launcher_pid" ] && kill -KILL "$launcher_pid" 2>/dev/null || true
  if [ -n "$server_pid" ]; then kill -KILL "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

fail() { echo "FAIL: $*"; cat "$work/err" 2>/dev/null; exit 1; }

# wait_for DESCRIPTION COMMAND...: until COMMAND succeeds, for at most 10 s.
wait_for() {
  local description=$1; shift
  for _ in $(seq 1 200); do
    "$@" && return 0
    sleep 0.05
  done
  fail "$description"
}

start_follower() {  # start_follower LEADER_ADDRESS
  BT_NODE_RANK=1 BT_GROUP_SIZE=2 BT_LEADER_ADDR="$1" BT_RENDEZVOUS_TOKEN=reach-test \
    "$BIN" run --root "$work/root" -- true > "$work/out" 2> "$work/err" &
  launcher_pid=$!
}

# not_stopped_by_other_signals CASE: SIGCHLD, HUP, USR1 and USR2 leave the wait under way.
not_stopped_by_other_signals() {
  local signal_name
  for signal_name in CHLD HUP USR1 USR2; do kill -"$signal_name" "$launcher_pid"; done
  sleep 0.5
  kill -0 "$launcher_pid" 2>/dev/null || { wait "$launcher_pid" || true; launcher_pid=""; fail "$1: ended by a signal that asks for no stop"; }
  ! grep -q "interrupted" "$work/err" || fail "$1: interrupted by a signal that asks for no stop"
  echo "$1: SIGCHLD, SIGHUP, SIGUSR1 and SIGUSR2 did not stop it"
}

# stop_within_bound CASE: SIGTERM to the follower, which must exit 143 within the bound.
stop_within_bound() {
  local started elapsed_ms code=0
  started=$(date +%s%N)
  kill -TERM "$launcher_pid"
  wait "$launcher_pid" || code=$?
  launcher_pid=""
  elapsed_ms=$(( ($(date +%s%N) - started) / 1000000 ))
  [ "$code" = 143 ] || fail "$1: exit code $code, expected 143 (SIGTERM)"
  [ "$elapsed_ms" -le "$STOP_BOUND_MS" ] || fail "$1: stopped ${elapsed_ms} ms after SIGTERM (bound ${STOP_BOUND_MS} ms)"
  echo "$1: stopped ${elapsed_ms} ms after SIGTERM"
}

ip link set lo up

# --- 1. a name lookup under way ------------------------------------------------------
printf 'nameserver 127.0.0.1\noptions timeout:%d attempts:1\n' "$RESOLVER_TIMEOUT_S" > "$work/resolv.conf"
mount --bind "$work/resolv.conf" /etc/resolv.conf
python3 - "$work/queried" <<'PY' &
import socket, sys
server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
server.bind(("127.0.0.1", 53))
open(sys.argv[1] + ".bound", "w").close()
server.recvfrom(512)
open(sys.argv[1], "w").close()
while True:
    server.recvfrom(512)  # never answered
PY
server_pid=$!
wait_for "the DNS server never bound its port" test -e "$work/queried.bound"
start_follower leader.never-answers.test
wait_for "the launcher never asked the DNS server" test -e "$work/queried"
sleep 0.3  # the lookup is under way, well inside the resolver's timeout
! grep -q "cannot resolve" "$work/err" || fail "a lookup ended before SIGTERM: the test would not stop one under way"
not_stopped_by_other_signals "the leader's name lookup"
stop_within_bound "the leader's name lookup"

# --- 2. a connect attempt whose SYNs are dropped -------------------------------------
# The static neighbour sends the SYN out of v0 to a MAC nobody has: no answer, no ICMP.
ip link add v0 type veth peer name v1
ip link set v0 up
ip link set v1 up
ip addr add 10.99.0.1/24 dev v0
ip neigh add "$SILENT_LEADER" lladdr 02:00:00:00:00:02 dev v0
start_follower "$SILENT_LEADER"
syn_sent() {  # the follower's socket to the leader in SYN_SENT (state 02 in /proc/net/tcp)
  awk '$3 == "0200630A:7274" && $4 == "02" { found = 1 } END { exit !found }' "/proc/$launcher_pid/net/tcp" 2>/dev/null
}
wait_for "the follower never sent a SYN to $SILENT_LEADER:29300" syn_sent
sleep 0.5  # well inside the attempt's 5 s
not_stopped_by_other_signals "a connect to a leader that drops SYNs"
stop_within_bound "a connect to a leader that drops SYNs"
echo "PASS"
