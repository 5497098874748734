// The GPU platforms' shared Ops (CUDA and ROCm, one source through the runtime shim): device
// memory on one stream, the small kernels of elementwise.cu, the cache ops and the general
// attention kernels. A platform derives from it and adds its GEMMs (cuBLAS on CUDA, our own
// kernels on ROCm) and its faster kernels where they apply.
#pragma once
#include <algorithm>
#include <array>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mla/error.h"
#include "mla/ops.h"
#include "platform/gpu/attention_kernels.h"
#include "platform/gpu/elementwise.h"
#include "platform/gpu/latent.h"
#include "platform/gpu/gpu_check.h"
#include "platform/gpu/moe.h"
#include "platform/gpu/sampling.h"

namespace mla::gpu {

Elem elem_of(DType t);  // f32, bf16, fp8 e4m3fn / e4m3fnuz; throws Error naming anything else
inline int64_t rows_of(const Tensor& t) { return t.dim(-1) == 0 ? 0 : t.numel() / t.dim(-1); }
void expect(bool ok, const char* op, const std::string& what);  // throws "<platform> <op>: what"

class GpuOps : public Ops {
 public:
  // `platform` tags the tensors (Platform::CUDA or Platform::ROCM); throws Error without a device.
  GpuOps(Platform platform, DType act);
  ~GpuOps() override;

  Platform platform() const override { return platform_; }
  DType act_dtype() const override { return act_; }
  void synchronize() override;
  cudaStream_t stream() const { return stream_; }

  // The step's device plan (gpu_ops.cpp): one pinned host buffer (two, alternating, so that a
  // step never waits for the previous step's copy), one device buffer, one copy per step.
  void begin_step(const BatchPlan& plan, const KVPool& pool,
                  std::initializer_list<const std::vector<int32_t>*> extra) override;
  void end_step() noexcept override;
  bool step_checked(const BatchPlan& plan, const KVPool& pool) const override {
    return step_open_ && &plan == step_plan_ && &pool == step_pool_ && pool.num_slots() == step_pool_slots_;
  }
  StepCounters step_counters() const override { return step_open_ ? total_ - step_start_ : last_step_; }
  StepCounters counters() const override { return total_; }
  int num_sms() const { return num_sms_; }
  // Side lanes on a second stream, where the platform enables them (side_lanes_); else in order.
  void side_begin() override;
  void side_end() override;
  void side_join() override;

  // The timeline by events in the stream (a recorded graph holds its own).
  void mark(const char* label) override;
  std::vector<std::pair<std::string, double>> timeline() override;

