#!/usr/bin/env bash
# bench/cuda/build_variant.sh — one more mla_decode_test binary from a variant of the tree, for an
# A/B of kernels in one GPU run: the named sources are compiled from the variant (the tree at REV,
# or the working tree, plus an optional patch and extra nvcc flags) with the build's own commands,
# and linked in front of the build's library, whose other objects are kept. Needs a configured
# build (cmake -B build ..., with mla_decode_test built once).
#   bash bench/cuda/build_variant.sh NAME REV|wt PATCH|- FLAGS|- SOURCE... 
#   e.g. bash bench/cuda/build_variant.sh loads_ahead bd70586 - - src/platform/cuda/mla_decode_seesaw.cu
#        bash bench/cuda/build_variant.sh trace wt - -DMLA_SEESAW_TRACE src/platform/cuda/mla_decode_seesaw.cu \
#          src/platform/cuda/mla_decode_combine.cu bench/cuda/mla_decode_test.cu
# Writes BUILD/variants/NAME/mla_decode_test (BUILD: $BUILD, default build); TARGET=mla (any
# executable target of the build) links that one instead, as BUILD/variants/NAME/TARGET. Only sources
# whose changes stay inside them (and headers only they include) give a faithful variant.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD BUILD=${BUILD:-build} TARGET=${TARGET:-mla_decode_test}
[ $# -ge 5 ] || { sed -n 2,14p "$0"; exit 2; }
NAME=$1 REV=$2 PATCH=$3 FLAGS=$4
shift 4
V=$ROOT/$BUILD/variants/$NAME
rm -rf "$V" && mkdir -p "$V/obj"
if [ "$REV" = wt ]; then cp -r src bench include "$V/"; else git archive "$REV" src bench include | tar -x -C "$V"; fi
[ "$PATCH" = - ] || (cd "$V" && patch -s -p1 < "$ROOT/$PATCH")
[ "$FLAGS" = - ] && FLAGS=""
commands=$(ninja -C "$BUILD" -t commands "$TARGET")
objs=()
for f in "$@"; do
  cmd=$(grep -E -- "-c $ROOT/$f( |\$)" <<< "$commands" | head -n 1 || true)  # nvcc: -c SRC -o; c++: -o OBJ -c SRC
  [ -n "$cmd" ] || { echo "build_variant: $f is not a source of $TARGET" >&2; exit 1; }
  out=$(sed -E 's/.* -o ([^ ]+).*/\1/' <<< "$cmd")
  obj=$V/obj/$(basename "$f").o
  cmd=${cmd//$ROOT\/src/$V/src}
  cmd=${cmd//$ROOT\/bench/$V/bench}
  cmd=${cmd//$ROOT\/include/$V/include}
  cmd=${cmd//-o $out/-o $obj}
  cmd=${cmd//-MF $out.d/-MF $obj.d}
  cmd=${cmd/ -c / $FLAGS -c }
  (cd "$BUILD" && eval "$cmd")
  objs+=("$obj")
done
link=$(tail -n 1 <<< "$commands")
# A recompiled test source replaces the build's object; the library's replaced objects are never
# pulled from the archive (their symbols are defined first).
for f in "$@"; do
  link=${link//CMakeFiles\/$TARGET.dir\/$f.o/}
done
link=${link//-o bin\/$TARGET/${objs[*]} -o $V\/$TARGET}
(cd "$BUILD" && eval "$link")
echo "build_variant: $V/$TARGET"
