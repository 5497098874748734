// The CUDA platform's Ops: device memory, cuBLAS GEMMs (f32 with TF32 off, or bf16 with f32
// accumulation), the small kernels of elementwise.cu, and the attention kernels — the tensor-core
// ones (mha_prefill.cu, mla_decode.cu) for bf16 at the shapes they support, the general ones
// (attention_generic.cu) otherwise, chosen by dtype and shape alone.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdlib>
#include <map>

#include "mla/error.h"
#include "mla/platform_ops.h"
#include "platform/cuda/attention_kernels.h"
#include "platform/cuda/cuda_check.h"
#include "platform/cuda/elementwise.h"
#include "platform/cuda/mha_prefill.h"
#include "platform/cuda/mla_decode.h"

namespace mla {
namespace cuda {

void cuda_fail(const char* kind, const char* what, const char* call, const char* file, int line) {
  fail("{} error: {} in {} ({}:{})", kind, what, call, file, line);
}

namespace {

Elem elem_of(DType t) {
  switch (t) {
    case DType::F32: return Elem::F32;
    case DType::BF16: return Elem::BF16;
    case DType::F8_E4M3FN: return Elem::FP8_E4M3FN;
    default: fail("cuda: dtype {} is not supported on the device (f32, bf16, fp8_e4m3fn)", dtype_name(t));
  }
}

cudaDataType_t blas_type(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::BF16: return CUDA_R_16BF;
    default: fail("cuda gemm: dtype {} is not supported", dtype_name(t));
  }
}

int64_t rows_of(const Tensor& t) { return t.dim(-1) == 0 ? 0 : t.numel() / t.dim(-1); }

void expect(bool ok, const char* op, const std::string& what) {
  if (!ok) fail("cuda {}: {}", op, what);
}

class CudaOps final : public Ops {
 public:
  explicit CudaOps(DType act) : act_(act) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) fail("cuda: no CUDA device is available");
    cudaStream_t s = nullptr;
    MLA_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    // Tensors free themselves in stream order, so the stream lives as long as the last of them.
    stream_owner_ = std::shared_ptr<CUstream_st>(s, [](cudaStream_t q) {
      cudaStreamSynchronize(q);
      cudaStreamDestroy(q);
    });
    stream_ = s;
    MLA_CUBLAS_CHECK(cublasCreate(&blas_));
    MLA_CUBLAS_CHECK(cublasSetStream(blas_, stream_));
    // f32 GEMMs stay exact: no TF32 (CUBLAS_DEFAULT_MATH with CUBLAS_COMPUTE_32F never uses it).
    MLA_CUBLAS_CHECK(cublasSetMathMode(blas_, CUBLAS_DEFAULT_MATH));
    cudaDeviceProp prop{};
    MLA_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    num_sms_ = prop.multiProcessorCount;
    // Tests set MLA_CUDA_POISON=1: every new buffer starts as NaN, so an output a kernel forgot to
    // write shows up instead of passing on stale zeros.
    const char* poison = std::getenv("MLA_CUDA_POISON");
    poison_ = poison && std::string(poison) == "1";
  }
  ~CudaOps() override {
    cudaStreamSynchronize(stream_);
    cublasDestroy(blas_);
  }

