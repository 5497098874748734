// tools/cli_options.h — option groups declared once and added to every command that takes them:
// the platform (with the ROCm settings), the dtypes, and the dispatch settings.
#pragma once
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "cli_util.h"
#include "mla/dispatch.h"
#include "mla/dtype.h"
#include "mla/error.h"
#include "mla/platform_ops.h"

namespace mla::cli {

// The ROCm platform's settings as options (--rocm-arch, --rocm-fp8, --rocm-absorb); bad values and
// conflicts are usage errors naming them.
struct RocmFlags {
  std::string arch = "gfx942", fp8, absorb = "act";
  void add(CLI::App* sub) {
    sub->add_option("--rocm-arch", arch, "ROCm target: gfx90a | gfx940 | gfx942 | gfx950")->capture_default_str();
    sub->add_option("--rocm-fp8", fp8, "ROCm fp8 flavour: e4m3fn | e4m3fnuz (default: the arch's own)");
    sub->add_option("--rocm-absorb", absorb, "ROCm absorbed weights: act | fp8 | fp8-dequant | mxfp4")
        ->capture_default_str();
  }
  RocmSettings parse() const {
    try {
      RocmSettings s;
      s.arch = parse_rocm_arch(arch);
      if (fp8 == "e4m3fn") s.fp8 = Fp8Flavor::E4M3FN;
      else if (fp8 == "e4m3fnuz") s.fp8 = Fp8Flavor::E4M3FNUZ;
      else if (!fp8.empty()) fail("unknown fp8 flavour '{}' (known: e4m3fn, e4m3fnuz)", fp8);
      s.absorb = parse_absorb_format(absorb);
      s.validate();
      return s;
    } catch (const Error& e) {
      throw UsageError(e.what());
    }
  }
};

// --platform and the platform settings.
struct PlatformFlags {
  std::string platform = "cpu";
  RocmFlags rocm;
  void add(CLI::App* sub) {
    sub->add_option("--platform", platform, "cpu|cuda|rocm")->capture_default_str();
    rocm.add(sub);
  }
  Platform parse() const {
    try {
      return parse_platform(platform);
    } catch (const Error& e) {
      throw UsageError(e.what());
    }
  }
  PlatformOptions options() const { return {rocm.parse()}; }
};

// --dtype (activations and weights) and --kv-dtype (the latent KV pool).
struct DtypeFlags {
  std::string dtype, kv_dtype;
  DtypeFlags(std::string act, std::string kv) : dtype(std::move(act)), kv_dtype(std::move(kv)) {}
  void add(CLI::App* sub) {
    sub->add_option("--dtype", dtype, "activations and weights: f64 (reference ops) | f32 | bf16")->capture_default_str();
    sub->add_option("--kv-dtype", kv_dtype, "latent KV pool: f32 | bf16 | fp8_e4m3fn")->capture_default_str();
  }
  DType act() const { return parse(dtype); }
  DType kv() const { return parse(kv_dtype); }

 private:
  static DType parse(const std::string& s) {
    try {
      return parse_dtype(s);
    } catch (const Error& e) {
      throw UsageError(e.what());
    }
  }
};

// The dispatch settings: --backend, --chunked-prefix-threshold, --chunk-capacity,
// --disable-chunked-prefix-cache, --deterministic, --fused-decode-rope.
struct DispatchFlags {
  std::string backend;
  int64_t threshold = 8192, capacity = 131072;
  bool no_chunked = false, deterministic = false, fused_rope = false;
  void add(CLI::App* sub) {
    sub->add_option("--backend", backend, "attention backend rules (default: the platform's)");
    sub->add_option("--chunked-prefix-threshold", threshold, "Σ prefix at which the chunked-prefix rules start")
        ->capture_default_str();
    sub->add_option("--chunk-capacity", capacity, "MHA_CHUNKED_KV chunk capacity (tokens)")->capture_default_str();
    sub->add_flag("--disable-chunked-prefix-cache", no_chunked, "turn the chunked-prefix cache off");
    sub->add_flag("--deterministic", deterministic, "deterministic inference mode");
    sub->add_flag("--fused-decode-rope", fused_rope, "ROCm: aiter decode runs MLA_FUSED_ROPE_ROCM");
  }
  DispatchSettings parse() const {
    if (threshold <= 0) throw UsageError("--chunked-prefix-threshold must be positive");
    if (capacity <= 0) throw UsageError("--chunk-capacity must be positive");
    DispatchSettings s;
    try {
      if (!backend.empty()) check_backend(backend);
    } catch (const Error& e) {
      throw UsageError(e.what());
    }
    s.backend = backend;
    s.chunked_prefix_threshold = threshold;
    s.chunk_capacity = capacity;
    if (no_chunked) s.chunked_prefix_cache = false;
    s.deterministic = deterministic;
    s.fused_decode_rope = fused_rope;
    return s;
  }
};

}  // namespace mla::cli
