#!/usr/bin/env bash
# The server end to end (tests/server_e2e.mjs) with the official OpenAI JS client, fetched pinned
# by scripts/fetch_npm_test_deps.sh into a cache outside the source tree.
#   tests/server_e2e.sh ids|text    (env: MLA, MLA_ECHO_SERVER, MLA_MODEL, MLA_TEST_TOKENIZER for text)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
export MLA=${MLA:-$root/build/bin/mla}
export MLA_MODEL=${MLA_MODEL:-$root/tests/data/v3_tiny}
# The server over a scripted engine, for the tool-call cases (built beside mla).
export MLA_ECHO_SERVER=${MLA_ECHO_SERVER:-$(dirname "$MLA")/echo_server}
# The tiny model runs best on one thread per process (the tests run several processes at once).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
command -v node >/dev/null || { echo "server_e2e: node is not installed" >&2; exit 1; }
MLA_NPM_MODULES=$(bash "$root/scripts/fetch_npm_test_deps.sh")
# Token-id mode serves a model folder without a tokenizer (the demo model has one): the same files,
# linked into a temp folder, but for tokenizer*.json.
if [ "${1:-ids}" = ids ]; then
  bare=$(mktemp -d)
  trap 'rm -rf "$bare"' EXIT
  for f in "$MLA_MODEL"/*; do
    case $(basename "$f") in tokenizer*.json) ;; *) ln -s "$(cd "$(dirname "$f")" && pwd)/$(basename "$f")" "$bare/" ;; esac
  done
  export MLA_MODEL=$bare
fi
export MLA_NPM_MODULES
node "$root/tests/server_e2e.mjs" "${1:-ids}"
