#!/usr/bin/env bash
# Installs what `make fuzz` needs on top of scripts/bootstrap.sh: clang and its runtime libraries
# (libFuzzer, AddressSanitizer, UBSan). As root it runs apt-get; otherwise it prints the command.
set -euo pipefail
exec bash "$(dirname "$0")/bootstrap.sh" clang libclang-rt-14-dev
