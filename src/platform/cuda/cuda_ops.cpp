// The CUDA platform's Ops: the shared GPU ops (platform/gpu) plus cuBLAS GEMMs (f32 with TF32 off,
// or bf16 with f32 accumulation; our own for bf16 decode batches of up to 16 rows, linear_small.cu)
// and the tensor-core attention kernels (mha_prefill.cu, mla_decode.cu) for bf16 at the shapes they
// support; the general kernels otherwise, chosen by dtype and shape alone.
#include <cublas_v2.h>

#include "mla/error.h"
#include "mla/platform_ops.h"
#include "platform/cuda/absorb.h"
#include "platform/cuda/activity.h"
#include "platform/cuda/cuda_check.h"
#include "platform/cuda/linear_small.h"
#include "platform/cuda/mha_prefill.h"
#include "platform/cuda/mla_decode.h"
#include "platform/cuda/moe_gemm.h"
#include "platform/gpu/gpu_ops.h"
#include "platform/registry.h"

namespace mla {
namespace cuda {
namespace {

using namespace gpu;

cudaDataType_t blas_type(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::BF16: return CUDA_R_16BF;
    default: fail("cuda gemm: dtype {} is not supported", dtype_name(t));
  }
}

class CudaOps final : public GpuOps {
 public:
  explicit CudaOps(DType act) : GpuOps(Platform::CUDA, act) {
    // One cuBLAS handle per lane (Ops::side_begin): a side lane's GEMMs use their own workspace.
    for (int lane = 0; lane < 2; ++lane) {
      cublasHandle_t& h = blas_[lane];
      MLA_CUBLAS_CHECK(cublasCreate(&h));
      MLA_CUBLAS_CHECK(cublasSetStream(h, lane == 0 ? main_stream_ : side_stream_));
      // f32 GEMMs stay exact: no TF32 (CUBLAS_DEFAULT_MATH with CUBLAS_COMPUTE_32F never uses it).
      MLA_CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
      // A workspace of our own: cuBLAS then allocates nothing inside a graph being recorded.
      blas_ws_[lane] = empty(DType::F32, {kBlasWorkspaceBytes / 4});
      MLA_CUBLAS_CHECK(cublasSetWorkspace(h, blas_ws_[lane].data(), kBlasWorkspaceBytes));
      block_counters_[lane] = empty(DType::I32, {gpu::kGridCounterInts});
      MLA_GPU_CHECK(cudaMemset(block_counters_[lane].data(), 0, gpu::kGridCounterInts * sizeof(int32_t)));
    }
    side_lanes_ = true;
  }
  ~CudaOps() override {
    synchronize();
    for (cublasHandle_t h : blas_) cublasDestroy(h);
  }

  std::string name() const override { return fmt::format("cuda-{}", dtype_name(act_dtype())); }

  bool can_record_activity() const override { return true; }
  void activity_begin() override {
    if (capturing()) fail("cuda: activity_begin while a graph is being recorded");
    cuda::activity_begin();
  }
  std::vector<DeviceSpan> activity_end() override { return cuda::activity_end(); }

  // ---- step graphs: CUDA graphs of the calls between begin_capture and end_capture ----
  bool can_capture() const override { return true; }
  int32_t launch_class(const BatchPlan& plan, int64_t heads) const override {
    int64_t max_q = 0;
    for (const BatchRequest& r : plan.batch.requests) max_q = std::max(max_q, r.new_len);
    return mla_fast_launch_class(max_q, int64_t(plan.batch.requests.size()), heads, plan.kv_fill());
  }
  void begin_capture() override {
    if (!step_open()) fail("cuda: begin_capture outside a step");
    if (capturing()) fail("cuda: begin_capture while a graph is being recorded");
    MLA_GPU_CHECK(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeThreadLocal));
    set_capturing(true);
  }
  std::unique_ptr<StepGraph> end_capture(bool failed) override {
    if (!capturing()) fail("cuda: end_capture without begin_capture");
    cudaGraph_t g = nullptr;
    const cudaError_t e = cudaStreamEndCapture(stream(), &g);
    set_capturing(false);
    auto graph = std::make_unique<Graph>();  // owns the recorded marks' events from here, on any path
    graph->keep = take_capture_keep();
    graph->marks = take_capture_marks();
    auto failure = [&](const std::string& what) {
      set_step_marks({});
      (void)cudaGetLastError();  // a capture error is not sticky: the stream runs calls again
      fail("cuda: {}", what);
    };
    if (failed || e != cudaSuccess || !g) {
      if (g) (void)cudaGraphDestroy(g);
      failure(fmt::format("recording a step graph failed{}", e != cudaSuccess ? fmt::format(" ({})", cudaGetErrorString(e)) : ""));
    }
    const cudaError_t ie = cudaGraphInstantiate(&graph->exec, g, 0);
    (void)cudaGraphDestroy(g);
    if (ie != cudaSuccess) graph->exec = nullptr, failure(fmt::format("instantiating a step graph failed ({})", cudaGetErrorString(ie)));
    graph->layout = step_layout();
    graph->timeline = timeline_on();
    count_graph(true);
    return graph;
  }
  bool replay(const StepGraph& g) override {
    const Graph* c = dynamic_cast<const Graph*>(&g);
    if (!c) fail("cuda: replay of a graph another platform recorded");
    if (capturing()) fail("cuda: replay while a graph is being recorded");
    if (!step_open() || c->layout != step_layout() || c->timeline != timeline_on()) return false;
    MLA_GPU_CHECK(cudaGraphLaunch(c->exec, stream()));
    if (c->timeline) set_step_marks(c->marks);
    count_graph(false);
    return true;
  }

