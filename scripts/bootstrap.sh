#!/usr/bin/env bash
# Installs the Debian packages mla.cpp builds with, if any are missing, plus any package named on
# the command line (scripts/bootstrap-fuzz.sh and bootstrap-hip.sh name theirs). As root it runs
# apt-get; otherwise it prints the command to run and fails.
set -euo pipefail
pkgs=(cmake ninja-build g++ make libgtest-dev libgmock-dev libbenchmark-dev nlohmann-json3-dev
      libcli11-dev libfmt-dev libonig-dev libutf8proc-dev pkg-config libcpp-httplib-dev curl procps ccache "$@")
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ]; then
  echo "bootstrap: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "bootstrap: missing Debian packages; run: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
