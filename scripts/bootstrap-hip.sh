#!/usr/bin/env bash
# Installs what `make build-hip` needs on top of scripts/bootstrap.sh: Debian's HIP toolchain
# (hipcc on clang 15, the HIP runtime and its headers, the ROCm device libraries). No AMD GPU is
# needed: the HIP build is compiled and linked only (docs/rocm.md). As root it runs apt-get;
# otherwise it prints the command.
set -euo pipefail
exec bash "$(dirname "$0")/bootstrap.sh" hipcc libamdhip64-dev rocm-device-libs
