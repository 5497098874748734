#!/usr/bin/env bash
# bench/cuda/ab_pack.sh — everything one GPU call needs for a kernel A/B of the decode kernels,
# built here and packed into one file to carry (bench/cuda/ab_call.sh runs it there):
#   bin/base/ and bin/cand/: mla_decode_test, its -DMLA_SEESAW_TRACE twin (trace/) and `mla`
#     (whole-model rows), from BASE (a commit) and the candidate (the working tree, or CAND=REV);
#   bin/cand/: test_step_plan and test_oracle of the configured build (the candidate must be what
#     BUILD holds: run `ninja -C BUILD` first), and mha_prefill_test;
#   bin/lib/: the Debian libraries a GPU machine without our build packages lacks.
# Extra variants: VARIANTS="name:REV|wt:PATCH|- ..." (mla_decode_test only), or "name:bits=N": the
# candidate run under MlaDecodeTuning variant bits N (e.g. persist:bits=128, the persistent grid forced).
#   bash bench/cuda/ab_pack.sh OUT_DIR BASE_REV [SOURCE...]
# SOURCE...: the sources that differ (default: the see-saw, combine and narrow/wide decode kernels).
# Writes OUT_DIR/ab.tar.xz (keep OUT_DIR git-ignored; carry it, then `bash bench/cuda/ab_call.sh
# OUT_DIR/ab.tar.xz` there).
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 2 ] || { sed -n 2,14p "$0"; exit 2; }
out=$1 base=$2
shift 2
BUILD=${BUILD:-build}
srcs=("$@")
[ ${#srcs[@]} -gt 0 ] || srcs=(src/platform/cuda/mla_decode_seesaw.cu src/platform/cuda/mla_decode_combine.cu
                             src/platform/cuda/mla_decode_narrow.cu src/platform/cuda/mla_decode_wide.cu)
cand=${CAND:-wt}
T=bench/cuda/mla_decode_test.cu
V=$BUILD/variants
ninja -C "$BUILD" mla_decode_test mha_prefill_test mla test_step_plan test_oracle > /dev/null
bv() { BUILD=$BUILD bash bench/cuda/build_variant.sh "$@" > /dev/null; }
bv ab_base "$base" - - "${srcs[@]}"
bv ab_base_trace "$base" - -DMLA_SEESAW_TRACE "${srcs[@]}" "$T"
TARGET=mla bv ab_base_mla "$base" - - "${srcs[@]}"
bv ab_cand "$cand" - - "${srcs[@]}"
bv ab_cand_trace "$cand" - -DMLA_SEESAW_TRACE "${srcs[@]}" "$T"
TARGET=mla bv ab_cand_mla "$cand" - - "${srcs[@]}"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
b=$stage/bin
mkdir -p "$b/base/trace" "$b/cand/trace" "$b/lib"
cp "$V/ab_base/mla_decode_test" "$V/ab_base_mla/mla" "$b/base/"
cp "$V/ab_base_trace/mla_decode_test" "$b/base/trace/"
cp "$V/ab_cand/mla_decode_test" "$V/ab_cand_mla/mla" "$b/cand/"
cp "$V/ab_cand_trace/mla_decode_test" "$b/cand/trace/"
cp "$BUILD/bin/test_step_plan" "$BUILD/bin/test_oracle" "$b/cand/"
cp "$BUILD/bin/mha_prefill_test" "$b/"
for spec in ${VARIANTS:-}; do
  IFS=: read -r name rev patch <<< "$spec"
  mkdir -p "$b/$name"
  if [[ $rev == bits=* ]]; then  # the candidate under MlaDecodeTuning variant bits (MLA_TEST_VARIANT)
    printf '#!/usr/bin/env bash\nMLA_TEST_VARIANT=%s exec "$(dirname "$0")/../cand/mla_decode_test" "$@"\n' \
      "${rev#bits=}" > "$b/$name/mla_decode_test"
    chmod +x "$b/$name/mla_decode_test"
    continue
  fi
  bv "ab_$name" "$rev" "${patch:--}" - "${srcs[@]}"
  cp "$V/ab_$name/mla_decode_test" "$b/$name/"
done
bash scripts/bundle_libs.sh "$b/lib" "$BUILD/bin/mla" "$BUILD/bin/test_oracle" > /dev/null
find "$b" -type f -perm -u+x ! -name '*.so*' -exec sh -c 'head -c 2 "$1" | grep -q "#!" || strip "$1"' _ {} \;
mkdir -p "$out"
(cd "$stage" && tar -cf - bin | xz -T0 -3 > "$(realpath "$OLDPWD/$out")/ab.tar.xz")
echo "ab_pack: $out/ab.tar.xz ($(du -h "$out/ab.tar.xz" | cut -f1)); base $base, candidate $cand; variants: base cand ${VARIANTS:-}"
