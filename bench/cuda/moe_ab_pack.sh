#!/usr/bin/env bash
# bench/cuda/moe_ab_pack.sh — a MoE kernel A/B for one GPU call: `mla` from BASE's MoE sources (the
# plan, the expert GEMMs and every source that holds a MoePlan: their layout may differ) linked
# against the configured build by bench/cuda/build_variant.sh, and the build's own `mla` and test
# binaries as the candidate, with the Debian libraries a GPU machine lacks, in one file.
#   bash bench/cuda/moe_ab_pack.sh OUT_DIR [BASE_REV]   (default BASE_REV: HEAD)
# Writes OUT_DIR/moe.tar.xz (keep OUT_DIR git-ignored; carry it, then on the GPU machine
# `bash bench/cuda/moe_ab_call.sh OUT_DIR/moe.tar.xz`).
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 1 ] || { sed -n 2,8p "$0"; exit 2; }
out=$1 base=${2:-HEAD}
BUILD=${BUILD:-build}
srcs=(src/platform/gpu/moe.cu src/platform/cuda/moe_gemm.cu src/platform/gpu/gpu_ops.cpp src/platform/cuda/cuda_ops.cpp
      bench/gpu/bench.cpp)
ninja -C "$BUILD" mla test_moe test_oracle > /dev/null
TARGET=mla BUILD=$BUILD bash bench/cuda/build_variant.sh moe_base "$base" - - "${srcs[@]}" > /dev/null
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
b=$stage/bin
mkdir -p "$b/base" "$b/cand" "$b/lib"
cp "$BUILD/variants/moe_base/mla" "$b/base/"
cp "$BUILD/bin/mla" "$BUILD/bin/test_moe" "$BUILD/bin/test_oracle" "$b/cand/"
bash scripts/bundle_libs.sh "$b/lib" "$BUILD/bin/mla" "$BUILD/bin/test_oracle" > /dev/null
find "$b" -type f -perm -u+x ! -name '*.so*' -exec strip {} +
mkdir -p "$out"
(cd "$stage" && tar -cf - bin | xz -T0 -3 > "$(realpath "$OLDPWD/$out")/moe.tar.xz")
echo "moe_ab_pack: $out/moe.tar.xz ($(du -h "$out/moe.tar.xz" | cut -f1)); base $base, candidate: the build"