  Tensor empty(DType dtype, Shape shape) override {
    int64_t n = 1;
    for (int64_t d : shape) {
      if (d < 0) fail("{}: tensor shape {} has a negative dimension", platform_name(platform_), shape_str(shape));
      n *= d;
    }
    void* p = nullptr;
    const size_t bytes = std::max<size_t>(size_t(n) * dtype_size(dtype), 16);
    MLA_GPU_CHECK(cudaMallocAsync(&p, bytes, stream_));
    // NaN in f32, bf16, e4m3fn (0xff) and e4m3fnuz (0x80)
    if (poison_) MLA_GPU_CHECK(cudaMemsetAsync(p, dtype == DType::F8_E4M3FNUZ ? 0x80 : 0xff, bytes, stream_));
    std::shared_ptr<StreamObject> s = stream_owner_;
    Tensor t(dtype, std::move(shape), platform_,
             std::shared_ptr<void>(p, [s](void* q) { (void)cudaFreeAsync(q, s.get()); }));
    // Made in a side lane: freed (on the main stream) only after the join.
    if (side_state_ == SideState::InLane && side_lanes_) side_keep_.push_back(t);
    return t;
  }
  Tensor upload(const Tensor& host) override {
    expect(host.platform() == Platform::CPU, "upload", "source is not a host tensor");
    refuse_in_capture("an upload");
    Tensor t = empty(host.dtype(), host.shape());
    MLA_GPU_CHECK(cudaMemcpyAsync(t.data(), host.data(), host.nbytes(), cudaMemcpyHostToDevice, stream_));
    ++total_.h2d_copies, ++total_.host_syncs;  // from pageable memory
    return t;
  }
  Tensor download(const Tensor& t) override {
    refuse_in_capture("download");
    Tensor h = Tensor::host(t.dtype(), t.shape());
    MLA_GPU_CHECK(cudaMemcpyAsync(h.data(), t.data(), t.nbytes(), cudaMemcpyDeviceToHost, stream_));
    ++total_.d2h_copies;
    synchronize();
    return h;
  }
  void fill(Tensor& t, double v) override { gpu::fill(t.data(), elem_of(t.dtype()), size_t(t.numel()), float(v), stream_); }
  void fill_random(Tensor& t, uint64_t seed, double std) override {
    gpu::fill_random(t.data(), elem_of(t.dtype()), size_t(t.numel()), seed, float(std), stream_);
  }
  std::unique_ptr<HostCopy> download_later(const Tensor& t) override;  // page-locked, an event
  bool step_plan_on_device() const override { return true; }
  void step_rows_from(const std::vector<int32_t>& v, const Tensor& src, const std::vector<int32_t>& from) override;
  std::shared_ptr<void> alloc_staging(size_t bytes) override;                                  // pinned
  void upload_async(const void* host, Tensor& dst, size_t offset, size_t n, int slot) override;  // + event
  void wait_upload(int slot) override;
  void rmsnorm(Tensor& x, int64_t n, const Tensor& w, double eps) override {
    const int64_t ld = x.dim(-1);
    expect(n <= ld && w.numel() == n, "rmsnorm", "weight size");
    gpu::rmsnorm(x.data(), elem_of(x.dtype()), rows_of(x), ld, n, w.data(), elem_of(w.dtype()), float(eps), stream_);
  }

  void add_rmsnorm(Tensor& h, const Tensor& y, Tensor& x, const Tensor& w, double eps) override {
    const int64_t n = h.dim(-1);
    expect(y.numel() == h.numel() && x.numel() == h.numel() && x.dtype() == h.dtype() && w.numel() == n, "add_rmsnorm",
           "shape or dtype");
    gpu::add_rmsnorm(h.data(), elem_of(h.dtype()), y.data(), elem_of(y.dtype()), x.data(), rows_of(h), n, w.data(),
                     elem_of(w.dtype()), float(eps), stream_);
  }

  void rope(Tensor& x, int64_t heads, int64_t head_dim, int64_t rot_offset, const std::vector<int32_t>& positions,
            const RopeFrequencies& f) override {
    const int64_t T = x.numel() / (heads * head_dim), half = int64_t(f.inv_freq.size());
    expect(x.numel() == T * heads * head_dim && rot_offset + 2 * half <= head_dim && int64_t(positions.size()) == T,
           "rope", "shape mismatch");
    if (T == 0) return;
    const int32_t* pos = ints(positions, 0);
    const double* inv = doubles(f.inv_freq);
    gpu::rope(x.data(), elem_of(x.dtype()), T, heads, head_dim, rot_offset, pos, inv, half, f.attention_factor,
               f.interleave, stream_);
  }

  void copy_cols(const Tensor& src, int64_t s0, Tensor& dst, int64_t d0, int64_t n) override {
    const int64_t sld = src.dim(-1), dld = dst.dim(-1);
    expect(dst.dtype() == src.dtype() && rows_of(dst) == rows_of(src) && s0 >= 0 && d0 >= 0 && n >= 0 &&
               s0 + n <= sld && d0 + n <= dld,
           "copy_cols", "shape");
    const gpu::Elem e = elem_of(src.dtype());
    gpu::copy_cols(src.data(), e, sld, s0, dst.data(), e, dld, d0, rows_of(src), n, stream_);
  }

