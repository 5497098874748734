#!/usr/bin/env bash
# scripts/bundle_libs.sh — the Debian libraries our binaries link that a machine without mla.cpp's
# build packages lacks (fmt, Oniguruma, utf8proc, cpp-httplib; not glibc, libstdc++, OpenMP's
# runtime or CUDA's), copied into DIR, so binaries built here run elsewhere with
# LD_LIBRARY_PATH=DIR (e.g. on a GPU machine, with scripts/gpu_check.sh's BUILD).
#   bash scripts/bundle_libs.sh DIR BINARY...
set -euo pipefail
[ $# -ge 2 ] || { sed -n 2,6p "$0"; exit 2; }
dir=$1
shift
mkdir -p "$dir"
for bin in "$@"; do
  ldd "$bin" | awk '/=> \//{print $3}' | grep -E '/lib(fmt|onig|utf8proc|cpp-httplib)\.so' | while read -r lib; do
    cp -L "$lib" "$dir/"
  done
done
ls "$dir"
