#!/usr/bin/env bash
# Installs the npm packages the server's end-to-end tests run with (the official OpenAI JS client,
# pinned) into a cache folder outside the source tree, once. Prints the folder's node_modules path.
#   MLA_NPM_DIR  where to install (default: ~/.cache/mla-npm)
set -euo pipefail
OPENAI_VERSION=6.49.0
dir=${MLA_NPM_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/mla-npm}
mods="$dir/node_modules"
if [ ! -f "$mods/openai/package.json" ] ||
   ! grep -q "\"version\": \"$OPENAI_VERSION\"" "$mods/openai/package.json"; then
  mkdir -p "$dir"
  [ -f "$dir/package.json" ] || echo '{"name": "mla-test-deps", "private": true}' >"$dir/package.json"
  npm install --prefix "$dir" --no-audit --no-fund --loglevel=error "openai@$OPENAI_VERSION" >&2
fi
echo "$mods"