  void cache_write(KVPool& pool, int64_t layer, const std::vector<int32_t>& slots, const Tensor& rows) override {
    const int64_t D = pool.config().row_dim;
    expect(rows.dim(-1) == D && rows_of(rows) == int64_t(slots.size()), "cache_write", "rows do not match the slots");
    check_slots(pool, slots, "cache_write");
    Tensor& buf = pool.buffer(layer);
    gpu::cache_write(rows.data(), elem_of(rows.dtype()), buf.data(), elem_of(buf.dtype()), ints(slots, 1),
                      int64_t(slots.size()), D, float(pool.scale(layer)), stream_);
  }
  void finish_latent(Tensor& q, int64_t heads, int64_t q_rot, Tensor& kva, int64_t kv_lora_rank, const Tensor& w,
                     double eps, const std::vector<int32_t>& positions, const RopeFrequencies& f, KVPool& pool,
                     int64_t layer, const std::vector<int32_t>& slots) override {
    const int64_t T = rows_of(kva), D = pool.config().row_dim, hd = heads > 0 ? q.dim(-1) : 0,
                  half = int64_t(f.inv_freq.size());
    if (!gpu::latent_finish_fits(half))
      return Ops::finish_latent(q, heads, q_rot, kva, kv_lora_rank, w, eps, positions, f, pool, layer, slots);
    expect(kva.dim(-1) == D && heads >= 0 && (heads == 0 || (q.numel() == T * heads * hd && q_rot + 2 * half <= hd)) &&
               int64_t(positions.size()) == T && int64_t(slots.size()) == T && kv_lora_rank + 2 * half <= D &&
               w.numel() == kv_lora_rank,
           "finish_latent", "shape mismatch");
    check_slots(pool, slots, "finish_latent");
    if (T == 0) return;
    Tensor& buf = pool.buffer(layer);
    gpu::LatentFinishParams p{};
    p.q = heads > 0 ? q.data() : nullptr, p.q_elem = elem_of(heads > 0 ? q.dtype() : kva.dtype()), p.heads = heads,
    p.q_head_dim = hd, p.q_rot = q_rot;
    p.kva = kva.data(), p.kva_elem = elem_of(kva.dtype()), p.row_dim = D, p.lora = kv_lora_rank;
    p.norm_w = w.data(), p.norm_elem = elem_of(w.dtype()), p.eps = float(eps);
    p.norm_vec = gpu::norm_rows_vectorized(kva.data(), p.kva_elem, D, kv_lora_rank);
    p.positions = ints(positions, 0), p.inv_freq = doubles(f.inv_freq), p.half = half;
    p.af = f.attention_factor, p.interleave = f.interleave;
    p.pool = buf.data(), p.pool_elem = elem_of(buf.dtype()), p.slots = ints(slots, 1);
    p.inv_scale = 1.f / float(pool.scale(layer)), p.T = T;
    gpu::latent_finish(p, stream_);
  }
  void cache_read(const KVPool& pool, int64_t layer, const std::vector<int32_t>& slots, Tensor& rows) override {
    const int64_t D = pool.config().row_dim;
    expect(rows.dim(-1) == D && rows_of(rows) == int64_t(slots.size()), "cache_read", "rows do not match the slots");
    check_slots(pool, slots, "cache_read");
    const Tensor& buf = pool.buffer(layer);
    gpu::cache_read(buf.data(), elem_of(buf.dtype()), ints(slots, 1), int64_t(slots.size()), D,
                     float(pool.scale(layer)), rows.data(), elem_of(rows.dtype()), stream_);
  }

  void build_kv(const Tensor& kv, const Tensor& rows, int64_t L, int64_t H, int64_t dn, int64_t dr, int64_t dv,
                Tensor& k, Tensor& v) override {
    const int64_t S = rows_of(rows);
    expect(kv.numel() == S * H * (dn + dv) && k.numel() == S * H * (dn + dr) && v.numel() == S * H * dv, "build_kv", "shape");
    gpu::build_kv(kv.data(), rows.data(), elem_of(rows.dtype()), rows.dim(-1), elem_of(k.dtype()), S, H, L, dn, dr, dv,
                   k.data(), v.data(), stream_);
  }

