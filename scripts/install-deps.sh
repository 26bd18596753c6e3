#!/usr/bin/env bash
# Installs every Debian package bt-launch builds, tests and benchmarks with.
# Idempotent: packages already present are not fetched again.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libcxxopts-dev nlohmann-json3-dev libspdlog-dev libfmt-dev libgtest-dev
  libssl-dev libxxhash-dev libibverbs-dev
  openmpi-bin libopenmpi-dev
  clang libclang-rt-14-dev
  tini hyperfine iproute2 procps faketime python3 python3-yaml gdb
  python3-torch
  rclone
  slurmctld slurmd slurm-client munge
  chromium  # the job's HTML report opened in a real browser (headless)
  prometheus-cpp-dev prometheus  # live metrics: the exposer, and a real server scraping the tests' nodes
)
# s3rver (the S3 API server of the checkpoint tests) comes from npm: Debian's npm unless
# the machine already has one.
command -v npm >/dev/null || packages+=(npm)

missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed' || missing+=("$package")
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo_cmd=()
[ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
