#!/usr/bin/env bash
# Installs what `make fuzz` needs on top of scripts/bootstrap.sh: clang and its runtime libraries
# (libFuzzer, AddressSanitizer, UBSan). As root it runs apt-get; otherwise it prints the command.
set -euo pipefail
bash "$(dirname "$0")/bootstrap.sh"
pkgs=(clang libclang-rt-14-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ]; then
  echo "bootstrap-fuzz: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "bootstrap-fuzz: missing Debian packages; run: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