  void merge(Tensor& o, Tensor& lse, const Tensor& ob, const Tensor& lseb) override {
    const int64_t n = lse.numel(), d = o.dim(-1);
    expect(o.numel() == n * d && ob.numel() == n * d && lseb.numel() == n, "merge", "shape");
    gpu::merge(o.data(), elem_of(o.dtype()), lse.ptr<float>(), ob.data(), lseb.ptr<float>(), n, d, stream_);
  }

  void gather_rows(const Tensor& table, const std::vector<int32_t>& ids, Tensor& out) override {
    const int64_t d = table.dim(-1), n = int64_t(ids.size());
    expect(out.numel() == n * d, "gather_rows", "shape");
    for (int32_t i : ids) expect(i >= 0 && i < rows_of(table), "gather_rows", "row out of range");
    gpu::gather_rows(table.data(), elem_of(table.dtype()), ints(ids, 2), n, d, out.data(), elem_of(out.dtype()), stream_);
  }
  void scatter_add_rows(const Tensor& src, const std::vector<int32_t>& rows, const std::vector<float>& w,
                        Tensor& out) override {
    const int64_t d = out.dim(-1), n = int64_t(rows.size());
    expect(src.numel() == n * d && w.size() == rows.size(), "scatter_add_rows", "shape");
    for (int32_t r : rows) expect(r >= 0 && r < rows_of(out), "scatter_add_rows", "row out of range");
    gpu::scatter_add_rows(src.data(), elem_of(src.dtype()), ints(rows, 3), floats(w), n, d, out.data(),
                           elem_of(out.dtype()), stream_);
  }
  void add(Tensor& x, const Tensor& y) override {
    expect(x.numel() == y.numel(), "add", "shape");
    gpu::add(x.data(), elem_of(x.dtype()), y.data(), elem_of(y.dtype()), size_t(x.numel()), stream_);
  }
  void copy(const Tensor& src, Tensor& dst) override {
    expect(src.numel() == dst.numel(), "copy", "element counts differ");
    if (src.dtype() == dst.dtype())
      MLA_GPU_CHECK(cudaMemcpyAsync(dst.data(), src.data(), src.nbytes(), cudaMemcpyDeviceToDevice, stream_));
    else
      gpu::convert(src.data(), elem_of(src.dtype()), dst.data(), elem_of(dst.dtype()), size_t(src.numel()), stream_);
  }
  void argmax_rows(const Tensor& x, Tensor& out) override {
    expect(x.dtype() == DType::F32 && out.dtype() == DType::I32 && out.numel() == rows_of(x), "argmax_rows",
           "x must be f32 [R, V] and out i32 [R]");
    gpu::argmax_rows(x.ptr<float>(), rows_of(x), x.dim(-1), out.ptr<int32_t>(), stream_);
  }
  // sampling.cu; the rows' parameters go up in one small copy.
  void sample_rows(const Tensor& x, const std::vector<SampleRow>& rows, Tensor& out) override {
    const int64_t R = rows_of(x), V = x.dim(-1);
    expect(x.dtype() == DType::F32 && out.dtype() == DType::I32 && out.numel() == R && int64_t(rows.size()) == R &&
               (R == 0 || (V > 0 && V < (int64_t(1) << 31))),
           "sample_rows", "x must be f32 [R, V] with 0 < V < 2^31, rows R entries and out i32 [R]");
    for (const SampleRow& p : rows) check_sample_row(p);
    if (R == 0) return;
    std::vector<double> p(size_t(R) * kSampleParams);
    for (int64_t r = 0; r < R; ++r) {
      const SampleRow& s = rows[size_t(r)];
      double* q = &p[size_t(r) * kSampleParams];
      q[0] = s.temperature, q[1] = s.top_p, q[2] = s.min_p, q[3] = s.u;
      q[4] = double(std::min<int64_t>(s.top_k, int64_t(1) << 40));  // exact in a double; past any V
    }
    gpu::sample_rows(x.ptr<float>(), R, V, static_cast<const double*>(stage(p.data(), p.size() * 8, 11)),
                     out.ptr<int32_t>(), stream_);
  }
  void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) override {
    expect(gate.numel() == up.numel() && out.numel() == gate.numel(), "silu_mul", "shape");
    gpu::silu_mul(gate.data(), up.data(), elem_of(gate.dtype()), out.data(), size_t(gate.numel()), stream_);
  }

