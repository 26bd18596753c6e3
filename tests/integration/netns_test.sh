#!/usr/bin/env bash
# Three hosts, each in its own network namespace (and UTS namespace, for its own host
# name) on a bridge, run one bt-launch job: a clean run with its roster, a link cut in
# the middle of the run, a leader killed with SIGKILL, and, with restarts, node 2's
# launcher killed and replaced by one on a fourth host. Everything it creates is removed
# on exit; every wait has a deadline.
set -euo pipefail
BIN=$(realpath "$1")
[ "$(id -u)" -eq 0 ] || { echo "SKIPPED: network namespaces need root"; exit 77; }
command -v ip >/dev/null || { echo "SKIPPED: iproute2 is not installed"; exit 77; }

tag="bt$$"
bridge="${tag}br"
work=$(mktemp -d /tmp/bt-netns.XXXXXX)
pids=()

cleanup() {
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  for i in 0 1 2 3; do
    for pid in $(ip netns pids "${tag}n$i" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "${tag}n$i" 2>/dev/null || true
    rm -rf "/etc/netns/${tag}n$i"
  done
  ip link del "$bridge" 2>/dev/null || true
  rmdir /etc/netns 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

fail() { echo "FAIL: $*"; for f in "$work"/*.err; do echo "--- $f"; tail -n 20 "$f"; done; exit 1; }

if ! ip link add "$bridge" type bridge 2>/dev/null || ! ip netns add "${tag}probe" 2>/dev/null; then
  echo "SKIPPED: cannot create network namespaces here"; exit 77
fi
ip netns del "${tag}probe"
ip link set "$bridge" up
for i in 0 1 2 3; do  # host 3 stands by for a replaced node
  ns="${tag}n$i"
  ip netns add "$ns"
  ip link add "${tag}v$i" type veth peer name eth0 netns "$ns"
  ip link set "${tag}v$i" master "$bridge" up
  ip -n "$ns" link set lo up
  ip -n "$ns" link set eth0 up
  ip -n "$ns" addr add "10.77.0.1$i/24" dev eth0
  # `ip netns exec` bind-mounts this over /etc/hosts: each host gets its own name service.
  mkdir -p "/etc/netns/$ns"
  printf '127.0.0.1 localhost\n' > "/etc/netns/$ns/hosts"
done
leader=10.77.0.10

cat > "$work/job.json" <<JSON
{"compute": {"node_count": 3}, "enable_baseten_workdir": false,
 "runtime": {"start_commands": ["echo started; exec sleep \${TRAIN_SECONDS:-0}"]},
 "launcher": {"grace_period_s": 2,
              "rendezvous": {"join_timeout_s": 20, "heartbeat_interval_s": 0.5, "heartbeat_timeout_s": 3}}}
JSON

# start_on HOST RANK NAME SUBCOMMAND [ENV=VALUE...]: node RANK on host HOST (its namespace),
# in the background; its pid in `pid`, its output in NAME-RANK.out/.err. CONFIG picks the job.
start_on() {
  local host=$1 rank=$2 name=$3 subcommand=$4; shift 4
  ip netns exec "${tag}n$host" unshare --uts env BT_LEADER_ADDR="$leader" "$@" BT_NODE_RANK="$rank" BT_GROUP_SIZE=3 \
    BT_RENDEZVOUS_TOKEN=netns-token \
    sh -c "hostname host$host; exec $BIN $subcommand --config $work/${CONFIG:-job.json} --root $work/root-$host" \
    >"$work/$name-$rank.out" 2>"$work/$name-$rank.err" &
  pid=$!
}

# start_node RANK NAME SUBCOMMAND [ENV=VALUE...]: node RANK on its own host; pid in pids[RANK].
start_node() {
  local rank=$1
  start_on "$rank" "$@"
  pids[$rank]=$pid
}

# wait_exit PID SECONDS: sets `code` to the exit code, or 124 after the deadline (and
# kills the process). Not in a $(...) subshell: only this shell can wait for its children.
wait_exit() {
  local pid=$1 deadline=$((SECONDS + $2))
  while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
  code=0
  wait "$pid" || code=$?
  [ $SECONDS -lt $deadline ] || code=124
}

wait_output() {  # FILE TEXT SECONDS
  local deadline=$((SECONDS + $3))
  until grep -q "$2" "$1" 2>/dev/null; do
    [ $SECONDS -lt $deadline ] || fail "no \"$2\" in $1 after $3 s"
    sleep 0.1
  done
}

echo "== roster across three hosts"
for i in 0 1 2; do start_node "$i" roster "rendezvous --format json"; done
for i in 0 1 2; do
  wait_exit "${pids[$i]}" 30
  [ "$code" -eq 0 ] || fail "rendezvous on node $i exited $code"
done
python3 - "$work/roster-0.out" <<'PY'
import json, sys
roster = json.load(open(sys.argv[1]))
seen = {node["rank"]: (node["host"], node["seen_from"]) for node in roster["nodes"]}
expected = {r: (f"host{r}", f"10.77.0.1{r}") for r in range(3)}
assert seen == expected, f"roster {seen} != {expected}"
print("roster ok:", seen)
PY

echo "== the leader's DNS name resolves only after the followers started"
for i in 1 2; do start_node "$i" dns "rendezvous --format json" BT_LEADER_ADDR=bt-leader.test; done
for i in 1 2; do wait_output "$work/dns-$i.err" "cannot resolve bt-leader.test" 10; done
for i in 0 1 2; do echo "$leader bt-leader.test" >> "/etc/netns/${tag}n$i/hosts"; done
start_node 0 dns "rendezvous --format json" BT_LEADER_ADDR=bt-leader.test
for i in 0 1 2; do
  wait_exit "${pids[$i]}" 30
  [ "$code" -eq 0 ] || fail "with a late DNS name node $i exited $code"
done
grep -q '"seen_from": "10.77.0.11"' "$work/dns-0.out" || fail "the late-DNS roster lacks node 1"

echo "== a clean run"
for i in 0 1 2; do start_node "$i" run run; done
for i in 0 1 2; do
  wait_exit "${pids[$i]}" 30
  [ "$code" -eq 0 ] || fail "run on node $i exited $code"
done

echo "== link to node 2 cut in the middle of the run"
for i in 0 1 2; do start_node "$i" cut run TRAIN_SECONDS=60; done
for i in 0 1 2; do wait_output "$work/cut-$i.out" started 20; done
cut_at=$SECONDS
ip link set "${tag}v2" down
for i in 0 1 2; do
  wait_exit "${pids[$i]}" 30
  [ "$code" -eq 69 ] || fail "after the cut node $i exited $code, expected 69"
done
[ $((SECONDS - cut_at)) -le 15 ] || fail "the job took $((SECONDS - cut_at)) s to stop after the cut"
grep -q "node 2 (host2, 10.77.0.12) lost: no heartbeat" "$work/cut-0.err" || fail "leader did not name node 2"
grep -q "node 2 (host2, 10.77.0.12) lost" "$work/cut-1.err" || fail "node 1 did not name node 2"
grep -q "leader (node 0) lost" "$work/cut-2.err" || fail "node 2 did not notice it lost the leader"
ip link set "${tag}v2" up

echo "== leader killed with SIGKILL"
for i in 0 1 2; do start_node "$i" kill run TRAIN_SECONDS=60; done
for i in 0 1 2; do wait_output "$work/kill-$i.out" started 20; done
kill -9 "${pids[0]}"
for pid in $(ip netns pids "${tag}n0"); do kill -9 "$pid" 2>/dev/null || true; done
for i in 1 2; do
  wait_exit "${pids[$i]}" 20
  [ "$code" -eq 69 ] || fail "after the leader died node $i exited $code, expected 69"
  grep -q "leader (node 0) lost" "$work/kill-$i.err" || fail "node $i did not name the leader"
done

echo "== restarts: node 2's launcher killed, a new one with rank 2 joins from host 3, the old host is refused"
cat > "$work/restart.json" <<JSON
{"compute": {"node_count": 3}, "enable_baseten_workdir": false,
 "runtime": {"start_commands": ["echo cycle \$BT_RESTART_COUNT; [ \$BT_RESTART_COUNT = 0 ] && exec sleep 60; sleep 4"]},
 "launcher": {"grace_period_s": 2, "peer_failure_grace_s": 2, "restart": {"max_restarts": 1, "rejoin_timeout_s": 30},
              "rendezvous": {"join_timeout_s": 20, "heartbeat_interval_s": 0.5, "heartbeat_timeout_s": 3}}}
JSON
export CONFIG=restart.json
for i in 0 1 2; do start_node "$i" rejoin run; done
for i in 0 1 2; do wait_output "$work/rejoin-$i.out" "cycle 0" 20; done
kill -9 "${pids[2]}"
for pid in $(ip netns pids "${tag}n2"); do kill -9 "$pid" 2>/dev/null || true; done
wait "${pids[2]}" 2>/dev/null || true
wait_output "$work/rejoin-0.err" "this node's job is stopped; waiting for every node to be ready for cycle 1" 15
start_on 3 2 replaced run
replaced=$pid
for i in 0 1; do wait_output "$work/rejoin-$i.out" "cycle 1" 20; done
wait_output "$work/replaced-2.out" "cycle 1" 5
start_on 2 2 late run
wait_exit "$pid" 20
[ "$code" -eq 69 ] || fail "a launcher claiming the held rank 2 from the old host exited $code, expected 69"
grep -q "rank 2 is held by host3 (10.77.0.13) in cycle 1" "$work/late-2.err" || fail "the late launcher was not told why"
for pid in "${pids[0]}" "${pids[1]}" "$replaced"; do
  wait_exit "$pid" 30
  [ "$code" -eq 0 ] || fail "after the rejoin a node exited $code, expected 0"
done
grep -q "node 2 (host2, 10.77.0.12) lost: connection closed" "$work/rejoin-0.err" || fail "the leader did not name the lost node 2"
grep -q "node 2 (host3, 10.77.0.13) joined again from 10.77.0.13 (was 10.77.0.12)" "$work/rejoin-0.err" ||
  fail "the leader did not log node 2's return from host 3"
grep -q "refused a join from node 2 (host2, 10.77.0.12)" "$work/rejoin-0.err" || fail "the leader did not name the refused launcher"
! grep -q "cycle 0" "$work/replaced-2.out" || fail "the replacement ran cycle 0"
unset CONFIG
echo "PASS"
