// Attention weights: shapes and validation, random weights, HF loading with block-fp8
// dequantization, and the kv_b_proj split into the absorbed w_kc / w_vc.
#include "mla/weights.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "mla/error.h"

namespace mla {

namespace {

bool is_float_dtype(DType t) {
  return t == DType::F64 || t == DType::F32 || t == DType::BF16 || t == DType::F16;
}

void check_float_dtype(DType t, const char* what) {
  if (!is_float_dtype(t))
    fail("{}: dtype {} is not a float dtype (f64, f32, bf16, f16)", what, dtype_name(t));
}

using Slot = AttentionWeightSlot;

}  // namespace

std::vector<AttentionWeightSlot> attention_weight_slots(const AttentionConfig& c) {
  const int64_t H = c.num_attention_heads, hs = c.hidden_size, r = c.q_lora_rank;
  const bool lora = c.has_q_lora();
  return {
      {"q_a_proj", &AttentionWeights::q_a_proj, {r, hs}, lora, false},
      {"q_a_layernorm", &AttentionWeights::q_a_layernorm, {r}, lora, true},
      {"q_b_proj", &AttentionWeights::q_b_proj, {H * c.qk_head_dim(), r}, lora, false},
      {"q_proj", &AttentionWeights::q_proj, {H * c.qk_head_dim(), hs}, !lora, false},
      {"kv_a_proj_with_mqa", &AttentionWeights::kv_a_proj_with_mqa, {c.kv_row_dim(), hs}, true,
       false},
      {"kv_a_layernorm", &AttentionWeights::kv_a_layernorm, {c.kv_lora_rank}, true, true},
      {"kv_b_proj", &AttentionWeights::kv_b_proj,
       {H * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank}, true, false},
      {"o_proj", &AttentionWeights::o_proj, {hs, H * c.v_head_dim}, true, false},
  };
}

namespace {

// Rows [row0, row0 + rows) of a row-major 2-D view with `cols` columns, copied bytewise.
void copy_rows(const Tensor& src, int64_t src_row, Tensor& dst, int64_t dst_row, int64_t rows,
               int64_t cols) {
  const size_t es = dtype_size(src.dtype());
  std::memcpy(static_cast<char*>(dst.data()) + size_t(dst_row * cols) * es,
              static_cast<const char*>(src.data()) + size_t(src_row * cols) * es,
              size_t(rows * cols) * es);
}

void check_host(const Tensor& t, const std::string& what) {
  if (t.platform() != Platform::CPU)
    fail("{} must be a host tensor, got one on {}", what, platform_name(t.platform()));
}

}  // namespace

void AttentionWeights::validate(const AttentionConfig& c) const {
  for (const Slot& s : attention_weight_slots(c)) {
    const Tensor& t = this->*s.member;
    if (!s.used) {
      if (t.defined())
        fail("attention weights: {} must be absent when q_lora_rank is {}, got shape {}", s.name,
             c.has_q_lora() ? "set" : "null", shape_str(t.shape()));
      continue;
    }
    if (!t.defined())
      fail("attention weights: {} is missing, expected shape {}", s.name, shape_str(s.shape));
    if (t.shape() != s.shape)
      fail("attention weights: {} has shape {}, expected {}", s.name, shape_str(t.shape()),
           shape_str(s.shape));
    if (!is_float_dtype(t.dtype()))
      fail("attention weights: {} has dtype {}, expected f64, f32, bf16 or f16", s.name,
           dtype_name(t.dtype()));
  }
}

AttentionWeights AttentionWeights::to(DType dtype) const {
  AttentionWeights w;
  for (auto m : {&AttentionWeights::q_a_proj, &AttentionWeights::q_a_layernorm,
                 &AttentionWeights::q_b_proj, &AttentionWeights::q_proj,
                 &AttentionWeights::kv_a_proj_with_mqa, &AttentionWeights::kv_a_layernorm,
                 &AttentionWeights::kv_b_proj, &AttentionWeights::o_proj})
    if ((this->*m).defined()) w.*m = (this->*m).to(dtype);
  return w;
}

AttentionWeights random_attention_weights(const AttentionConfig& c, uint64_t seed, DType dtype) {
  check_float_dtype(dtype, "random attention weights");
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  AttentionWeights w;
  for (const Slot& s : attention_weight_slots(c)) {
    if (!s.used) continue;
    for (int64_t d : s.shape)
      if (d < 1)
        fail("random attention weights: {} would have shape {}: check the config", s.name,
             shape_str(s.shape));
    int64_t n = 1;
    for (int64_t d : s.shape) n *= d;
    std::vector<double> v(static_cast<size_t>(n));  // generated in double, then stored in dtype
    if (s.norm) {
      for (double& x : v) x = 1.0 + 0.1 * normal(rng);
    } else {
      const double stddev = 1.0 / std::sqrt(double(s.shape[1]));  // 1/sqrt(in_features)
      for (double& x : v) x = stddev * normal(rng);
    }
    w.*s.member = Tensor::host_from(v, dtype, s.shape);
  }
  return w;
}

Tensor dequantize_block_fp8(const Tensor& w, const Tensor& scale_inv, DType dtype, int64_t block) {
  if (block < 1) fail("dequantize_block_fp8: block must be >= 1, got {}", block);
  if (!is_fp8(w.dtype()))
    fail("dequantize_block_fp8: weight dtype must be fp8_e4m3fn or fp8_e4m3fnuz, got {}",
         dtype_name(w.dtype()));
  if (w.rank() != 2) fail("dequantize_block_fp8: weight must be 2-D, got {}", shape_str(w.shape()));
  if (scale_inv.dtype() != DType::F32)
    fail("dequantize_block_fp8: scale_inv dtype must be f32, got {}",
         dtype_name(scale_inv.dtype()));
  check_float_dtype(dtype, "dequantize_block_fp8 output");
  const int64_t N = w.dim(0), K = w.dim(1);
  const Shape want{(N + block - 1) / block, (K + block - 1) / block};
  if (scale_inv.shape() != want)
    fail("dequantize_block_fp8: scale_inv has shape {}, expected {} for weight {} and block {}",
         shape_str(scale_inv.shape()), shape_str(want), shape_str(w.shape()), block);
  check_host(w, "dequantize_block_fp8: weight");
  check_host(scale_inv, "dequantize_block_fp8: scale_inv");

  Tensor out = Tensor::host(dtype, {N, K});  // [N, K]
  const uint8_t* q = w.ptr<uint8_t>();
  const float* s = scale_inv.ptr<float>();
  const bool fnuz = w.dtype() == DType::F8_E4M3FNUZ;
  const int64_t kb = want[1];
  for (int64_t n = 0; n < N; ++n) {
    const float* srow = s + (n / block) * kb;
    for (int64_t k = 0; k < K; ++k) {
      const uint8_t code = q[n * K + k];
      const double v = fnuz ? fp8_e4m3fnuz_to_float(code) : fp8_e4m3fn_to_float(code);
      out.set(size_t(n * K + k), v * double(srow[k / block]));  // exact product, one rounding
    }
  }
  return out;
}

const Tensor& check_weight(const std::optional<Tensor>& t, const std::string& name,
                           const Shape& shape) {
  if (!t || !t->defined()) fail("checkpoint: missing tensor '{}'", name);
  if (t->shape() != shape)
    fail("checkpoint: tensor '{}' has shape {}, expected {}", name, shape_str(t->shape()),
         shape_str(shape));
  check_host(*t, "checkpoint: tensor '" + name + "'");
  if (!is_fp8(t->dtype()) && !is_float_dtype(t->dtype()))
    fail("checkpoint: tensor '{}' has dtype {}, expected a float or fp8 dtype", name,
         dtype_name(t->dtype()));
  return *t;
}

Tensor load_weight(const TensorLookup& get, const std::string& name, const Shape& shape,
                   DType dtype) {
  check_float_dtype(dtype, "load weight");
  std::optional<Tensor> t = get(name);
  check_weight(t, name, shape);
  if (is_fp8(t->dtype())) {
    const std::string sname = name + "_scale_inv";
    std::optional<Tensor> sc = get(sname);
    if (!sc || !sc->defined())
      fail("checkpoint: fp8 tensor '{}' needs '{}', which is missing", name, sname);
    if (t->rank() != 2)
      fail("checkpoint: fp8 tensor '{}' must be 2-D for block dequantization, got {}", name,
           shape_str(t->shape()));
    const Shape want{(t->dim(0) + 127) / 128, (t->dim(1) + 127) / 128};
    if (sc->shape() != want || sc->dtype() != DType::F32)
      fail("checkpoint: tensor '{}' is {} {}, expected f32 {}", sname, dtype_name(sc->dtype()),
           shape_str(sc->shape()), shape_str(want));
    check_host(*sc, "checkpoint: tensor '" + sname + "'");
    return dequantize_block_fp8(*t, *sc, dtype);
  }
  return t->to(dtype);
}

AttentionWeights load_attention_weights(const AttentionConfig& c, const TensorLookup& get,
                                        const std::string& prefix, DType dtype) {
  check_float_dtype(dtype, "load attention weights");
  AttentionWeights w;
  for (const Slot& s : attention_weight_slots(c))
    if (s.used) w.*s.member = load_weight(get, prefix + s.name + ".weight", s.shape, dtype);
  w.validate(c);
  return w;
}

AbsorbedWeights split_kv_b_proj(const AttentionConfig& c, const Tensor& kv_b_proj) {
  const int64_t H = c.num_attention_heads, dn = c.qk_nope_head_dim, dv = c.v_head_dim;
  const int64_t R = c.kv_lora_rank;
  const Shape want{H * (dn + dv), R};
  if (!kv_b_proj.defined()) fail("split_kv_b_proj: kv_b_proj is missing, expected {}",
                                 shape_str(want));
  if (kv_b_proj.shape() != want)
    fail("split_kv_b_proj: kv_b_proj has shape {}, expected {}", shape_str(kv_b_proj.shape()),
         shape_str(want));
  check_host(kv_b_proj, "split_kv_b_proj: kv_b_proj");
  AbsorbedWeights a;
  a.w_kc = Tensor::host(kv_b_proj.dtype(), {H, dn, R});  // [H, dn, R]
  a.w_vc = Tensor::host(kv_b_proj.dtype(), {H, dv, R});  // [H, dv, R]
  for (int64_t h = 0; h < H; ++h) {
    copy_rows(kv_b_proj, h * (dn + dv), a.w_kc, h * dn, dn, R);
    copy_rows(kv_b_proj, h * (dn + dv) + dn, a.w_vc, h * dv, dv, R);
  }
  return a;
}

Tensor merge_kv_b_proj(const AttentionConfig& c, const AbsorbedWeights& a) {
  const int64_t H = c.num_attention_heads, dn = c.qk_nope_head_dim, dv = c.v_head_dim;
  const int64_t R = c.kv_lora_rank;
  const Shape kc{H, dn, R}, vc{H, dv, R};
  if (!a.w_kc.defined() || a.w_kc.shape() != kc)
    fail("merge_kv_b_proj: w_kc has shape {}, expected {}",
         a.w_kc.defined() ? shape_str(a.w_kc.shape()) : "(missing)", shape_str(kc));
  if (!a.w_vc.defined() || a.w_vc.shape() != vc)
    fail("merge_kv_b_proj: w_vc has shape {}, expected {}",
         a.w_vc.defined() ? shape_str(a.w_vc.shape()) : "(missing)", shape_str(vc));
  if (a.w_kc.dtype() != a.w_vc.dtype())
    fail("merge_kv_b_proj: w_kc is {} but w_vc is {}", dtype_name(a.w_kc.dtype()),
         dtype_name(a.w_vc.dtype()));
  check_host(a.w_kc, "merge_kv_b_proj: w_kc");
  check_host(a.w_vc, "merge_kv_b_proj: w_vc");
  Tensor out = Tensor::host(a.w_kc.dtype(), {H * (dn + dv), R});  // [H·(dn+dv), R]
  for (int64_t h = 0; h < H; ++h) {
    copy_rows(a.w_kc, h * dn, out, h * (dn + dv), dn, R);
    copy_rows(a.w_vc, h * dv, out, h * (dn + dv) + dn, dv, R);
  }
  return out;
}

}  // namespace mla
