#!/usr/bin/env bash
# Checkpoints through rclone to a real S3 API server (s3rver, from npm) started and stopped
# here: upload with credentials from the auth secret while the environment carries an
# AWS_CA_BUNDLE that would break rclone 1.60, `checkpoints --verify`, a second job loading
# the checkpoint byte-identical, a file name rclone cannot carry, the server down for a while,
# and a malformed secret.
#   s3_checkpoint_test.sh BT_LAUNCH_BINARY NPM_PREFIX
set -euo pipefail
BIN=$(realpath "$1")
NPM_PREFIX=$2
command -v rclone >/dev/null || { echo "SKIPPED: rclone is not installed (apt-get install rclone)"; exit 77; }
if [ ! -x "$NPM_PREFIX/node_modules/.bin/s3rver" ]; then
  command -v npm >/dev/null || { echo "SKIPPED: npm is not installed, s3rver cannot be fetched"; exit 77; }
  mkdir -p "$NPM_PREFIX"
  timeout 180 npm install --prefix "$NPM_PREFIX" --no-audit --no-fund --silent s3rver@3 >/dev/null 2>&1 ||
    { echo "SKIPPED: npm install s3rver failed (no registry?)"; exit 77; }
fi
work=$(mktemp -d /tmp/bt-s3.XXXXXX)
server_pid=
stop_server() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  server_pid=
}
trap 'stop_server; rm -rf "$work"' EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
start_server() {
  "$NPM_PREFIX/node_modules/.bin/s3rver" -d "$work/s3" -a 127.0.0.1 -p "$port" --configure-bucket ckpt --silent &
  server_pid=$!
  for _ in $(seq 100); do
    (echo >/dev/tcp/127.0.0.1/"$port") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "FAIL: s3rver did not start"; exit 1
}
fail() { echo "FAIL: $*"; tail -n 40 "$work/out" 2>/dev/null; exit 1; }
mkdir -p "$work/s3" "$work/root/secrets"
start_server

# s3rver's fixed credentials, as the platform's weights auth shapes them.
echo '{"aws_access_key_id": "S3RVER", "aws_secret_access_key": "S3RVER", "aws_region": "us-east-1"}' > "$work/root/secrets/s3-ckpt"
job() {  # job NAME JOB_ID COMMAND [RUNTIME_EXTRA]
  cat > "$work/$1.json" <<JSON
{"runtime": {"start_commands": ["$3"], "checkpointing_config": {"enabled": true} ${4:-}},
 "launcher": {"job_id": "$2", "checkpoint": {"destination": "s3://ckpt/runs", "auth_secret_name": "s3-ckpt",
              "drain_timeout_s": 60, "scan_interval_s": 0.5}}}
JSON
}
export AWS_ENDPOINT_URL="http://127.0.0.1:$port" AWS_CA_BUNDLE=/nonexistent/ca.pem
save='d=$BT_CHECKPOINT_DIR/checkpoint-5; mkdir -p $d && head -c 3000000 /dev/urandom > $d/model.safetensors.bin && echo {} > $d/trainer_state.json'

echo "== upload through rclone, credentials from the secret, AWS_CA_BUNDLE inherited"
job first s3-job "$save"
timeout 120 "$BIN" run --config "$work/first.json" --root "$work/root" >"$work/out" 2>&1 || fail "first job exited $?"
grep -q "committed checkpoint-5: s3://ckpt/runs/s3-job/latest names it" "$work/out" || fail "no commit to s3"
grep -q S3RVER "$work/out" && fail "a credential reached the log"
timeout 60 "$BIN" checkpoints --config "$work/first.json" --root "$work/root" --verify --format json >"$work/list" 2>"$work/out" ||
  fail "checkpoints --verify exited $?"
python3 - "$work/list" <<'PY' || fail "listing: $(cat "$work/list")"
import json, sys
listing = json.load(open(sys.argv[1]))
assert listing["latest"] == "checkpoint-5", listing
assert [c["name"] for c in listing["checkpoints"]] == ["checkpoint-5"], listing
assert all(c["verified"] for c in listing["checkpoints"]), listing
PY

echo "== a second job loads it byte-identical"
job second s3-job-2 "cmp \$BT_LOAD_CHECKPOINT_DIR/rank-0/checkpoint-5/model.safetensors.bin $work/root/node-0/mnt/ckpts/checkpoint-5/model.safetensors.bin" \
  ', "load_checkpoint_config": {"enabled": true, "checkpoints": [{"typ": "baseten_latest_checkpoint", "job_id": "s3-job"}]}'
timeout 120 "$BIN" run --config "$work/second.json" --root "$work/root" >"$work/out" 2>&1 || fail "loading job exited $?"
grep -q "loaded checkpoint checkpoint-5 of job s3-job" "$work/out" || fail "nothing loaded"

echo "== a file name with a newline: rclone's file list cannot carry it, so the checkpoint is refused, not committed"
cat > "$work/newline.sh" <<'SH'
d=$BT_CHECKPOINT_DIR/checkpoint-7; mkdir -p "$d" && head -c 1000 /dev/urandom > "$d/model.safetensors.bin" &&
  printf x > "$d/$(printf 'a\nb')" && echo {} > "$d/trainer_state.json"