  void linear(const Tensor& x, const Tensor& w, Tensor& y) override {
    const Tensor xc = linear_input(x, w, y);
    if (!xc.defined()) return;
    const int64_t K = x.dim(-1), M = rows_of(x), N = w.dim(0);
    // Decode batches of up to 16 rows in bf16: our kernel (cuBLAS's put few blocks on the SMs).
    if (xc.dtype() == DType::BF16 && w.dtype() == DType::BF16 && y.dtype() == DType::BF16 &&
        linear_small_supports(M, N, K, xc.data(), w.data(), y.data()))
      return linear_small(xc.data(), w.data(), y.data(), M, N, K, stream());
    const float one = 1.f, zero = 0.f;
    MLA_CUBLAS_CHECK(cublasGemmEx(blas(), CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(M), int(K), &one, w.data(),
                                  blas_type(w.dtype()), int(K), xc.data(), blas_type(xc.dtype()), int(K), &zero,
                                  y.data(), blas_type(y.dtype()), int(N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }


  void gate_up(const Tensor& x, const Tensor& gate, const Tensor& up, Tensor& out) override {
    const int64_t K = x.dim(-1), M = rows_of(x), N = gate.dim(0);
    // Decode batches of up to 16 rows in bf16: one launch for both products and the SiLU.
    if (x.dtype() == DType::BF16 && gate.dtype() == DType::BF16 && up.dtype() == DType::BF16 &&
        out.dtype() == DType::BF16 && gate.rank() == 2 && up.shape() == gate.shape() && gate.dim(1) == K &&
        out.numel() == M * N && linear_small_supports(M, N, K, x.data(), gate.data(), out.data()) &&
        gpu::aligned16(up.data()))
      return linear_small_gated(x.data(), gate.data(), up.data(), out.data(), M, N, K, stream());
    Ops::gate_up(x, gate, up, out);
  }

  void absorb_q(const Tensor& q, const Tensor& w_kc, int64_t dn, int64_t dr, Tensor& q_mla) override {
    const int64_t H = w_kc.dim(0), L = w_kc.dim(2), T = q.numel() / (H * (dn + dr));
    expect(w_kc.dim(1) == dn && q_mla.numel() == T * H * (L + dr), "absorb_q", "shape");
    if (T == 0) return;
    if (q.dtype() == DType::BF16 && w_kc.dtype() == DType::BF16 && q_mla.dtype() == DType::BF16 &&
        absorb_q_fast_supports(T, dn, dr, L, q.data(), w_kc.data(), q_mla.data()))
      return absorb_q_fast(q.data(), w_kc.data(), T, H, dn, dr, L, q_mla.data(), nullptr, stream());
    const float one = 1.f, zero = 0.f;
    MLA_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        blas(), CUBLAS_OP_N, CUBLAS_OP_N, int(L), int(T), int(dn), &one, w_kc.data(), blas_type(w_kc.dtype()), int(L),
        L * dn, q.data(), blas_type(q.dtype()), int(H * (dn + dr)), dn + dr, &zero, q_mla.data(),
        blas_type(q_mla.dtype()), int(H * (L + dr)), L + dr, int(H), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    gpu::copy_cols(q.data(), elem_of(q.dtype()), dn + dr, dn, q_mla.data(), elem_of(q_mla.dtype()), L + dr, L, T * H, dr,
                    stream());
  }
  // The decode batches' rope in absorb_q's kernel (its first column slice rotates q_pe as it copies
  // it): a kernel fewer on the chain from q's projection to the attention.
  void absorb_q_rope(Tensor& q, const Tensor& w_kc, int64_t dn, int64_t dr, const std::vector<int32_t>& positions,
                     const RopeFrequencies& f, Tensor& q_mla) override {
    const int64_t H = w_kc.dim(0), L = w_kc.dim(2), T = q.numel() / (H * (dn + dr));
    expect(w_kc.dim(1) == dn && q.numel() == T * H * (dn + dr) && q_mla.numel() == T * H * (L + dr) &&
               int64_t(positions.size()) == T,
           "absorb_q_rope", "shape");
    if (T == 0) return;
    if (q.dtype() == DType::BF16 && q_mla.dtype() == DType::BF16 && absorb_q_rope_fused(T, w_kc, dr, f) &&
        absorb_q_fast_supports(T, dn, dr, L, q.data(), w_kc.data(), q_mla.data())) {
      const AbsorbRope rope{ints(positions, 0), doubles(f.inv_freq), f.attention_factor, f.interleave};
      return absorb_q_fast(q.data(), w_kc.data(), T, H, dn, dr, L, q_mla.data(), &rope, stream());
    }
    Ops::absorb_q_rope(q, w_kc, dn, dr, positions, f, q_mla);
  }
  // Fresh tensors are 16-byte aligned: absorb_q_fast_supports' pointer checks then hold.
  bool absorb_q_rope_fused(int64_t tokens, const Tensor& w_kc, int64_t dr, const RopeFrequencies& f) const override {
    return act_dtype() == DType::BF16 && w_kc.dtype() == DType::BF16 && w_kc.rank() == 3 &&
           2 * int64_t(f.inv_freq.size()) == dr &&
           absorb_q_fast_supports(tokens, w_kc.dim(1), dr, w_kc.dim(2), w_kc.data(), w_kc.data(), w_kc.data());
  }
  // Per head: o[:, h, :] = o_lat[:, h, :] · w_vc[h]ᵀ
  void absorb_o(const Tensor& o_lat, const Tensor& w_vc, Tensor& o) override {
    const int64_t H = w_vc.dim(0), dv = w_vc.dim(1), L = w_vc.dim(2), T = o_lat.numel() / (H * L);
    expect(o.numel() == T * H * dv, "absorb_o", "shape");
    if (T == 0) return;
    if (o_lat.dtype() == DType::BF16 && w_vc.dtype() == DType::BF16 && o.dtype() == DType::BF16 &&
        absorb_o_fast_supports(T, dv, L, o_lat.data(), w_vc.data(), o.data()))
      return absorb_o_fast(o_lat.data(), w_vc.data(), T, H, o.data(), stream());
    const float one = 1.f, zero = 0.f;
    MLA_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        blas(), CUBLAS_OP_T, CUBLAS_OP_N, int(dv), int(T), int(L), &one, w_vc.data(), blas_type(w_vc.dtype()), int(L),
        dv * L, o_lat.data(), blas_type(o_lat.dtype()), int(H * L), L, &zero, o.data(), blas_type(o.dtype()),
        int(H * dv), dv, int(H), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }


  // bf16 at multiples of 64: the tensor-core grouped GEMMs (moe_gemm.cu); else the portable path.
  void moe_run(const Tensor& x, const Tensor& expert, const Tensor& weight, const Tensor& gate, const Tensor& up,
               const Tensor& down, SideLane* lane, const Tensor* add, Tensor& out) override {
    const MoeShape m = moe_shape(x, expert, weight, gate, up, down, out);
    if (x.dtype() != DType::BF16 || gate.dtype() != DType::BF16 || out.dtype() != DType::BF16 ||
        !moe_fast_supports(m.I, m.hidden))
      return GpuOps::moe_run(x, expert, weight, gate, up, down, lane, add, out);
    if (m.T == 0) {
      if (lane) lane->join();
      return;
    }
    const int64_t n = m.T * m.K;
    const int bm = moe_fast_rows(n, m.E, m.I, m.hidden);
    const int64_t tiles = moe_max_tiles(n, m.E, bm);
    Tensor keep;
    const MoePlan plan = moe_plan(expert, m, bm, keep);
    Tensor h = empty(DType::BF16, {n, m.I}), y = empty(DType::BF16, {n, m.hidden});  // per row of the plan
    moe_gate_up_fast(x.data(), m.T, int(m.K), plan, tiles, bm, gate.data(), up.data(), m.E, m.I, m.hidden, h.data(),
                     stream());
    moe_down_fast(h.data(), n, plan, tiles, bm, down.data(), m.E, m.I, m.hidden, y.data(), stream());
    if (lane) lane->join();
    moe_combine(y.data(), Elem::BF16, plan.pos, weight.ptr<float>(), m.T, m.K, m.hidden, out.data(), Elem::BF16,
                add ? add->data() : nullptr, add ? elem_of(add->dtype()) : Elem::BF16, stream());
  }

  void attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttnSegments& seg, double scale, Tensor& o,
                 Tensor& lse) override {
    MhaParams p = mha_params(q, k, v, seg, scale, o, lse);
    p.sched = block_counters_[lane()].ptr<int32_t>();
    if (p.elem == Elem::BF16 && mha_fast_supports(p)) mha_attention_fast(p);
    else mha_attention_generic(p);
  }

  void mla_attention(const Tensor& q, const KVPool& pool, int64_t layer, const std::vector<int32_t>& kv_slots,
                     const AttnSegments& seg, int64_t L, double scale, Tensor& o, Tensor& lse) override {
    MlaParams p = mla_params(q, pool, layer, kv_slots, seg, L, scale, o, lse);
    if (p.q_elem == Elem::BF16 && mla_fast_supports(p)) {
      p.ws = workspace(mla_fast_workspace_bytes(p.seg.total_q, p.num_heads, num_sms()));
      p.grid_counters = block_counters_[lane()].ptr<int32_t>();
      mla_attention_fast(p, schedule(p, seg));
    } else {
      mla_attention_generic(p);
    }
  }

 private:
  // The decode launch plan: inside a step, computed at the step's first layer for the plan's own
  // segments and reused by its other layers (same step, segments, heads and workspace).
  MlaDecodeSchedule schedule(const MlaParams& p, const AttnSegments& seg) {
    const bool keep = step_open() && is_step_segments(seg);
    if (keep && sched_.step == step_id() && sched_.seg == &seg && sched_.heads == p.num_heads &&
        sched_.ws_bytes == p.ws.bytes && sched_.ws == p.ws.ptr)
      return sched_.s;
    count_decode_schedule();
    const MlaDecodeSchedule s = mla_fast_schedule(p);
    if (keep) sched_ = {step_id(), &seg, p.num_heads, p.ws.ptr, p.ws.bytes, s};
    return s;
  }

  static constexpr int64_t kBlasWorkspaceBytes = int64_t(32) << 20;  // what cuBLAS asks for on Hopper
  struct Graph final : StepGraph {
    cudaGraphExec_t exec = nullptr;
    std::vector<size_t> layout;  // step_layout() when it was recorded
    std::vector<Tensor> keep;    // the workspaces its kernels use (cuBLAS's is the Ops's own)
    Marks marks;                 // its timeline events (owned)
    bool timeline = false;       // recorded with the timeline on
    ~Graph() override {
      if (exec) (void)cudaGraphExecDestroy(exec);
      for (auto& [label, ev] : marks) (void)cudaEventDestroy(ev);
    }
  };

  int lane() const { return stream() == side_stream_ ? 1 : 0; }  // the current lane: 0 main, 1 side
  cublasHandle_t blas() const { return blas_[lane()]; }
  cublasHandle_t blas_[2] = {nullptr, nullptr};  // main, side
  Tensor blas_ws_[2];
  // [gpu::kGridCounterInts] i32 per lane, zero between launches: MhaParams::sched (its first two),
  // MlaParams::grid_counters.
  Tensor block_counters_[2];
  struct {
    uint64_t step = 0;
    const AttnSegments* seg = nullptr;
    int32_t heads = 0;
    void* ws = nullptr;
    size_t ws_bytes = 0;
    MlaDecodeSchedule s;
  } sched_;
};

}  // namespace

std::unique_ptr<Ops> make_cuda_ops(DType act) {
  if (act != DType::F32 && act != DType::BF16)
    fail("cuda ops: no flavour stores activations as {} (f32, bf16)", dtype_name(act));
  return std::make_unique<CudaOps>(act);
}

PlatformEntry platform_entry() {
  return {Platform::CUDA, gpu::device_count,
          [](DType act, const PlatformOptions&) { return make_cuda_ops(act); },
          [](std::vector<MethodImpl>& r) { methods::add_shared_methods(r, Platform::CUDA); }};
}

}  // namespace cuda
}  // namespace mla
