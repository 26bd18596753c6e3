#!/usr/bin/env bash
# A checkpoint saved again under its name at an S3 destination (moto_server, through
# rclone): the second version goes to a location of its own and becomes current by its
# commit record; not one object of the committed version is written again. rclone used to
# copy the new files straight over the committed ones, so a node lost mid-upload left
# `latest` naming files that no longer matched their manifest.
#   s3_resave_test.sh BT_LAUNCH_BINARY
set -euo pipefail
BIN=$(realpath "$1")
command -v rclone >/dev/null || { echo "SKIPPED: rclone is not installed"; exit 77; }
command -v moto_server >/dev/null || { echo "SKIPPED: moto_server is not installed (pip install 'moto[server]')"; exit 77; }
work=$(mktemp -d /tmp/bt-s3-resave.XXXXXX)
server_pid=
trap '[ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; tail -n 30 "$work/out" 2>/dev/null; exit 1; }
port=$((20000 + RANDOM % 12000))  # below the ephemeral range
moto_server -H 127.0.0.1 -p "$port" >"$work/moto.log" 2>&1 &
server_pid=$!
# rclone 1.60 fails every S3 call with an inherited AWS_CA_BUNDLE: never pass one on.
unset AWS_CA_BUNDLE
export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_REGION=us-east-1 AWS_ENDPOINT_URL="http://127.0.0.1:$port"
r() { env -i PATH="$PATH" HOME="$work" RCLONE_CONFIG_H_TYPE=s3 RCLONE_CONFIG_H_PROVIDER=Other RCLONE_CONFIG_H_ACCESS_KEY_ID=testing \
      RCLONE_CONFIG_H_SECRET_ACCESS_KEY=testing RCLONE_CONFIG_H_ENDPOINT="$AWS_ENDPOINT_URL" timeout 60 rclone "$@" 2>/dev/null; }
for _ in $(seq 100); do r mkdir h:ckpt && break; sleep 0.2; done
r lsd h: | grep -q ckpt || fail "moto_server did not start"

save() {  # save BYTES: checkpoint-1 in the Trainer's order, the marker last
  cat > "$work/job.json" <<JSON
{"runtime": {"start_commands": ["d=\$BT_CHECKPOINT_DIR/checkpoint-1; mkdir -p \$d && head -c $1 /dev/urandom > \$d/model.safetensors.bin && echo {} > \$d/trainer_state.json"],
             "checkpointing_config": {"enabled": true}},
 "launcher": {"job_id": "resave", "checkpoint": {"destination": "s3://ckpt/runs", "drain_timeout_s": 60, "scan_interval_s": 0.5}}}
JSON
  timeout 120 "$BIN" run --config "$work/job.json" --root "$work/root" >"$work/out" 2>&1 || fail "the job saving $1 bytes exited $?"
}
objects() { r lsjson -R --hash h:ckpt/runs/resave/rank-0 | python3 -c '
import json, sys
for o in json.load(sys.stdin):
    if not o["IsDir"]:
        print(o["Path"], o["Size"], o.get("Hashes", {}).get("md5", ""), o["ModTime"])' | sort; }

echo "== the first save, committed"
save 3000000
grep -q "committed checkpoint-1: s3://ckpt/runs/resave/latest names it" "$work/out" || fail "not committed"
objects >"$work/first"
[ -s "$work/first" ] || fail "nothing uploaded"

echo "== saved again under the same name, on the same volume"
save 2000000
grep -q "committed checkpoint-1: s3://ckpt/runs/resave/latest names it" "$work/out" || fail "the second save was not committed"
objects >"$work/second"
missing=$(comm -23 "$work/first" "$work/second")
[ -z "$missing" ] || fail "objects of the committed version were written again: $missing"
[ "$(wc -l <"$work/second")" -gt "$(wc -l <"$work/first")" ] || fail "the second save went nowhere new"
timeout 60 "$BIN" checkpoints --config "$work/job.json" --root "$work/root" --verify --format json >"$work/list" 2>"$work/out" ||
  fail "checkpoints --verify exited $?"
python3 - "$work/list" <<'PY' || fail "listing: $(cat "$work/list")"
import json, sys
listing = json.load(open(sys.argv[1]))
assert listing["latest"] == "checkpoint-1", listing
rows = listing["checkpoints"]
assert len(rows) == 1 and rows[0]["verified"], rows
assert 2000000 < rows[0]["bytes"] < 3000000, "the current version is not the second save: %s" % rows
PY
echo PASS
