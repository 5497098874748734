// The ROCm platform's Ops (rocm_ops.h).
#include "platform/rocm/rocm_ops.h"

#include <fmt/format.h>

#include "mla/error.h"

namespace mla::rocm {

using gpu::elem_of;
using gpu::expect;
using gpu::rows_of;

namespace {

// [B, R, C] → [B, C, R] on the host, in f64 (no rounding).
Tensor transpose_host(const Tensor& t) {
  const int64_t B = t.dim(0), R = t.dim(1), C = t.dim(2);
  const std::vector<double> x = t.to_doubles();
  std::vector<double> y(x.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) y[size_t((b * C + c) * R + r)] = x[size_t((b * R + r) * C + c)];
  return Tensor::host_from(y, DType::F64, {B, C, R});
}

// One absorbed weight [H, N, K] (K-contiguous) in the pack's format, on the host.
struct HostPacked {
  Tensor data, scales;
  float scale = 1.f;
};
HostPacked pack_one(const Tensor& w, AbsorbFormat f, const RocmSettings& s, DType act, const char* what) {
  switch (f) {
    case AbsorbFormat::ACT: return {w.to(act), {}, 1.f};
    case AbsorbFormat::FP8:
    case AbsorbFormat::FP8_DEQUANT: {
      Fp8Weight q = quantize_fp8_per_tensor(w, s.fp8_flavor());
      return {q.codes, {}, q.scale};
    }
    case AbsorbFormat::MXFP4: {
      if (w.dim(2) % 32 != 0)
        fail("absorb weights mxfp4: {} reduces over {} values, not a multiple of the 32-value block", what, w.dim(2));
      Mxfp4Weight q = quantize_mxfp4(w);
      return {q.packed, q.scales, 1.f};
    }
  }
  fail("absorb weights: unknown format");
}
Tensor unpack_one(const HostPacked& p, AbsorbFormat f, const Shape& shape) {
  if (f == AbsorbFormat::MXFP4) return dequantize(Mxfp4Weight{p.data, p.scales, shape}, DType::F64);
  return dequantize(Fp8Weight{p.data, p.scale}, DType::F64);
}

}  // namespace

RocmOps::RocmOps(DType act, const RocmSettings& settings) : GpuOps(Platform::ROCM, act), settings_(settings) {}

std::string RocmOps::name() const {
  return fmt::format("rocm-{}-{}", rocm_arch_name(settings_.arch), dtype_name(act_dtype()));
}

void RocmOps::linear(const Tensor& x, const Tensor& w, Tensor& y) {
  const Tensor xc = linear_input(x, w, y);
  if (!xc.defined()) return;
  const int64_t K = x.dim(-1), M = rows_of(x), N = w.dim(0);
  gemm({xc.data(), elem_of(xc.dtype()), K, 0, w.data(), elem_of(w.dtype()), WeightFormat::PLAIN, K, 0, 1.f, nullptr, 0, 0,
        y.data(), elem_of(y.dtype()), N, 0, M, N, K, 1, ActQuant::NONE, stream()});
}

void RocmOps::absorb_q(const Tensor& q, const Tensor& w_kc, int64_t dn, int64_t dr, Tensor& q_mla) {
  const int64_t H = w_kc.dim(0), L = w_kc.dim(2), T = q.numel() / (H * (dn + dr));
  expect(w_kc.dim(1) == dn && q_mla.numel() == T * H * (L + dr), "absorb_q", "shape");
  if (T == 0) return;
  AbsorbPack pack{AbsorbFormat::ACT, H, L, dn, 0, empty(w_kc.dtype(), {H, L, dn}), {}, {}, {}, 1.f, 1.f};
  transpose_last2(w_kc.data(), elem_of(w_kc.dtype()), H, dn, L, pack.kc.data(), stream());
  absorb_q_packed(q, pack, dr, q_mla);
  gpu::copy_cols(q.data(), elem_of(q.dtype()), dn + dr, dn, q_mla.data(), elem_of(q_mla.dtype()), L + dr, L, T * H, dr,
                 stream());
}

void RocmOps::absorb_o(const Tensor& o_lat, const Tensor& w_vc, Tensor& o) {
  const int64_t H = w_vc.dim(0), dv = w_vc.dim(1), L = w_vc.dim(2);
  AbsorbPack pack{AbsorbFormat::ACT, H, L, 0, dv, {}, w_vc, {}, {}, 1.f, 1.f};
  absorb_o_packed(o_lat, pack, o);
}

// The GEMM of one absorbed weight (kc or vc of the pack) in the pack's format; p holds the
// activation and output sides and the sizes.
void RocmOps::run_gemm(GemmParams p, const AbsorbPack* pack, bool is_kc) {
  const Tensor& w = is_kc ? pack->kc : pack->vc;
  const int64_t N = p.N, K = p.K;
  p.w = w.data();
  p.w_ld = K, p.w_bstride = N * K;
  p.wf = WeightFormat::PLAIN, p.aq = ActQuant::NONE, p.w_scale = 1.f;
  Tensor dequantized;
  switch (pack->format) {
    case AbsorbFormat::ACT: p.w_elem = elem_of(w.dtype()); break;
    case AbsorbFormat::FP8:
      p.w_elem = elem_of(w.dtype()), p.wf = WeightFormat::FP8, p.aq = ActQuant::FP8_GROUP128;
      p.w_scale = is_kc ? pack->kc_scale : pack->vc_scale;
      break;
    case AbsorbFormat::FP8_DEQUANT:  // the fallback: the weight × scale in the activation dtype, per call
      dequantized = empty(act_dtype(), w.shape());
      dequantize_fp8(w.data(), elem_of(w.dtype()), is_kc ? pack->kc_scale : pack->vc_scale, dequantized.data(),
                     elem_of(act_dtype()), size_t(w.numel()), stream());
      p.w = dequantized.data(), p.w_elem = elem_of(act_dtype());
      break;
    case AbsorbFormat::MXFP4:
      p.wf = WeightFormat::MXFP4, p.aq = ActQuant::MXFP4, p.w_elem = gpu::Elem::F32;  // unused
      p.w_ld = K / 2, p.w_bstride = N * K / 2;
      p.w_scales = static_cast<const uint8_t*>((is_kc ? pack->kc_scales : pack->vc_scales).data());
      p.s_ld = K / 32, p.s_bstride = N * K / 32;
      break;
  }
  gemm(p);
}

void RocmOps::absorb_q_packed(const Tensor& q, const AbsorbPack& pack, int64_t dr, Tensor& q_mla) {
  const int64_t H = pack.H, L = pack.L, dn = pack.dn, T = q.numel() / (H * (dn + dr));
  expect(q.numel() == T * H * (dn + dr) && q_mla.numel() == T * H * (L + dr), "absorb_q", "shape");
  if (T == 0) return;
  GemmParams p{};
  p.x = q.data(), p.x_elem = elem_of(q.dtype()), p.x_ld = H * (dn + dr), p.x_bstride = dn + dr;
  p.y = q_mla.data(), p.y_elem = elem_of(q_mla.dtype()), p.y_ld = H * (L + dr), p.y_bstride = L + dr;
  p.M = T, p.N = L, p.K = dn, p.batch = H, p.stream = stream();
  run_gemm(p, &pack, true);
}

void RocmOps::absorb_o_packed(const Tensor& o_lat, const AbsorbPack& pack, Tensor& o) {
  const int64_t H = pack.H, L = pack.L, dv = pack.dv, T = o_lat.numel() / (H * L);
  expect(o_lat.numel() == T * H * L && o.numel() == T * H * dv, "absorb_o", "shape");
  if (T == 0) return;
  GemmParams p{};
  p.x = o_lat.data(), p.x_elem = elem_of(o_lat.dtype()), p.x_ld = H * L, p.x_bstride = L;
  p.y = o.data(), p.y_elem = elem_of(o.dtype()), p.y_ld = H * dv, p.y_bstride = dv;
  p.M = T, p.N = dv, p.K = L, p.batch = H, p.stream = stream();
  run_gemm(p, &pack, false);
}

std::shared_ptr<const void> RocmOps::pack_absorbed(const AbsorbedWeights& host) {
  const AbsorbFormat f = settings_.absorb;
  auto pack = std::make_shared<AbsorbPack>();
  pack->format = f;
  pack->H = host.w_kc.dim(0), pack->dn = host.w_kc.dim(1), pack->L = host.w_kc.dim(2), pack->dv = host.w_vc.dim(1);
  HostPacked kc = pack_one(transpose_host(host.w_kc), f, settings_, act_dtype(), "w_kc (over qk_nope_head_dim)");
  HostPacked vc = pack_one(host.w_vc, f, settings_, act_dtype(), "w_vc (over kv_lora_rank)");
  pack->kc = upload(kc.data), pack->vc = upload(vc.data);
  if (kc.scales.defined()) pack->kc_scales = upload(kc.scales), pack->vc_scales = upload(vc.scales);
  pack->kc_scale = kc.scale, pack->vc_scale = vc.scale;
  return pack;
}

std::optional<AbsorbedWeights> RocmOps::absorbed_as_packed(const AbsorbedWeights& host) const {
  const AbsorbFormat f = settings_.absorb;
  if (f == AbsorbFormat::ACT) return std::nullopt;
  const Tensor kcT = transpose_host(host.w_kc);
  HostPacked kc = pack_one(kcT, f, settings_, act_dtype(), "w_kc (over qk_nope_head_dim)");
  HostPacked vc = pack_one(host.w_vc, f, settings_, act_dtype(), "w_vc (over kv_lora_rank)");
  return AbsorbedWeights{transpose_host(unpack_one(kc, f, kcT.shape())), unpack_one(vc, f, host.w_vc.shape())};
}

void RocmOps::latent_norms(Tensor* qa, const Tensor* qa_w, Tensor& kva, int64_t kv_lora_rank, const Tensor& kv_w,
                           double eps) {
  const int64_t T = rows_of(kva);
  expect(kv_w.numel() == kv_lora_rank && kv_lora_rank <= kva.dim(-1), "latent_norms", "kv_a_layernorm size");
  LatentNormParams p{};
  if (qa) {
    expect(qa_w && qa_w->numel() == qa->dim(-1) && rows_of(*qa) == T, "latent_norms", "q_a_layernorm size");
    p.qa = qa->data(), p.qa_elem = elem_of(qa->dtype()), p.q_ld = qa->dim(-1), p.q_n = qa->dim(-1);
    p.q_w = qa_w->data(), p.q_w_elem = elem_of(qa_w->dtype());
  }
  p.kva = kva.data(), p.kva_elem = elem_of(kva.dtype()), p.kv_ld = kva.dim(-1), p.kv_n = kv_lora_rank;
  p.kv_w = kv_w.data(), p.kv_w_elem = elem_of(kv_w.dtype());
  p.T = T, p.eps = float(eps), p.stream = stream();
  latent_rmsnorm(p);
}

void RocmOps::rope_concat_cache(const Tensor& q, int64_t q_pe_col, Tensor& q_dst, int64_t q_dst_pe, Tensor& kva,
                                int64_t kv_lora_rank, const std::vector<int32_t>& positions, const RopeFrequencies& f,
                                bool rotate, KVPool& pool, int64_t layer, const std::vector<int32_t>& slots) {
  const int64_t T = rows_of(kva), D = kva.dim(-1), half = int64_t(f.inv_freq.size());
  expect(q.rank() == 3 && q_dst.rank() == 3 && q.dim(0) == T && q_dst.dim(0) == T && q.dim(1) == q_dst.dim(1) &&
             q.dtype() == q_dst.dtype() && q_pe_col + 2 * half <= q.dim(2) && q_dst_pe + 2 * half <= q_dst.dim(2) &&
             kv_lora_rank + 2 * half == D && pool.config().row_dim == D && int64_t(positions.size()) == T &&
             int64_t(slots.size()) == T,
         "rope_concat_cache", "shapes");
  check_slots(pool, slots, "rope_concat_cache");
  if (T == 0) return;
  Tensor& buf = pool.buffer(layer);
  RopeCacheParams p{q.data(), q_dst.data(), elem_of(q.dtype()), q.dim(1), q.dim(2), q_pe_col, q_dst.dim(2), q_dst_pe,
                    kva.data(), elem_of(kva.dtype()), kv_lora_rank, D, ints(positions, 0), doubles(f.inv_freq), half,
                    f.attention_factor, f.interleave, rotate, buf.data(), elem_of(buf.dtype()), float(pool.scale(layer)),
                    ints(slots, 1), settings_.two_part_cache_write() ? CacheWrite::TWO_PART : CacheWrite::ASSEMBLED, T,
                    stream()};
  rocm::rope_concat_cache(p);
}

void RocmOps::build_kv_cast(const Tensor& kv, const Tensor& rows, int64_t L, int64_t H, int64_t dn, int64_t dr,
                            int64_t dv, Tensor& k, Tensor& v, double k_scale) {
  const int64_t S = rows_of(rows);
  expect(kv.numel() == S * H * (dn + dv) && k.numel() == S * H * (dn + dr) && v.numel() == S * H * dv, "build_kv_cast",
         "shape");
  rocm::build_kv_cast({kv.data(), elem_of(kv.dtype()), rows.data(), elem_of(rows.dtype()), rows.dim(-1), L, S, H, dn, dr,
                       dv, k.data(), v.data(), elem_of(k.dtype()), elem_of(v.dtype()), float(k_scale), stream()});
}

void RocmOps::attention_cast_k(const Tensor& q, const Tensor& k, const Tensor& v, double k_scale,
                               const AttnSegments& seg, double scale, Tensor& o, Tensor& lse) {
  expect(v.dtype() == q.dtype() && o.dtype() == q.dtype(), "attention", "v and o must be in q's dtype");
  gpu::MhaParams p = mha_params(q, k, v, seg, scale, o, lse);
  mha_attention_cast_k(p, elem_of(k.dtype()), float(k_scale));
}

void RocmOps::mla_decode_fused_rope(const Tensor& q, const Tensor& kva, KVPool& pool, int64_t layer,
                                    const std::vector<int32_t>& kv_slots, const AttnSegments& seg,
                                    const std::vector<int32_t>& positions, const RopeFrequencies& f, int64_t L,
                                    double scale, Tensor& o, Tensor& lse) {
  const int64_t half = int64_t(f.inv_freq.size());
  expect(kva.dim(-1) == pool.config().row_dim && L + 2 * half == kva.dim(-1) &&
             int64_t(positions.size()) == q.dim(0) && rows_of(kva) == q.dim(0),
         "mla_decode_fused_rope", "shapes");
  for (size_t r = 0; r < seg.q_len.size(); ++r)
    expect(seg.q_len[r] == 1 && seg.causal, "mla_decode_fused_rope", "every request must decode one token");
  FusedRopeDecodeParams p{mla_params(q, pool, layer, kv_slots, seg, L, scale, o, lse), pool.buffer(layer).data(),
                          kva.data(), elem_of(kva.dtype()), ints(positions, 0), doubles(f.inv_freq), half,
                          f.attention_factor, f.interleave};
  rocm::mla_decode_fused_rope(p);
}

RocmOps& rocm_ops(Ops& ops) {
  auto* r = dynamic_cast<RocmOps*>(&ops);
  if (!r) fail("a ROCm method needs the ROCm platform's ops, not {}", ops.name());
  return *r;
}

std::unique_ptr<Ops> make_rocm_ops(DType act, const RocmSettings& settings) {
  if (act != DType::F32 && act != DType::BF16)
    fail("rocm ops: no flavour stores activations as {} (f32, bf16)", dtype_name(act));
  settings.validate();
  return std::make_unique<RocmOps>(act, settings);
}

PlatformEntry platform_entry() {
  return {Platform::ROCM, gpu::device_count,
          [](DType act, const PlatformOptions& o) { return make_rocm_ops(act, o.rocm); },
          add_twins};
}

}  // namespace mla::rocm
