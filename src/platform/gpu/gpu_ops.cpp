// The GPU platforms' shared Ops: stream, device properties, dtype mapping, and the step's device
// plan (gpu_ops.h).
#include "platform/gpu/gpu_ops.h"

#include <cstdlib>
#include <cstdint>
#include <cstring>

namespace mla::gpu {

Elem elem_of(DType t) {
  switch (t) {
    case DType::F32: return Elem::F32;
    case DType::BF16: return Elem::BF16;
    case DType::F8_E4M3FN: return Elem::FP8_E4M3FN;
    case DType::F8_E4M3FNUZ: return Elem::FP8_E4M3FNUZ;
    default:
      fail("gpu: dtype {} is not supported on the device (f32, bf16, fp8_e4m3fn, fp8_e4m3fnuz)", dtype_name(t));
  }
}

void expect(bool ok, const char* op, const std::string& what) {
  if (!ok) fail("gpu {}: {}", op, what);
}

GpuOps::GpuOps(Platform platform, DType act) : platform_(platform), act_(act) {
  if (device_count() == 0) fail("{}: no {} device is available", platform_name(platform), kRuntimeName);
  cudaStream_t s = nullptr;
  MLA_GPU_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  // Tensors free themselves in stream order, so the stream lives as long as the last of them.
  stream_owner_ = std::shared_ptr<StreamObject>(s, [](cudaStream_t q) {
    (void)cudaStreamSynchronize(q);  // destructors report nothing
    (void)cudaStreamDestroy(q);
  });
  stream_ = main_stream_ = s;
  MLA_GPU_CHECK(cudaStreamCreateWithFlags(&side_stream_, cudaStreamNonBlocking));
  MLA_GPU_CHECK(cudaEventCreateWithFlags(&side_fork_, cudaEventDisableTiming));
  MLA_GPU_CHECK(cudaEventCreateWithFlags(&side_done_, cudaEventDisableTiming));
  cudaDeviceProp prop{};
  MLA_GPU_CHECK(cudaGetDeviceProperties(&prop, 0));
  num_sms_ = prop.multiProcessorCount;
  MLA_GPU_CHECK(cudaMalloc(&router_done_, 2 * kMoeRouterTokens * sizeof(unsigned)));
  MLA_GPU_CHECK(cudaMemset(router_done_, 0, 2 * kMoeRouterTokens * sizeof(unsigned)));
  // Tests set MLA_CUDA_POISON=1: every new buffer starts as NaN, so an output a kernel forgot to
  // write shows up instead of passing on stale zeros.
  const char* poison = std::getenv("MLA_CUDA_POISON");
  poison_ = poison && std::string(poison) == "1";
}

GpuOps::~GpuOps() {
  (void)cudaStreamSynchronize(side_stream_);
  (void)cudaStreamSynchronize(main_stream_);
  side_keep_.clear();
  (void)cudaStreamDestroy(side_stream_);
  (void)cudaEventDestroy(side_fork_);
  (void)cudaEventDestroy(side_done_);
  for (int i = 0; i < 2; ++i) {
    if (pinned_[i]) (void)cudaFreeHost(pinned_[i]);
    if (pinned_copied_[i]) (void)cudaEventDestroy(pinned_copied_[i]);
  }
  for (int32_t* p : pinned_retired_) (void)cudaFreeHost(p);
  for (const PinnedCopy& c : copies_free_) {
    (void)cudaFreeHost(c.ptr);
    (void)cudaEventDestroy(c.done);
  }
  for (cudaEvent_t e : upload_events_)
    if (e) (void)cudaEventDestroy(e);
  for (cudaEvent_t e : mark_events_) (void)cudaEventDestroy(e);
  (void)cudaFree(router_done_);
}

std::shared_ptr<void> GpuOps::alloc_staging(size_t bytes) {
  void* p = nullptr;
  MLA_GPU_CHECK(cudaMallocHost(&p, std::max<size_t>(bytes, 1)));
  return std::shared_ptr<void>(p, [](void* q) { (void)cudaFreeHost(q); });
}

void GpuOps::upload_async(const void* host, Tensor& dst, size_t offset, size_t n, int slot) {
  expect(dst.platform() == platform_ && offset + n <= dst.nbytes() && slot >= 0 && slot < kUploadSlots,
         "upload_async", fmt::format("{} bytes at {} into a tensor of {} bytes (slot {})", n, offset, dst.nbytes(), slot));
  cudaEvent_t& e = upload_events_[size_t(slot)];
  if (!e) MLA_GPU_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  MLA_GPU_CHECK(cudaMemcpyAsync(static_cast<char*>(dst.data()) + offset, host, n, cudaMemcpyHostToDevice, stream_));
  MLA_GPU_CHECK(cudaEventRecord(e, stream_));
}

void GpuOps::wait_upload(int slot) {
  expect(slot >= 0 && slot < kUploadSlots, "wait_upload", fmt::format("slot {}", slot));
  if (cudaEvent_t e = upload_events_[size_t(slot)]) MLA_GPU_CHECK(cudaEventSynchronize(e));
}

void GpuOps::side_begin() {
  if (side_state_ != SideState::None) fail("{}: side_begin while a side lane is open", platform_name(platform_));
  if (side_lanes_) {
    MLA_GPU_CHECK(cudaEventRecord(side_fork_, main_stream_));
    MLA_GPU_CHECK(cudaStreamWaitEvent(side_stream_, side_fork_, 0));
    stream_ = side_stream_;
  }
  side_state_ = SideState::InLane;
}

void GpuOps::side_end() {
  if (side_state_ != SideState::InLane) fail("{}: side_end outside a side lane", platform_name(platform_));
  stream_ = main_stream_;
  side_state_ = SideState::Open;
}

void GpuOps::side_join() {
  if (side_state_ != SideState::Open) fail("{}: side_join without an ended side lane", platform_name(platform_));
  if (side_lanes_) {
    MLA_GPU_CHECK(cudaEventRecord(side_done_, side_stream_));
    MLA_GPU_CHECK(cudaStreamWaitEvent(main_stream_, side_done_, 0));
  }
  side_keep_.clear();  // their frees now follow the join on the main stream
  side_state_ = SideState::None;
}

void GpuOps::synchronize() {
  if (side_state_ != SideState::None) fail("{}: a synchronization inside a side lane", platform_name(platform_));
  refuse_in_capture("a synchronization");
  ++total_.host_syncs;
  MLA_GPU_CHECK(cudaStreamSynchronize(stream_));
}

const double* GpuOps::doubles(const std::vector<double>& v) {
  for (const auto& [host, dev] : tables_)
    if (host == v) return static_cast<const double*>(dev.data());
  refuse_in_capture("a new constant table");
  if (tables_.size() >= 16) return static_cast<const double*>(stage(v.data(), v.size() * 8, 9));
  Tensor dev = empty(DType::I32, {int64_t(2 * v.size())});  // [2·n] I32 holding n doubles
  if (!v.empty()) {
    MLA_GPU_CHECK(cudaMemcpyAsync(dev.data(), v.data(), v.size() * 8, cudaMemcpyHostToDevice, stream_));
    ++total_.h2d_copies, ++total_.host_syncs;  // from pageable memory
  }
  tables_.emplace_back(v, dev);
  return static_cast<const double*>(dev.data());
}

// Layout of the device plan (int32): positions [T], new_slots [T], the extra vectors, each
// segment set as q_start, q_len, k_start, k_len [n each], then kv_slots [Σ seq] last: for a fixed
// batch size every array but kv_slots keeps its device address from step to step.
void GpuOps::begin_step(const BatchPlan& plan, const KVPool& pool,
                        std::initializer_list<const std::vector<int32_t>*> extra) {
  refuse_in_capture("a new step");
  if (step_open_) fail("{}: a step is already open (end_step first)", platform_name(platform_));
  // Everything that can fail comes before any state changes.
  const int64_t num_slots = pool.num_slots();
  for (const std::vector<int32_t>* v : {&plan.kv_slots, &plan.new_slots})
    for (int32_t s : *v)
      if (s < 0 || s >= num_slots) fail("batch slot {} is outside the KV pool of {} slots", s, num_slots);
  const AttnSegments* sets[2] = {&plan.new_only(), &plan.prefix_and_new()};
  for (const AttnSegments* seg : sets) {
    const size_t n = seg->q_len.size();
    if (seg->q_start.size() != n || seg->k_start.size() != n || seg->k_len.size() != n)
      fail("{} step: the plan's segment arrays differ in length", platform_name(platform_));
    for (size_t r = 0; r < n; ++r)
      if (seg->q_start[r] < 0 || seg->q_len[r] < 0 || seg->k_start[r] < 0 || seg->k_len[r] < 0 ||
          seg->q_start[r] + seg->q_len[r] > INT32_MAX || seg->k_start[r] + seg->k_len[r] > INT32_MAX)
        fail("{} step: segment {} of the plan is negative or outside the int32 range", platform_name(platform_), r);
  }

  const StepCounters start = total_;
  if (timeline_on()) ev_marks_.clear(), next_mark_event_ = 0;  // the marks are this step's
  std::vector<StepArray> arrays;
  size_t total = 0;
  auto add = [&](const std::vector<int32_t>& v) {
    arrays.push_back({&v, v.data(), v.size(), total});
    total += v.size();
  };
  add(plan.positions);
  add(plan.new_slots);
  for (const std::vector<int32_t>* v : extra)
    if (v) add(*v);
  StepSegments segs[2];
  for (int i = 0; i < 2; ++i) {
    const AttnSegments& seg = *sets[i];
    StepSegments& s = segs[i];
    s.seg = &seg, s.n = seg.q_len.size(), s.offset = total;
    s.dev = DeviceSegments{nullptr, nullptr, nullptr, nullptr, int32_t(s.n), 0, 0, 0, seg.causal};
    int64_t keys = 0;
    for (size_t r = 0; r < s.n; ++r) {
      s.q_end = std::max(s.q_end, seg.q_start[r] + seg.q_len[r]);
      s.k_end = std::max(s.k_end, seg.k_start[r] + seg.k_len[r]);
      s.dev.max_q_len = std::max(s.dev.max_q_len, int32_t(seg.q_len[r]));
      s.dev.max_k_len = std::max(s.dev.max_k_len, int32_t(seg.k_len[r]));
      s.dev.total_q += int32_t(seg.q_len[r]);
      keys += seg.k_len[r];
    }
    s.dev.k_fill = kv_fill(keys, int64_t(s.n), s.dev.max_k_len);
    total += 4 * s.n;
  }
  add(plan.kv_slots);

  // The pinned buffer of this turn: its previous copy (two steps ago) is normally long done.
  const int turn = pinned_turn_ ^ 1;
  if (!pinned_copied_[turn]) MLA_GPU_CHECK(cudaEventCreateWithFlags(&pinned_copied_[turn], cudaEventDisableTiming));
  const cudaError_t q = cudaEventQuery(pinned_copied_[turn]);
  if (q == cudaErrorNotReady) {
    ++total_.host_syncs;
    MLA_GPU_CHECK(cudaEventSynchronize(pinned_copied_[turn]));
  } else {
    MLA_GPU_CHECK(q);
  }
  if (pinned_ints_[turn] < std::max<size_t>(total, 1)) {
    const size_t cap = std::max<size_t>(total + total / 2, 1024);
    if (pinned_[turn]) {  // freeing pinned memory would wait for the device: it goes with the Ops
      pinned_retired_.push_back(pinned_[turn]);
      pinned_[turn] = nullptr, pinned_ints_[turn] = 0;
    }
    void* p = nullptr;
    MLA_GPU_CHECK(cudaMallocHost(&p, cap * 4));
    pinned_[turn] = static_cast<int32_t*>(p), pinned_ints_[turn] = cap;
  }
  if (!step_dev_.defined() || size_t(step_dev_.numel()) < std::max<size_t>(total, 1))
    step_dev_ = empty(DType::I32, {int64_t(std::max<size_t>(total + total / 2, 1024))});

  int32_t* h = pinned_[turn];
  for (const StepArray& a : arrays)
    if (a.size) std::memcpy(h + a.offset, a.data, a.size * 4);
  for (int i = 0; i < 2; ++i) {
    const AttnSegments& seg = *sets[i];
    const size_t n = segs[i].n;
    int32_t* d = h + segs[i].offset;
    for (size_t r = 0; r < n; ++r) {
      d[r] = int32_t(seg.q_start[r]), d[n + r] = int32_t(seg.q_len[r]);
      d[2 * n + r] = int32_t(seg.k_start[r]), d[3 * n + r] = int32_t(seg.k_len[r]);
    }
  }
  if (total) {
    MLA_GPU_CHECK(cudaMemcpyAsync(step_dev_.data(), h, total * 4, cudaMemcpyHostToDevice, stream_));
    ++total_.h2d_copies;
  }
  MLA_GPU_CHECK(cudaEventRecord(pinned_copied_[turn], stream_));
  pinned_turn_ = turn;

  step_arrays_ = std::move(arrays);
  step_segs_[0] = segs[0], step_segs_[1] = segs[1];
  step_plan_ = &plan, step_pool_ = &pool, step_pool_slots_ = num_slots;
  step_start_ = start;  // the plan's copy (and any wait for a pinned buffer) belongs to the step
  ++step_id_;
  step_open_ = true;
}

// A download in flight: its page-locked buffer goes back to the free list when it is dropped (a
// later copy into it is queued behind this one on the stream).
class GpuOps::PendingCopy final : public Ops::HostCopy {
 public:
  PendingCopy(GpuOps& ops, PinnedCopy c, DType dtype, Shape shape)
      : ops_(ops), c_(c), dtype_(dtype), shape_(std::move(shape)) {}
  ~PendingCopy() override { ops_.copies_free_.push_back(c_); }
  Tensor wait() override {
    if (!waited_) {
      ++ops_.total_.host_syncs;
      MLA_GPU_CHECK(cudaEventSynchronize(c_.done));
      waited_ = true;
    }
    Tensor h = Tensor::host(dtype_, shape_);
    std::memcpy(h.data(), c_.ptr, h.nbytes());
    return h;
  }