SH
job newline s3-job-nl "sh $work/newline.sh"
set +e
BT_SECRETS_DIR="$work/root/secrets" timeout 120 "$BIN" run --config "$work/newline.json" --root "$work/root-nl" >"$work/out" 2>&1
code=$?
set -e
[ "$code" = 74 ] || fail "a checkpoint with a newline in a file name: exit $code, not 74"
grep -q "checkpoint-7 is complete but is not uploaded to s3://ckpt/runs" "$work/out" || fail "the refusal is not logged"
grep -q "committed checkpoint-7" "$work/out" && fail "checkpoint-7 was committed without its file"

# doctor DESTINATION_VERDICT TEXT: `bt-launch doctor` on the first job's config.
doctor() {
  local code=0
  timeout 120 "$BIN" doctor --config "$work/first.json" --root "$work/root" --format json >"$work/doctor" 2>"$work/out" || code=$?
  python3 - "$work/doctor" "$1" "$2" <<'PY' || fail "doctor (exit $code): $(cat "$work/doctor")"
import json, sys
findings = {f["check"]: f for f in json.load(open(sys.argv[1]))["findings"]}
destination = findings["destination"]
assert destination["verdict"] == sys.argv[2] and sys.argv[3] in destination["detail"], destination
PY
  grep -q S3RVER "$work/doctor" "$work/out" && fail "doctor printed a credential"
  return 0
}
echo "== doctor reaches the destination with the job's credentials, and says when it cannot"
doctor ok "this job's latest: checkpoint-5"

echo "== the server down for a while: retried, then committed"
stop_server
doctor FAIL "s3://ckpt/runs"
job third s3-job-3 "$save && sleep 4"
BT_SECRETS_DIR="$work/root/secrets" timeout 120 "$BIN" run --config "$work/third.json" --root "$work/root3" >"$work/out" 2>&1 &
launcher=$!
sleep 15  # longer than rclone's own low-level retries: bt-launch's retry loop must report it
start_server
wait "$launcher" || fail "job with the server down exited $?"
# The launcher meets the outage first where it reads `latest` (it retries for about half a
# minute before deciding between resuming and starting from scratch), or, when the server
# comes back in between, at the upload.
grep -q -e "reading s3-job-3/latest from s3://ckpt/runs failed (attempt 1 of 8)" \
        -e "cannot upload checkpoint-5 to s3://ckpt/runs (attempt 1)" "$work/out" || fail "the outage was not reported"
grep -q "committed checkpoint-5" "$work/out" || fail "not committed after the server came back"

echo "== weights staged from s3:// through rclone, with allow_patterns"
mkdir -p "$work/model/weights"
echo '{}' > "$work/model/config.json"
head -c 2000000 /dev/urandom > "$work/model/weights/shard-1.safetensors"
echo skip > "$work/model/extra.bin"
env -i PATH="$PATH" HOME="$work" RCLONE_CONFIG_SEED_TYPE=s3 RCLONE_CONFIG_SEED_PROVIDER=Other \
  RCLONE_CONFIG_SEED_ACCESS_KEY_ID=S3RVER RCLONE_CONFIG_SEED_SECRET_ACCESS_KEY=S3RVER \
  RCLONE_CONFIG_SEED_ENDPOINT="$AWS_ENDPOINT_URL" timeout 60 rclone copy "$work/model" seed:ckpt/models/base 2>/dev/null ||
  fail "could not put the model into s3rver"
cat > "$work/weights.json" <<JSON
{"weights": [{"source": "s3://ckpt/models/base", "mount_location": "$work/mounts/base", "auth_secret_name": "s3-ckpt",
              "allow_patterns": ["*.json", "weights/"]}],
 "runtime": {"start_commands": ["cmp $work/mounts/base/weights/shard-1.safetensors $work/model/weights/shard-1.safetensors && test ! -e $work/mounts/base/extra.bin && test -f $work/mounts/base/.complete"]}}
JSON
timeout 120 "$BIN" run --config "$work/weights.json" --root "$work/root" >"$work/out" 2>&1 || fail "weights job exited $?"
grep -q "weights: staged s3://ckpt/models/base into $work/mounts/base (2 files" "$work/out" || fail "not staged"
grep -q S3RVER "$work/out" && fail "a credential reached the log"

echo "== a malformed secret: 65, its value never printed"
echo 'not-json-SECRETVALUE' > "$work/root/secrets/s3-ckpt"
set +e
timeout 60 "$BIN" run --config "$work/first.json" --root "$work/root" >"$work/out" 2>&1
code=$?
set -e
[ "$code" = 65 ] || fail "malformed secret exited $code"
grep -q 'secret "s3-ckpt": expected a JSON object' "$work/out" || fail "the secret is not named"
grep -q SECRETVALUE "$work/out" && fail "the secret's value was printed"
echo "PASS"
