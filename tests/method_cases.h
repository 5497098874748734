// tests/method_cases.h — the reference harness's cases (config × batch × dtypes × page size),
// shared by the CPU and GPU method tests.
#pragma once
#include <fmt/format.h>

#include <string_view>
#include <vector>

#include "mla/config.h"
#include "mla/reference_harness.h"

namespace mla::test {

// The configs between them cover: YaRN on (tiny, mid, the presets) and off (odd); interleaved pairs
// (tiny, mid, presets) and NeoX halves (odd, yarn_neox); mscale != mscale_all_dim (tiny: cos/sin
// scaled by their ratio, softmax by mscale_all_dim²) and mscale == mscale_all_dim (mid, presets); a
// latent norm eps far from 1e-6 (tiny, yarn_neox), so an engine that ignores it shows.
inline AttentionConfig tiny_config() {  // odd small dims, nope != v, YaRN with mscale != mscale_all_dim
  AttentionConfig c = preset_config("deepseek-v3");
  c.hidden_size = 64, c.num_attention_heads = 3, c.q_lora_rank = 24, c.kv_lora_rank = 32;
  c.qk_nope_head_dim = 16, c.qk_rope_head_dim = 8, c.v_head_dim = 12;
  c.rope_scaling.mscale = 0.9, c.rope_scaling.mscale_all_dim = 0.6;
  c.latent_norm_eps = 0.05;
  return c;
}
inline AttentionConfig odd_config() {  // no q_lora, one head, NeoX RoPE, plain RoPE scaling
  AttentionConfig c = preset_config("deepseek-v2-lite");
  c.hidden_size = 72, c.num_attention_heads = 1, c.q_lora_rank = 0, c.kv_lora_rank = 40;
  c.qk_nope_head_dim = 24, c.qk_rope_head_dim = 16, c.v_head_dim = 20;
  c.rope_interleave = false;
  c.rope_scaling = RopeScaling{};
  return c;
}
inline AttentionConfig yarn_neox_config() {  // NeoX halves with YaRN (short original context), eps 1e-2
  AttentionConfig c = odd_config();
  c.num_attention_heads = 2, c.q_lora_rank = 16;
  c.rope_theta = 5000;
  c.rope_scaling = RopeScaling{"yarn", 16.0, 32, 24.0, 2.0, 1.2, 0.8};
  c.latent_norm_eps = 1e-2;
  return c;
}
inline AttentionConfig mid_config() {  // 16 heads, V3-shaped head dims at a small hidden size
  AttentionConfig c = preset_config("deepseek-v3");
  c.hidden_size = 256, c.num_attention_heads = 16, c.q_lora_rank = 96;
  return c;
}

struct Shape_ {
  const char* name;
  ForwardMode mode;
  std::vector<std::pair<int64_t, int64_t>> reqs;
  int64_t chunk_capacity;
};
inline const std::vector<Shape_>& batches() {
  static const std::vector<Shape_> b = {
      {"extend_fresh", ForwardMode::EXTEND, {{0, 7}, {0, 13}, {0, 1}}, 131072},
      {"extend_mixed", ForwardMode::EXTEND, {{0, 5}, {17, 3}, {0, 0}, {29, 11}}, 131072},
      {"extend_chunks", ForwardMode::EXTEND, {{61, 4}, {5, 2}, {0, 3}}, 16},  // 8 per request
      {"decode", ForwardMode::DECODE, {{23, 1}, {7, 1}, {41, 1}, {0, 1}}, 131072},
      {"target_verify", ForwardMode::TARGET_VERIFY, {{19, 4}, {37, 4}}, 131072},
      {"draft_extend", ForwardMode::DRAFT_EXTEND, {{11, 2}, {3, 2}}, 131072},
  };
  return b;
}

// The harness's cases on platform `p`: the CPU adds its f64 reference-ops flavour.
inline std::vector<LayerCase> all_cases(Platform p) {
  std::vector<LayerCase> cases;
  std::vector<std::pair<DType, DType>> dtypes = {
      {DType::F32, DType::F32},  {DType::F32, DType::BF16}, {DType::BF16, DType::BF16},
      {DType::F32, DType::F8_E4M3FN}, {DType::BF16, DType::F8_E4M3FN}};
  if (p == Platform::CPU) dtypes.insert(dtypes.begin(), {DType::F64, DType::F32});
  const int64_t pages[] = {1, 16, 64};
  int k = 0;
  for (auto [cname, cfg] : {std::pair{"tiny", tiny_config()}, std::pair{"odd", odd_config()},
                             std::pair{"yarnneox", yarn_neox_config()}})
    for (const Shape_& b : batches())
      for (auto [act, kv] : dtypes) {
        if (std::string_view(cname) == "yarnneox" && act != DType::F32) continue;  // its point is the RoPE
        LayerCase c;
        c.platform = p;
        c.cfg = cfg, c.act = act, c.kv = kv, c.page_size = pages[k++ % 3], c.mode = b.mode;
        c.requests = b.reqs, c.settings.chunk_capacity = b.chunk_capacity;
        c.kv_scale = is_fp8(kv) ? 0.05 : 1.0;  // exercise the per-layer scale
        c.seed = uint64_t(7 + k);
        c.name = fmt::format("{}_{}_{}_kv{}_page{}", cname, b.name, dtype_name(act), dtype_name(kv), c.page_size);
        cases.push_back(c);
      }
  // Real head counts: 16 (V3 head dims at a small hidden size, V2-Lite) and 128 (V3).
  struct Big { const char* name; AttentionConfig cfg; std::vector<std::pair<int64_t, int64_t>> reqs; ForwardMode mode; int64_t chunk; };
  const std::vector<Big> bigs = {
      {"mid16_mixed", mid_config(), {{0, 9}, {45, 6}, {13, 0}, {131, 2}}, ForwardMode::EXTEND, 64},
      {"mid16_verify", mid_config(), {{53, 3}, {2, 3}}, ForwardMode::TARGET_VERIFY, 131072},
      {"v2lite_mixed", preset_config("deepseek-v2-lite"), {{0, 5}, {23, 3}}, ForwardMode::EXTEND, 16},
      {"v2lite_decode", preset_config("deepseek-v2-lite"), {{31, 1}, {2, 1}, {0, 1}}, ForwardMode::DECODE, 131072},
      {"v3_mixed", preset_config("deepseek-v3"), {{0, 3}, {19, 2}}, ForwardMode::EXTEND, 16},
      {"v3_decode", preset_config("deepseek-v3"), {{29, 1}, {3, 1}}, ForwardMode::DECODE, 131072},
  };
  for (const Big& b : bigs)
    for (auto [act, kv] : {std::pair{DType::F32, DType::F32}, std::pair{DType::BF16, DType::BF16},
                           std::pair{DType::F32, DType::F8_E4M3FN}, std::pair{DType::BF16, DType::F8_E4M3FN}}) {
      if (p == Platform::CPU && act == DType::BF16 && kv == DType::F8_E4M3FN) continue;
      LayerCase c;
      c.platform = p;
      c.cfg = b.cfg, c.act = act, c.kv = kv, c.page_size = pages[k++ % 3], c.mode = b.mode;
      c.requests = b.reqs, c.settings.chunk_capacity = b.chunk;
      c.seed = uint64_t(7 + k);
      c.name = fmt::format("{}_{}_kv{}_page{}", b.name, dtype_name(act), dtype_name(kv), c.page_size);
      cases.push_back(c);
    }
  return cases;
}

// The ROCm platform: every case of all_cases on the default target (gfx942, absorbed weights in the
// activation dtype; decode cases dispatch aiter's fused-RoPE decode), plus the targets and absorb
// weight formats on the shapes whose dims they need (MXFP4 blocks of 32).
inline std::vector<LayerCase> rocm_cases() {
  std::vector<LayerCase> cases = all_cases(Platform::ROCM);
  for (LayerCase& c : cases) {
    c.settings.fused_decode_rope = c.mode == ForwardMode::DECODE;
    c.name = "gfx942_" + c.name;
  }
  struct Variant { RocmArch arch; AbsorbFormat absorb; };
  const Variant variants[] = {{RocmArch::GFX942, AbsorbFormat::FP8}, {RocmArch::GFX942, AbsorbFormat::FP8_DEQUANT},
                              {RocmArch::GFX950, AbsorbFormat::ACT},  {RocmArch::GFX950, AbsorbFormat::FP8},
                              {RocmArch::GFX950, AbsorbFormat::MXFP4}, {RocmArch::GFX90A, AbsorbFormat::FP8_DEQUANT}};
  struct RocmShape { const char* name; AttentionConfig cfg; std::vector<std::pair<int64_t, int64_t>> reqs; ForwardMode mode; };
  const RocmShape shapes[] = {
      {"mid16_mixed", mid_config(), {{0, 9}, {45, 6}, {13, 0}, {131, 2}}, ForwardMode::EXTEND},
      {"v2lite_decode", preset_config("deepseek-v2-lite"), {{31, 1}, {2, 1}, {0, 1}}, ForwardMode::DECODE},
  };  // (V3 itself runs in the default-target cases above; its f64 reference is the slow part)
  int k = 0;
  for (const Variant& v : variants)
    for (const RocmShape& sh : shapes)
      for (auto [act, kv] : {std::pair{DType::BF16, DType::BF16}, std::pair{DType::F32, DType::F8_E4M3FN}}) {
        LayerCase c;
        c.platform = Platform::ROCM;
        c.cfg = sh.cfg, c.act = act, c.kv = kv, c.page_size = k % 2 ? 16 : 1, c.mode = sh.mode, c.requests = sh.reqs;
        c.kv_scale = is_fp8(kv) ? 0.05 : 1.0;
        c.settings.chunk_capacity = 64;
        c.settings.fused_decode_rope = sh.mode == ForwardMode::DECODE;
        c.options.rocm.arch = v.arch, c.options.rocm.absorb = v.absorb;
        c.seed = uint64_t(300 + k++);
        c.name = fmt::format("{}_{}_{}_{}_kv{}_page{}", rocm_arch_name(v.arch), absorb_format_name(v.absorb), sh.name,
                             dtype_name(act), dtype_name(kv), c.page_size);
        for (char& ch : c.name)
          if (ch == '-') ch = '_';
        cases.push_back(c);
      }
  return cases;
}

}  // namespace mla::test
