#!/usr/bin/env bash
# Installs dhisparse's build dependencies (Debian 12 packages) when missing, then
# configures and builds into build/ (or $DHS_BUILD_DIR). Extra args go to cmake.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${DHS_BUILD_DIR:-$root/build}"

pkgs=(cmake g++ make pkg-config python3 python3-pip
      libgtest-dev libgmock-dev libbenchmark-dev
      nlohmann-json3-dev libpcre2-dev libfmt-dev libcli11-dev libcpp-httplib-dev libspdlog-dev libutf8proc-dev
      libeigen3-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo_cmd apt-get update -q
  $sudo_cmd apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release "$@" > "$build.configure.log" 2>&1 || { cat "$build.configure.log"; exit 1; }
cmake --build "$build" -j"$(nproc)"