  Platform platform() const override { return Platform::CUDA; }
  std::string name() const override { return fmt::format("cuda-{}", dtype_name(act_)); }
  DType act_dtype() const override { return act_; }
  void synchronize() override { MLA_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

  Tensor empty(DType dtype, Shape shape) override {
    int64_t n = 1;
    for (int64_t d : shape) {
      if (d < 0) fail("cuda: tensor shape {} has a negative dimension", shape_str(shape));
      n *= d;
    }
    void* p = nullptr;
    const size_t bytes = std::max<size_t>(size_t(n) * dtype_size(dtype), 16);
    MLA_CUDA_CHECK(cudaMallocAsync(&p, bytes, stream_));
    if (poison_) MLA_CUDA_CHECK(cudaMemsetAsync(p, 0xff, bytes, stream_));  // NaN in f32, bf16, fp8
    std::shared_ptr<CUstream_st> s = stream_owner_;
    return Tensor(dtype, std::move(shape), Platform::CUDA,
                  std::shared_ptr<void>(p, [s](void* q) { cudaFreeAsync(q, s.get()); }));
  }
  Tensor upload(const Tensor& host) override {
    expect(host.platform() == Platform::CPU, "upload", "source is not a host tensor");
    Tensor t = empty(host.dtype(), host.shape());
    MLA_CUDA_CHECK(cudaMemcpyAsync(t.data(), host.data(), host.nbytes(), cudaMemcpyHostToDevice, stream_));
    return t;
  }
  Tensor download(const Tensor& t) override {
    Tensor h = Tensor::host(t.dtype(), t.shape());
    MLA_CUDA_CHECK(cudaMemcpyAsync(h.data(), t.data(), t.nbytes(), cudaMemcpyDeviceToHost, stream_));
    synchronize();
    return h;
  }
  void fill(Tensor& t, double v) override { cuda::fill(t.data(), elem_of(t.dtype()), size_t(t.numel()), float(v), stream_); }

  void linear(const Tensor& x, const Tensor& w, Tensor& y) override {
    const int64_t K = x.dim(-1), M = rows_of(x), N = w.dim(0);
    expect(w.rank() == 2 && w.dim(1) == K && y.numel() == M * N, "linear",
           fmt::format("{} · {}ᵀ → {}", shape_str(x.shape()), shape_str(w.shape()), shape_str(y.shape())));
    if (M == 0) return;
    Tensor xc = x;
    if (x.dtype() != w.dtype()) {  // e.g. bf16 activations through an f32 router
      xc = empty(w.dtype(), x.shape());
      copy(x, xc);
    }
    const float one = 1.f, zero = 0.f;
    MLA_CUBLAS_CHECK(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(M), int(K), &one, w.data(),
                                  blas_type(w.dtype()), int(K), xc.data(), blas_type(xc.dtype()), int(K), &zero,
                                  y.data(), blas_type(y.dtype()), int(N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }

  void rmsnorm(Tensor& x, int64_t n, const Tensor& w, double eps) override {
    const int64_t ld = x.dim(-1);
    expect(n <= ld && w.numel() == n, "rmsnorm", "weight size");
    cuda::rmsnorm(x.data(), elem_of(x.dtype()), rows_of(x), ld, n, w.data(), elem_of(w.dtype()), float(eps), stream_);
  }

  void rope(Tensor& x, int64_t heads, int64_t head_dim, int64_t rot_offset, const std::vector<int32_t>& positions,
            const RopeFrequencies& f) override {
    const int64_t T = x.numel() / (heads * head_dim), half = int64_t(f.inv_freq.size());
    expect(x.numel() == T * heads * head_dim && rot_offset + 2 * half <= head_dim && int64_t(positions.size()) == T,
           "rope", "shape mismatch");
    if (T == 0) return;
    const int32_t* pos = ints(positions, 0);
    const double* inv = doubles(f.inv_freq);
    cuda::rope(x.data(), elem_of(x.dtype()), T, heads, head_dim, rot_offset, pos, inv, half, f.attention_factor,
               f.interleave, stream_);
  }

  void take_cols(const Tensor& x, int64_t c0, Tensor& out) override {
    expect(out.dtype() == x.dtype() && rows_of(out) == rows_of(x) && c0 + out.dim(-1) <= x.dim(-1), "take_cols", "shape");
    cuda::take_cols(x.data(), elem_of(x.dtype()), rows_of(x), x.dim(-1), c0, out.dim(-1), out.data(), stream_);
  }

  void cache_write(KVPool& pool, int64_t layer, const std::vector<int32_t>& slots, const Tensor& rows) override {
    const int64_t D = pool.config().row_dim;
    expect(rows.dim(-1) == D && rows_of(rows) == int64_t(slots.size()), "cache_write", "rows do not match the slots");
    check_slots(pool, slots, "cache_write");
    Tensor& buf = pool.buffer(layer);
    cuda::cache_write(rows.data(), elem_of(rows.dtype()), buf.data(), elem_of(buf.dtype()), ints(slots, 1),
                      int64_t(slots.size()), D, float(pool.scale(layer)), stream_);
  }
  void cache_read(const KVPool& pool, int64_t layer, const std::vector<int32_t>& slots, Tensor& rows) override {
    const int64_t D = pool.config().row_dim;
    expect(rows.dim(-1) == D && rows_of(rows) == int64_t(slots.size()), "cache_read", "rows do not match the slots");
    check_slots(pool, slots, "cache_read");
    const Tensor& buf = pool.buffer(layer);
    cuda::cache_read(buf.data(), elem_of(buf.dtype()), ints(slots, 1), int64_t(slots.size()), D,
                     float(pool.scale(layer)), rows.data(), elem_of(rows.dtype()), stream_);
  }

  void build_kv(const Tensor& kv, const Tensor& rows, int64_t L, int64_t H, int64_t dn, int64_t dr, int64_t dv,
                Tensor& k, Tensor& v) override {
    const int64_t S = rows_of(rows);
    expect(kv.numel() == S * H * (dn + dv) && k.numel() == S * H * (dn + dr) && v.numel() == S * H * dv, "build_kv", "shape");
    cuda::build_kv(kv.data(), rows.data(), elem_of(rows.dtype()), rows.dim(-1), elem_of(k.dtype()), S, H, L, dn, dr, dv,
                   k.data(), v.data(), stream_);
  }

  void attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttnSegments& seg, double scale, Tensor& o,
                 Tensor& lse) override {
    expect(q.rank() == 3 && k.rank() == 3 && v.rank() == 3 && o.rank() == 3 && lse.dtype() == DType::F32, "attention",
           "tensors must be [rows, H, d] with f32 LSE");
    MhaParams p{q.data(), k.data(), v.data(), elem_of(q.dtype()), segments(seg, q.dim(0), k.dim(0)), int32_t(q.dim(1)),
                int32_t(q.dim(2)), int32_t(v.dim(2)), float(scale), o.data(), lse.ptr<float>(), stream_};
    if (p.elem == Elem::BF16 && mha_fast_supports(p)) mha_attention_fast(p);
    else mha_attention_generic(p);
  }

  void merge(Tensor& o, Tensor& lse, const Tensor& ob, const Tensor& lseb) override {
    const int64_t n = lse.numel(), d = o.dim(-1);
    expect(o.numel() == n * d && ob.numel() == n * d && lseb.numel() == n, "merge", "shape");
    cuda::merge(o.data(), elem_of(o.dtype()), lse.ptr<float>(), ob.data(), lseb.ptr<float>(), n, d, stream_);
  }

  void gather_rows(const Tensor& table, const std::vector<int32_t>& ids, Tensor& out) override {
    const int64_t d = table.dim(-1), n = int64_t(ids.size());
    expect(out.numel() == n * d, "gather_rows", "shape");
    for (int32_t i : ids) expect(i >= 0 && i < rows_of(table), "gather_rows", "row out of range");
    cuda::gather_rows(table.data(), elem_of(table.dtype()), ints(ids, 2), n, d, out.data(), elem_of(out.dtype()), stream_);
  }
  void scatter_add_rows(const Tensor& src, const std::vector<int32_t>& rows, const std::vector<float>& w,
                        Tensor& out) override {
    const int64_t d = out.dim(-1), n = int64_t(rows.size());
    expect(src.numel() == n * d && w.size() == rows.size(), "scatter_add_rows", "shape");
    for (int32_t r : rows) expect(r >= 0 && r < rows_of(out), "scatter_add_rows", "row out of range");
    cuda::scatter_add_rows(src.data(), elem_of(src.dtype()), ints(rows, 3), floats(w), n, d, out.data(),
                           elem_of(out.dtype()), stream_);
  }
  void add(Tensor& x, const Tensor& y) override {
    expect(x.numel() == y.numel(), "add", "shape");
    cuda::add(x.data(), elem_of(x.dtype()), y.data(), elem_of(y.dtype()), size_t(x.numel()), stream_);
  }
  void copy(const Tensor& src, Tensor& dst) override {
    expect(src.numel() == dst.numel(), "copy", "element counts differ");
    if (src.dtype() == dst.dtype())
      MLA_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), src.nbytes(), cudaMemcpyDeviceToDevice, stream_));
    else
      cuda::convert(src.data(), elem_of(src.dtype()), dst.data(), elem_of(dst.dtype()), size_t(src.numel()), stream_);
  }
  void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) override {
    expect(gate.numel() == up.numel() && out.numel() == gate.numel(), "silu_mul", "shape");
    cuda::silu_mul(gate.data(), up.data(), elem_of(gate.dtype()), out.data(), size_t(gate.numel()), stream_);
  }

  // Per head: q_mla[:, h, :L] = q[:, h, :dn] · w_kc[h] (strided batched GEMM), then q_pe copied.
  void absorb_q(const Tensor& q, const Tensor& w_kc, int64_t dn, int64_t dr, Tensor& q_mla) override {
    const int64_t H = w_kc.dim(0), L = w_kc.dim(2), T = q.numel() / (H * (dn + dr));
    expect(w_kc.dim(1) == dn && q_mla.numel() == T * H * (L + dr), "absorb_q", "shape");
    if (T == 0) return;
    const float one = 1.f, zero = 0.f;
    MLA_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        blas_, CUBLAS_OP_N, CUBLAS_OP_N, int(L), int(T), int(dn), &one, w_kc.data(), blas_type(w_kc.dtype()), int(L),
        L * dn, q.data(), blas_type(q.dtype()), int(H * (dn + dr)), dn + dr, &zero, q_mla.data(),
        blas_type(q_mla.dtype()), int(H * (L + dr)), L + dr, int(H), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    cuda::copy_cols(q.data(), elem_of(q.dtype()), dn + dr, dn, q_mla.data(), elem_of(q_mla.dtype()), L + dr, L, T * H, dr,
                    stream_);
  }
  // Per head: o[:, h, :] = o_lat[:, h, :] · w_vc[h]ᵀ
  void absorb_o(const Tensor& o_lat, const Tensor& w_vc, Tensor& o) override {
    const int64_t H = w_vc.dim(0), dv = w_vc.dim(1), L = w_vc.dim(2), T = o_lat.numel() / (H * L);
    expect(o.numel() == T * H * dv, "absorb_o", "shape");
    if (T == 0) return;
    const float one = 1.f, zero = 0.f;
    MLA_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        blas_, CUBLAS_OP_T, CUBLAS_OP_N, int(dv), int(T), int(L), &one, w_vc.data(), blas_type(w_vc.dtype()), int(L),
        dv * L, o_lat.data(), blas_type(o_lat.dtype()), int(H * L), L, &zero, o.data(), blas_type(o.dtype()),
        int(H * dv), dv, int(H), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }

  void mla_attention(const Tensor& q, const KVPool& pool, int64_t layer, const std::vector<int32_t>& kv_slots,
                     const AttnSegments& seg, int64_t L, double scale, Tensor& o, Tensor& lse) override {
    const int64_t D = pool.config().row_dim;
    expect(q.rank() == 3 && q.dim(2) == D && o.dim(2) == L && lse.dtype() == DType::F32, "mla_attention", "shape");
    check_slots(pool, kv_slots, "mla_attention");
    const Tensor& buf = pool.buffer(layer);
    MlaParams p{q.data(), elem_of(q.dtype()), buf.data(), elem_of(buf.dtype()), float(pool.scale(layer)),
                ints(kv_slots, 1), segments(seg, q.dim(0), int64_t(kv_slots.size())), int32_t(q.dim(1)), int32_t(D),
                int32_t(L), float(scale), o.data(), elem_of(o.dtype()), lse.ptr<float>(), {}, stream_};
    if (p.q_elem == Elem::BF16 && mla_fast_supports(p)) {
      p.ws = workspace(mla_fast_workspace_bytes(p.seg.total_q, p.num_heads, num_sms_));
      mla_attention_fast(p);
    } else {
      mla_attention_generic(p);
    }
  }

 private:
  DType act_;
  std::shared_ptr<CUstream_st> stream_owner_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  int num_sms_ = 132;
  bool poison_ = false;
  // Small host arrays go to reusable device buffers, one per role, in stream order.
  std::map<int, Tensor> scratch_;

  void* stage(const void* data, size_t bytes, int slot) {
    Tensor& t = scratch_[slot];
    if (!t.defined() || t.nbytes() < bytes) t = empty(DType::I32, {int64_t(std::max<size_t>(bytes, 64) / 4 * 2)});
    if (bytes) MLA_CUDA_CHECK(cudaMemcpyAsync(t.data(), data, bytes, cudaMemcpyHostToDevice, stream_));
    return t.data();
  }
  const int32_t* ints(const std::vector<int32_t>& v, int slot) {
    return static_cast<const int32_t*>(stage(v.data(), v.size() * 4, slot));
  }
  const double* doubles(const std::vector<double>& v) { return static_cast<const double*>(stage(v.data(), v.size() * 8, 9)); }
  const float* floats(const std::vector<float>& v) { return static_cast<const float*>(stage(v.data(), v.size() * 4, 8)); }
  Workspace workspace(size_t bytes) {
    Tensor& t = scratch_[20];
    if (!t.defined() || t.nbytes() < bytes) t = empty(DType::F32, {int64_t((bytes + 3) / 4 + 16)});
    return {t.data(), t.nbytes()};
  }
  DeviceSegments segments(const AttnSegments& seg, int64_t nq, int64_t nk) {
    const size_t n = seg.q_len.size();
    expect(seg.q_start.size() == n && seg.k_start.size() == n && seg.k_len.size() == n, "attention", "segment arrays differ");
    std::vector<int32_t> all(4 * n);
    int32_t max_q = 0, max_k = 0, total_q = 0;
    for (size_t r = 0; r < n; ++r) {
      expect(seg.q_start[r] >= 0 && seg.q_len[r] >= 0 && seg.q_start[r] + seg.q_len[r] <= nq && seg.k_start[r] >= 0 &&
                 seg.k_len[r] >= 0 && seg.k_start[r] + seg.k_len[r] <= nk,
             "attention", fmt::format("segment {} is outside {} queries / {} keys", r, nq, nk));
      all[r] = int32_t(seg.q_start[r]), all[n + r] = int32_t(seg.q_len[r]);
      all[2 * n + r] = int32_t(seg.k_start[r]), all[3 * n + r] = int32_t(seg.k_len[r]);
      max_q = std::max(max_q, int32_t(seg.q_len[r])), max_k = std::max(max_k, int32_t(seg.k_len[r]));
      total_q += int32_t(seg.q_len[r]);
    }
    const int32_t* d = ints(all, 4);
    return {d, d + n, d + 2 * n, d + 3 * n, int32_t(n), max_q, max_k, total_q, seg.causal};
  }
  static void check_slots(const KVPool& pool, const std::vector<int32_t>& slots, const char* op) {
    for (int32_t s : slots)
      if (s < 0 || s >= pool.num_slots()) fail("cuda {}: slot {} is outside the pool of {} slots", op, s, pool.num_slots());
  }
};

}  // namespace

std::unique_ptr<Ops> make_cuda_ops(DType act) {
  if (act != DType::F32 && act != DType::BF16)
    fail("cuda ops: no flavour stores activations as {} (f32, bf16)", dtype_name(act));
  return std::make_unique<CudaOps>(act);
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

}  // namespace cuda
}  // namespace mla
