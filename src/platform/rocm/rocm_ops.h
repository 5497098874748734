// The ROCm platform's Ops: the shared GPU ops (platform/gpu), our own GEMMs (gemm.cu: there is no
// hipBLAS here), the absorbed weights packed per the settings (act, fp8, fp8-dequant, MXFP4), and
// the fused steps the ROCm twins run (kernels.h). Built by hipcc for AMD GPUs, and by nvcc for
// NVIDIA GPUs ("rocm-on-cuda"), where the same harness proves its numerics.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mla/platform_ops.h"
#include "mla/rope.h"
#include "platform/gpu/gpu_ops.h"
#include "platform/rocm/gemm.h"
#include "platform/rocm/kernels.h"
#include "platform/registry.h"

namespace mla::rocm {

// The absorbed weights of a layer as the ROCm absorb GEMMs read them: K-contiguous per head,
// kc [H, kv_lora_rank, qk_nope_head_dim] (w_kc transposed) and vc [H, v_head_dim, kv_lora_rank].
struct AbsorbPack {
  AbsorbFormat format = AbsorbFormat::ACT;
  int64_t H = 0, L = 0, dn = 0, dv = 0;
  Tensor kc, vc;                // act dtype, fp8 codes, or packed e2m1 (U8 [.., K/2])
  Tensor kc_scales, vc_scales;  // MXFP4: e8m0 codes (U8 [.., K/32])
  float kc_scale = 1.f, vc_scale = 1.f;  // fp8: per tensor
};

class RocmOps final : public gpu::GpuOps {
 public:
  RocmOps(DType act, const RocmSettings& settings);

  std::string name() const override;
  const RocmSettings& settings() const { return settings_; }

  void linear(const Tensor& x, const Tensor& w, Tensor& y) override;
  void absorb_q(const Tensor& q, const Tensor& w_kc, int64_t dn, int64_t dr, Tensor& q_mla) override;
  void absorb_o(const Tensor& o_lat, const Tensor& w_vc, Tensor& o) override;
  std::shared_ptr<const void> pack_absorbed(const AbsorbedWeights& host) override;
  bool packs_absorbed() const override { return true; }
  std::optional<AbsorbedWeights> absorbed_as_packed(const AbsorbedWeights& host) const override;

  // ---- the twins' own steps -------------------------------------------------------------------
  // Both latent RMSNorms in one kernel: qa[T, q_lora_rank] (absent without q_lora) and the first
  // kv_lora_rank columns of kva[T, row_dim].
  void latent_norms(Tensor* qa, const Tensor* qa_w, Tensor& kva, int64_t kv_lora_rank, const Tensor& kv_w,
                    double eps);
  // q_mla[T, H, :L] = q[:, h, :dn] · w_kc[h] through the pack (columns L.. are left for the concat).
  void absorb_q_packed(const Tensor& q, const AbsorbPack& pack, int64_t dr, Tensor& q_mla);
  // o[T, H, dv] = o_lat[T, H, L] · w_vc[h]ᵀ through the pack.
  void absorb_o_packed(const Tensor& o_lat, const AbsorbPack& pack, Tensor& o);
  // RoPE (or, rotate = false, only the moves), the q_pe concat into q_dst at column q_dst_pe, and
  // the latent cache write, in one kernel. q[T, H, q_hd] with q_pe at q_pe_col; kva[T, row_dim].
  void rope_concat_cache(const Tensor& q, int64_t q_pe_col, Tensor& q_dst, int64_t q_dst_pe, Tensor& kva,
                         int64_t kv_lora_rank, const std::vector<int32_t>& positions, const RopeFrequencies& f,
                         bool rotate, KVPool& pool, int64_t layer, const std::vector<int32_t>& slots);
  // The MHA K build cast to k's dtype (÷ k_scale) in the same pass; v in its own dtype.
  void build_kv_cast(const Tensor& kv, const Tensor& rows, int64_t L, int64_t H, int64_t dn, int64_t dr, int64_t dv,
                     Tensor& k, Tensor& v, double k_scale);
  // MHA attention whose k holds values ÷ k_scale in its own dtype (v in q's).
  void attention_cast_k(const Tensor& q, const Tensor& k, const Tensor& v, double k_scale, const AttnSegments& seg,
                        double scale, Tensor& o, Tensor& lse);
  // The absorbed decode attention with RoPE inside the kernel (MLA_FUSED_ROPE_ROCM); see kernels.h.
  void mla_decode_fused_rope(const Tensor& q, const Tensor& kva, KVPool& pool, int64_t layer,
                             const std::vector<int32_t>& kv_slots, const AttnSegments& seg,
                             const std::vector<int32_t>& positions, const RopeFrequencies& f, int64_t L,
                             double scale, Tensor& o, Tensor& lse);

 private:
  RocmSettings settings_;
  void run_gemm(GemmParams p, const AbsorbPack* pack, bool is_kc);
};

// The ROCm ops behind `ops`; throws Error when `ops` belongs to another platform.
RocmOps& rocm_ops(Ops& ops);

std::unique_ptr<Ops> make_rocm_ops(DType act, const RocmSettings& settings);
// The ROCm twins (MHA_ROCM, MHA_ONE_SHOT_ROCM, MHA_CHUNKED_KV_ROCM, MLA_ROCM, MLA_FUSED_ROPE_ROCM)
// for the registry (twins.cpp).
void add_twins(std::vector<MethodImpl>& registry);

}  // namespace mla::rocm
