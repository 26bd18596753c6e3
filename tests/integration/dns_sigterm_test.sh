#!/usr/bin/env bash
# SIGTERM while a follower resolves the leader's name on a DNS server that never answers:
# the launcher stops within a second, not after the resolver's timeout (a plain getaddrinfo
# blocks the launcher's only thread). Runs in private network and mount namespaces, with
# its own /etc/resolv.conf and a DNS server that reads queries and never replies.
# Root only (unshare); SKIPPED (77) otherwise.
set -euo pipefail

readonly BIN=${1:?usage: dns_sigterm_test.sh BT_LAUNCH_BINARY}
readonly STOP_BOUND_MS=1000      # "acted on within a second"
readonly RESOLVER_TIMEOUT_S=30   # what a plain getaddrinfo would wait
readonly TEST_BOUND_S=60

if [ "${2:-}" != "--inside" ]; then
  if [ "$(id -u)" != 0 ] || ! command -v unshare >/dev/null || ! command -v ip >/dev/null; then
    echo "SKIPPED: needs root, unshare and ip (private network and mount namespaces)"
    exit 77
  fi
  exec timeout "$TEST_BOUND_S" unshare --net --mount --propagation private "$0" "$BIN" --inside
fi

work=$(mktemp -d /tmp/bt-dns-XXXXXX)
server_pid=""
launcher_pid=""
cleanup() {
  [ -n "$launcher_pid" ] && kill -KILL "$launcher_pid" 2>/dev/null || true
  if [ -n "$server_pid" ]; then kill -KILL "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

ip link set lo up
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
for _ in $(seq 1 200); do
  [ -e "$work/queried.bound" ] && break
  sleep 0.05
done

BT_NODE_RANK=1 BT_GROUP_SIZE=2 BT_LEADER_ADDR=leader.never-answers.test BT_RENDEZVOUS_TOKEN=dns-test \
  "$BIN" run --root "$work/root" -- true > "$work/out" 2> "$work/err" &
launcher_pid=$!

for _ in $(seq 1 200); do
  [ -e "$work/queried" ] && break
  sleep 0.05
done
if [ ! -e "$work/queried" ]; then
  echo "FAIL: the launcher never asked the DNS server"; cat "$work/err"; exit 1
fi
sleep 0.3  # the lookup is under way, well inside the resolver's timeout
if grep -q "cannot resolve" "$work/err"; then
  echo "FAIL: a lookup ended before SIGTERM: the test would not stop one under way"; cat "$work/err"; exit 1
fi

started=$(date +%s%N)
kill -TERM "$launcher_pid"
code=0
wait "$launcher_pid" || code=$?
launcher_pid=""
elapsed_ms=$(( ($(date +%s%N) - started) / 1000000 ))

cat "$work/err"
if [ "$code" != 143 ]; then echo "FAIL: exit code $code, expected 143 (SIGTERM)"; exit 1; fi
if [ "$elapsed_ms" -gt "$STOP_BOUND_MS" ]; then echo "FAIL: stopped ${elapsed_ms} ms after SIGTERM (bound ${STOP_BOUND_MS} ms)"; exit 1; fi
echo "PASS: stopped ${elapsed_ms} ms after SIGTERM during the leader's name lookup"