  void moe_route(const Tensor& router_logits, const Tensor& bias, const MoeRouting& r, Tensor& expert,
                 Tensor& weight) override;
  // Decode-sized batches (gpu::kMoeRouterTokens at most) in one launch; up to gpu::kMoeLogitsTokens the
  // logits kernel (the same bits per row) + moe_route; larger ones as linear + moe_route.
  void moe_router(const Tensor& x, const Tensor& router, const Tensor& bias, const MoeRouting& r, Tensor& router_logits,
                  Tensor& expert, Tensor& weight) override;
  // Both through moe_run; with moe_experts_add the lane joins before the combine, which adds `add`.
  void moe_experts(const Tensor& x, const Tensor& expert, const Tensor& weight, const Tensor& gate, const Tensor& up,
                   const Tensor& down, Tensor& out) override {
    moe_run(x, expert, weight, gate, up, down, nullptr, nullptr, out);
  }
  void moe_experts_add(const Tensor& x, const Tensor& expert, const Tensor& weight, const Tensor& gate, const Tensor& up,
                       const Tensor& down, SideLane& lane, const Tensor& add, Tensor& out) override {
    check_moe_add(add, out);
    moe_run(x, expert, weight, gate, up, down, &lane, &add, out);
  }

  // Per head: q_mla[:, h, :L] = q[:, h, :dn] · w_kc[h] (strided batched GEMM), then q_pe copied.
  void attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttnSegments& seg, double scale, Tensor& o,
                 Tensor& lse) override {
    MhaParams p = mha_params(q, k, v, seg, scale, o, lse);
    mha_attention_generic(p);
  }
  void mla_attention(const Tensor& q, const KVPool& pool, int64_t layer, const std::vector<int32_t>& kv_slots,
                     const AttnSegments& seg, int64_t L, double scale, Tensor& o, Tensor& lse) override {
    MlaParams p = mla_params(q, pool, layer, kv_slots, seg, L, scale, o, lse);
    mla_attention_generic(p);
  }

 protected:
  cudaStream_t main_stream_ = nullptr, side_stream_ = nullptr;  // stream_ is one of them
  bool side_lanes_ = false;  // a platform turns them on (CudaOps): its calls must then follow stream()

  // y[M, N] = x[M, K] · w[N, K]ᵀ: checks the shapes and returns x in w's dtype (converted when they
  // differ, e.g. bf16 activations through an f32 router), or an undefined tensor when M == 0.
  Tensor linear_input(const Tensor& x, const Tensor& w, const Tensor& y) {
    const int64_t K = x.dim(-1), M = rows_of(x), N = w.dim(0);
    expect(w.rank() == 2 && w.dim(1) == K && y.numel() == M * N, "linear",
           fmt::format("{} · {}ᵀ → {}", shape_str(x.shape()), shape_str(w.shape()), shape_str(y.shape())));
    if (M == 0) return Tensor();
    if (x.dtype() == w.dtype()) return x;
    Tensor xc = empty(w.dtype(), x.shape());
    copy(x, xc);
    return xc;
  }

  // Small host arrays go to reusable device buffers, one per role (slot), in stream order.
  void* stage(const void* data, size_t bytes, int slot) {
    refuse_in_capture("a copy of host memory");
    Tensor& t = scratch_[slot];
    if (!t.defined() || t.nbytes() < bytes) t = empty(DType::I32, {int64_t(std::max<size_t>(bytes, 64) / 4 * 2)});
    if (bytes) {
      MLA_GPU_CHECK(cudaMemcpyAsync(t.data(), data, bytes, cudaMemcpyHostToDevice, stream_));
      ++total_.h2d_copies, ++total_.host_syncs;  // from pageable memory
    }
    return t.data();
  }
  // A vector of the open step's plan resolves to its device copy; anything else is staged.
  const int32_t* ints(const std::vector<int32_t>& v, int slot) {
    if (const int32_t* d = step_ints(v)) return d;
    return static_cast<const int32_t*>(stage(v.data(), v.size() * 4, slot));
  }
  const int32_t* step_ints(const std::vector<int32_t>& v) const {
    if (step_open_)
      for (const StepArray& a : step_arrays_)
        if (a.vec == &v && a.data == v.data() && a.size == v.size()) return step_dev_ptr() + a.offset;
    return nullptr;
  }
  // Constant tables (RoPE inverse frequencies): uploaded once per distinct content, then reused.
  const double* doubles(const std::vector<double>& v);
  const float* floats(const std::vector<float>& v) { return static_cast<const float*>(stage(v.data(), v.size() * 4, 8)); }
  Workspace workspace(size_t bytes) {
    Tensor& t = scratch_[20];
    if (!t.defined() || t.nbytes() < bytes) {
      refuse_in_capture("a larger workspace");
      t = empty(DType::F32, {int64_t((bytes + 3) / 4 + 16)});
    }
    // The graph being recorded holds it, even if a larger one replaces it later.
    if (capturing_ && (capture_keep_.empty() || capture_keep_.back().data() != t.data())) capture_keep_.push_back(t);
    return {t.data(), t.nbytes()};
  }
  // moe_experts (with moe_experts_add's lane and added rows when given). The portable path: plan, the
  // grouped GEMMs of moe.cu, the lane's join, combine; a platform may take the shapes it runs faster.
  virtual void moe_run(const Tensor& x, const Tensor& expert, const Tensor& weight, const Tensor& gate, const Tensor& up,
                       const Tensor& down, SideLane* lane, const Tensor* add, Tensor& out);
  // The checked sizes of moe_experts: T tokens, K slots each, E experts of width I.
  struct MoeShape {
    int64_t T = 0, K = 0, E = 0, I = 0, hidden = 0;
  };
  MoeShape moe_shape(const Tensor& x, const Tensor& expert, const Tensor& weight, const Tensor& gate, const Tensor& up,
                     const Tensor& down, const Tensor& out);
  // A plan for T·K slots in tiles of bm rows, on a fresh device buffer (kept alive by `keep`).
  MoePlan moe_plan(const Tensor& expert, const MoeShape& m, int bm, Tensor& keep);
  // moe_route's checks and its kernel parameters (logits as given).
  MoeRouteParams route_params(const Tensor& router_logits, const Tensor& bias, const MoeRouting& r, Tensor& expert,
                              Tensor& weight);
  unsigned* router_done_ = nullptr;  // [2 lanes][kMoeRouterTokens] zero counters of moe_router
  DeviceSegments segments(const AttnSegments& seg, int64_t nq, int64_t nk) {
    const size_t n = seg.q_len.size();
    if (const StepSegments* s = step_segments(seg)) {  // checked in begin_step but for nq / nk
      expect(s->q_end <= nq && s->k_end <= nk, "attention",
             fmt::format("a segment ends at query {} / key {}, outside {} queries / {} keys", s->q_end, s->k_end, nq, nk));
      DeviceSegments d = s->dev;
      const int32_t* base = step_dev_ptr() + s->offset;
      d.q_start = base, d.q_len = base + n, d.k_start = base + 2 * n, d.k_len = base + 3 * n;
      return d;
    }
    expect(seg.q_start.size() == n && seg.k_start.size() == n && seg.k_len.size() == n, "attention", "segment arrays differ");
    std::vector<int32_t> all(4 * n);
    int32_t max_q = 0, max_k = 0, total_q = 0;
    int64_t keys = 0;
    for (size_t r = 0; r < n; ++r) {
      expect(seg.q_start[r] >= 0 && seg.q_len[r] >= 0 && seg.q_start[r] + seg.q_len[r] <= nq && seg.k_start[r] >= 0 &&
                 seg.k_len[r] >= 0 && seg.k_start[r] + seg.k_len[r] <= nk,
             "attention", fmt::format("segment {} is outside {} queries / {} keys", r, nq, nk));
      all[r] = int32_t(seg.q_start[r]), all[n + r] = int32_t(seg.q_len[r]);
      all[2 * n + r] = int32_t(seg.k_start[r]), all[3 * n + r] = int32_t(seg.k_len[r]);
      max_q = std::max(max_q, int32_t(seg.q_len[r])), max_k = std::max(max_k, int32_t(seg.k_len[r]));
      total_q += int32_t(seg.q_len[r]), keys += seg.k_len[r];
    }
    const int32_t* d = ints(all, 4);
    return {d, d + n, d + 2 * n, d + 3 * n, int32_t(n), max_q, max_k, total_q, seg.causal, kv_fill(keys, int64_t(n), max_k)};
  }
  // Slots of the open step's plan were checked against its pool in begin_step.
  void check_slots(const KVPool& pool, const std::vector<int32_t>& slots, const char* op) const {
    if (step_ints(slots) && &pool == step_pool_ && pool.num_slots() == step_pool_slots_) return;
    for (int32_t s : slots)
      if (s < 0 || s >= pool.num_slots()) fail("gpu {}: slot {} is outside the pool of {} slots", op, s, pool.num_slots());
  }
  // The checked kernel parameters of attention() and mla_attention(); derived platforms pick the kernel.
  MhaParams mha_params(const Tensor& q, const Tensor& k, const Tensor& v, const AttnSegments& seg, double scale,
                       Tensor& o, Tensor& lse) {
    expect(q.rank() == 3 && k.rank() == 3 && v.rank() == 3 && o.rank() == 3 && lse.dtype() == DType::F32, "attention",
           "tensors must be [rows, H, d] with f32 LSE");
    return MhaParams{q.data(), k.data(), v.data(), elem_of(q.dtype()), segments(seg, q.dim(0), k.dim(0)),
                     int32_t(q.dim(1)), int32_t(q.dim(2)), int32_t(v.dim(2)), float(scale), o.data(), lse.ptr<float>(),
                     stream_};
  }
  MlaParams mla_params(const Tensor& q, const KVPool& pool, int64_t layer, const std::vector<int32_t>& kv_slots,
                       const AttnSegments& seg, int64_t L, double scale, Tensor& o, Tensor& lse) {
    const int64_t D = pool.config().row_dim;
    expect(q.rank() == 3 && q.dim(2) == D && o.dim(2) == L && lse.dtype() == DType::F32, "mla_attention", "shape");
    check_slots(pool, kv_slots, "mla_attention");
    const Tensor& buf = pool.buffer(layer);
    return MlaParams{q.data(), elem_of(q.dtype()), buf.data(), elem_of(buf.dtype()), float(pool.scale(layer)),
                     ints(kv_slots, 1), segments(seg, q.dim(0), int64_t(kv_slots.size())), int32_t(q.dim(1)),
                     int32_t(D), int32_t(L), float(scale), o.data(), elem_of(o.dtype()), lse.ptr<float>(), {}, stream_};
  }

  // The open step: its number (each begin_step counts one), and whether `seg` is one of its plan's
  // segment sets (per-step launch choices may then be kept for the step).
  bool step_open() const { return step_open_; }
  uint64_t step_id() const { return step_id_; }
  bool is_step_segments(const AttnSegments& seg) const { return step_segments(seg) != nullptr; }
  void count_decode_schedule() { ++total_.decode_schedules; }

  // Step graphs (a platform with a graph runtime builds on these): while capturing, calls that
  // cannot be recorded throw; the layout of the open step's device plan (the sizes of its arrays and
  // segment sets, and its address) tells whether a recorded graph fits a later step.
  bool capturing() const { return capturing_; }
  void set_capturing(bool on) {
    capturing_ = on;
    if (on) capture_keep_.clear();
  }
  std::vector<Tensor> take_capture_keep() { return std::move(capture_keep_); }
  // The marks of a graph being recorded (its own events, which the graph then owns), and the marks
  // a replay brings back as the step's.
  using Marks = std::vector<std::pair<const char*, cudaEvent_t>>;
  Marks take_capture_marks() { return std::move(capture_marks_); }
  void set_step_marks(const Marks& m) { ev_marks_ = m; }
  void refuse_in_capture(const char* what) const {
    if (capturing_) fail("{}: {} cannot be recorded in a step graph", platform_name(platform_), what);
  }
  std::vector<size_t> step_layout() const;  // empty when no step is open
  void count_graph(bool capture) { ++(capture ? total_.graph_captures : total_.graph_replays); }

 private:
  struct StepArray {   // a vector of the plan, at `offset` ints into the device plan
    const void* vec;
    const void* data;
    size_t size, offset;
  };
  struct StepSegments {  // a segment set of the plan: 4·n ints at `offset`, host fields in dev
    const AttnSegments* seg = nullptr;
    size_t n = 0, offset = 0;
    int64_t q_end = 0, k_end = 0;  // max over requests of q_start + q_len, k_start + k_len
    DeviceSegments dev{};
  };
  const StepSegments* step_segments(const AttnSegments& seg) const {
    if (step_open_)
      for (const StepSegments& s : step_segs_)
        if (s.seg == &seg && s.n == seg.q_len.size()) return &s;
    return nullptr;
  }
  const int32_t* step_dev_ptr() const { return static_cast<const int32_t*>(step_dev_.data()); }

  Platform platform_;
  DType act_;
  std::shared_ptr<StreamObject> stream_owner_;
  cudaStream_t stream_ = nullptr;  // the current lane's stream: main_stream_ but in a side lane
  enum class SideState { None, InLane, Open } side_state_ = SideState::None;
  cudaEvent_t side_fork_ = nullptr, side_done_ = nullptr;
  std::vector<Tensor> side_keep_;  // tensors made in the side lane, kept to the join
  int num_sms_ = 0;
  bool poison_ = false;
  std::map<int, Tensor> scratch_;
  std::vector<std::pair<std::vector<double>, Tensor>> tables_;  // doubles(): content → device copy

  bool capturing_ = false;
  std::vector<Tensor> capture_keep_;  // persistent buffers a graph being recorded uses
  Marks capture_marks_;               // events recorded into the graph being recorded
  Marks ev_marks_;                    // the last step's marks (timeline)
  std::vector<cudaEvent_t> mark_events_;  // reused by op-by-op steps
  size_t next_mark_event_ = 0;
  bool step_open_ = false;
  uint64_t step_id_ = 0;
  const BatchPlan* step_plan_ = nullptr;
  const KVPool* step_pool_ = nullptr;
  int64_t step_pool_slots_ = 0;
  std::vector<StepArray> step_arrays_;
  // download_later's page-locked buffers not in use, each with the event after its last copy.
  struct PinnedCopy {
    void* ptr = nullptr;
    size_t bytes = 0;
    cudaEvent_t done = nullptr;
  };
  class PendingCopy;
  std::vector<PinnedCopy> copies_free_;
  StepSegments step_segs_[2];
  int32_t* pinned_[2] = {nullptr, nullptr};  // cudaMallocHost, alternating between steps
  // Outgrown pinned buffers, freed with the Ops (cudaFreeHost waits for the device; each growth is
  // 1.5×, so together they hold less than twice the current ones).
  std::vector<int32_t*> pinned_retired_;
  size_t pinned_ints_[2] = {0, 0};
  cudaEvent_t pinned_copied_[2] = {nullptr, nullptr};  // the copy out of pinned_[i] finished
  int pinned_turn_ = 0;
  Tensor step_dev_;  // [capacity] I32: the device plan; its address changes only when it grows
  StepCounters total_, step_start_, last_step_;
  std::array<cudaEvent_t, kUploadSlots> upload_events_{};  // the last copy of each upload slot
};

int device_count();  // 0 when the runtime finds no device

}  // namespace mla::gpu