 private:
  GpuOps& ops_;
  PinnedCopy c_;
  DType dtype_;
  Shape shape_;
  bool waited_ = false;
};

std::unique_ptr<Ops::HostCopy> GpuOps::download_later(const Tensor& t) {
  refuse_in_capture("download");
  const size_t bytes = t.nbytes();
  PinnedCopy c;
  for (size_t i = 0; i < copies_free_.size(); ++i)
    if (copies_free_[i].bytes >= bytes) {
      c = copies_free_[i];
      copies_free_.erase(copies_free_.begin() + ptrdiff_t(i));
      break;
    }
  if (!c.ptr) {
    c.bytes = std::max<size_t>(bytes, 4096);
    MLA_GPU_CHECK(cudaMallocHost(&c.ptr, c.bytes));
    MLA_GPU_CHECK(cudaEventCreateWithFlags(&c.done, cudaEventDisableTiming));
  }
  if (bytes) MLA_GPU_CHECK(cudaMemcpyAsync(c.ptr, t.data(), bytes, cudaMemcpyDeviceToHost, stream_));
  MLA_GPU_CHECK(cudaEventRecord(c.done, stream_));
  ++total_.d2h_copies;
  return std::make_unique<PendingCopy>(*this, c, t.dtype(), t.shape());
}

void GpuOps::step_rows_from(const std::vector<int32_t>& v, const Tensor& src, const std::vector<int32_t>& from) {
  refuse_in_capture("step_rows_from");
  const int32_t* d = step_ints(v);
  expect(d != nullptr, "step_rows_from", "the vector is not an extra vector of the open step");
  expect(src.platform() == platform_ && src.dtype() == DType::I32 && from.size() == v.size(), "step_rows_from",
         fmt::format("I32 values on this platform and {} rows wanted, got {} {} and {} rows", v.size(),
                     src.numel(), dtype_name(src.dtype()), from.size()));
  for (const int32_t r : from)
    if (r >= src.numel())
      expect(false, "step_rows_from", fmt::format("row {} is outside the {} values given", r, src.numel()));
  const auto* s = static_cast<const int32_t*>(src.data());
  for (size_t i = 0; i < from.size();) {
    if (from[i] < 0) {
      ++i;
      continue;
    }
    size_t n = 1;  // a run: rows i.. take src[from[i]]..
    while (i + n < from.size() && from[i + n] == from[i] + int32_t(n)) ++n;
    MLA_GPU_CHECK(cudaMemcpyAsync(const_cast<int32_t*>(d + i), s + from[i], n * 4, cudaMemcpyDeviceToDevice, stream_));
    i += n;
  }
}

void GpuOps::mark(const char* label) {
  if (!timeline_on()) return;
  cudaEvent_t e = nullptr;
  if (capturing_) {
    MLA_GPU_CHECK(cudaEventCreate(&e));
    capture_marks_.emplace_back(label, e);
#if defined(MLA_HIP)
    MLA_GPU_CHECK(cudaEventRecord(e, stream_));
#else
    MLA_GPU_CHECK(cudaEventRecordWithFlags(e, stream_, cudaEventRecordExternal));  // a node of the graph
#endif
  } else {
    if (next_mark_event_ == mark_events_.size()) {
      MLA_GPU_CHECK(cudaEventCreate(&e));
      mark_events_.push_back(e);
    }
    e = mark_events_[next_mark_event_++];
    MLA_GPU_CHECK(cudaEventRecord(e, stream_));
  }
  ev_marks_.emplace_back(label, e);
}

std::vector<std::pair<std::string, double>> GpuOps::timeline() {
  refuse_in_capture("reading the timeline");
  if (!timeline_on()) {  // marks of a step before it was turned off may belong to a graph since dropped
    ev_marks_.clear();
    return {};
  }
  MLA_GPU_CHECK(cudaStreamSynchronize(stream_));
  std::vector<std::pair<std::string, double>> t;
  for (size_t i = 0; i + 1 < ev_marks_.size(); ++i) {
    float ms = 0;
    MLA_GPU_CHECK(cudaEventElapsedTime(&ms, ev_marks_[i].second, ev_marks_[i + 1].second));
    t.emplace_back(ev_marks_[i].first, double(ms));
  }
  ev_marks_.clear();
  next_mark_event_ = 0;
  return t;
}

std::vector<size_t> GpuOps::step_layout() const {
  std::vector<size_t> l;
  if (!step_open_) return l;
  l.push_back(reinterpret_cast<size_t>(step_dev_.data()));
  for (size_t i = 0; i + 1 < step_arrays_.size(); ++i) l.push_back(step_arrays_[i].size);  // all but kv_slots
  for (const StepSegments& s : step_segs_) l.push_back(s.n);
  return l;
}

void GpuOps::end_step() noexcept {
  if (!step_open_) return;
  last_step_ = total_ - step_start_;
  step_open_ = false;
  step_plan_ = nullptr, step_pool_ = nullptr;
  step_arrays_.clear();
  step_segs_[0] = step_segs_[1] = StepSegments{};
}

MoeRouteParams GpuOps::route_params(const Tensor& logits, const Tensor& bias, const MoeRouting& r, Tensor& expert,
                                    Tensor& weight) {
  r.validate();
  const int64_t E = r.n_routed_experts, K = r.num_experts_per_tok, T = rows_of(logits);
  expect(logits.dtype() == DType::F32 && logits.dim(-1) == E, "moe_route",
         fmt::format("router logits {} {} are not [T, {}] f32", dtype_name(logits.dtype()), shape_str(logits.shape()), E));
  expect(!bias.defined() || (bias.dtype() == DType::F32 && bias.numel() == E), "moe_route",
         fmt::format("bias is not [{}] f32", E));
  expect(expert.dtype() == DType::I32 && expert.numel() == T * K && weight.dtype() == DType::F32 && weight.numel() == T * K,
         "moe_route", fmt::format("expert / weight are not [{}, {}] i32 / f32", T, K));
  expect(E <= kMoeMaxExperts, "moe_route", fmt::format("{} experts (at most {})", E, kMoeMaxExperts));
  MoeRouteParams p;
  p.logits = logits.ptr<float>();
  p.bias = bias.defined() ? bias.ptr<float>() : nullptr;
  p.T = int(T), p.E = int(E), p.K = int(K), p.n_group = int(r.n_group), p.topk_group = int(r.topk_group);
  p.sigmoid = r.scoring_func == "sigmoid";
  p.norm_topk_prob = r.norm_topk_prob;
  p.method = r.topk_method == "noaux_tc" ? MoeTopk::NoauxTc
             : r.topk_method == "group_limited_greedy" ? MoeTopk::GroupLimitedGreedy : MoeTopk::Greedy;
  p.routed_scaling_factor = r.routed_scaling_factor;
  p.expert = expert.ptr<int32_t>();
  p.weight = weight.ptr<float>();
  return p;
}

void GpuOps::moe_route(const Tensor& logits, const Tensor& bias, const MoeRouting& r, Tensor& expert, Tensor& weight) {
  const MoeRouteParams p = route_params(logits, bias, r, expert, weight);
  gpu::moe_route(p, stream_);
}

void GpuOps::moe_router(const Tensor& x, const Tensor& router, const Tensor& bias, const MoeRouting& r,
                        Tensor& logits, Tensor& expert, Tensor& weight) {
  check_router_dtype(x, router);
  const int64_t T = rows_of(x), H = x.dim(-1), E = r.n_routed_experts;
  auto f32_or_bf16 = [](DType d) { return d == DType::F32 || d == DType::BF16; };
  const bool ours = f32_or_bf16(router.dtype()) && f32_or_bf16(x.dtype());
  const Elem xe = ours ? elem_of(x.dtype()) : Elem::F32, we = ours ? elem_of(router.dtype()) : Elem::F32;
  const bool fused = ours && T <= kMoeRouterTokens;
  const bool logits_kernel =
      ours && !fused && T <= kMoeLogitsTokens && moe_logits_fits(x.data(), xe, router.data(), we, H);
  if (!fused && !logits_kernel) return Ops::moe_router(x, router, bias, r, logits, expert, weight);
  expect(router.rank() == 2 && router.dim(0) == E && router.dim(1) == H && logits.numel() == T * E, "moe_router",
         fmt::format("router {} for x {} and {} experts", shape_str(router.shape()), shape_str(x.shape()), E));
  MoeRouteParams p = route_params(logits, bias, r, expert, weight);
  if (T == 0) return;
  if (logits_kernel) {
    gpu::moe_logits(x.data(), xe, router.data(), we, H, T, E, logits.ptr<float>(), stream_);
    return gpu::moe_route(p, stream_);
  }
  unsigned* done = router_done_ + (stream_ == main_stream_ ? 0 : kMoeRouterTokens);
  gpu::moe_router(x.data(), xe, router.data(), we, H, p, done, stream_);
}

GpuOps::MoeShape GpuOps::moe_shape(const Tensor& x, const Tensor& expert, const Tensor& weight, const Tensor& gate,
                                   const Tensor& up, const Tensor& down, const Tensor& out) {
  MoeShape m;
  m.T = rows_of(x), m.hidden = x.dim(-1);
  expect(gate.rank() == 3 && up.shape() == gate.shape() && gate.dim(2) == m.hidden && down.rank() == 3 &&
             down.dim(0) == gate.dim(0) && down.dim(1) == m.hidden && down.dim(2) == gate.dim(1) &&
             gate.dtype() == up.dtype() && down.dtype() == gate.dtype(),
         "moe_experts",
         fmt::format("experts gate {} up {} down {} do not fit hidden {}", shape_str(gate.shape()), shape_str(up.shape()),
                     shape_str(down.shape()), m.hidden));
  m.E = gate.dim(0), m.I = gate.dim(1);
  m.K = m.T == 0 ? expert.dim(-1) : expert.numel() / m.T;
  expect(expert.dtype() == DType::I32 && weight.dtype() == DType::F32 && expert.numel() == m.T * m.K &&
             weight.numel() == m.T * m.K && out.numel() == m.T * m.hidden,
         "moe_experts", fmt::format("expert {} / weight {} / out {} for {} tokens", shape_str(expert.shape()),
                                    shape_str(weight.shape()), shape_str(out.shape()), m.T));
  expect(m.E <= kMoeMaxExperts, "moe_experts", fmt::format("{} experts (at most {})", m.E, kMoeMaxExperts));
  return m;
}

MoePlan GpuOps::moe_plan(const Tensor& expert, const MoeShape& m, int bm, Tensor& keep) {
  const int64_t n = m.T * m.K;
  keep = empty(DType::I32, {moe_plan_words(n, m.E, bm)});
  MoePlan plan = moe_plan_at(keep.ptr<int32_t>(), n, m.E, bm);
  moe_align(expert.ptr<int32_t>(), n, int(m.E), bm, plan, stream_);
  return plan;
}

void GpuOps::moe_run(const Tensor& x, const Tensor& expert, const Tensor& weight, const Tensor& gate, const Tensor& up,
                     const Tensor& down, SideLane* lane, const Tensor* add, Tensor& out) {
  const MoeShape m = moe_shape(x, expert, weight, gate, up, down, out);
  if (m.T == 0) {
    if (lane) lane->join();
    return;
  }
  const int64_t n = m.T * m.K, bm = kMoeGenericRows, tiles = moe_max_tiles(n, m.E, bm);
  Tensor keep;
  const MoePlan plan = moe_plan(expert, m, int(bm), keep);
  const Elem ae = elem_of(out.dtype()), we = elem_of(gate.dtype());
  Tensor h = empty(out.dtype(), {n, m.I}), y = empty(out.dtype(), {n, m.hidden});  // per row of the plan
  moe_gate_up_generic(x.data(), elem_of(x.dtype()), int(m.K), plan, tiles, gate.data(), up.data(), we, m.I, m.hidden,
                      h.data(), ae, stream_);
  moe_down_generic(h.data(), ae, plan, tiles, down.data(), we, m.I, m.hidden, y.data(), ae, stream_);
  if (lane) lane->join();
  moe_combine(y.data(), ae, plan.pos, weight.ptr<float>(), m.T, m.K, m.hidden, out.data(), ae,
              add ? add->data() : nullptr, add ? elem_of(add->dtype()) : ae, stream_);
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

}  // namespace mla::gpu
