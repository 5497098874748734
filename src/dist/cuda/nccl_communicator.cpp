// The NCCL communicator (mla/nccl.h): NCCL's collectives, and our all-reduce kernels
// (platform/cuda/allreduce.h) over a peer-mapped region per rank whose CUDA IPC handles the ranks
// exchange once, through NCCL, when the communicator is made.
#include <nccl.h>

#include <algorithm>
#include <vector>

#include "mla/error.h"
#include "mla/nccl.h"
#include "platform/cuda/allreduce.h"
#include "platform/gpu/gpu_ops.h"

namespace mla {
namespace {

void nccl_check(ncclResult_t r, const char* call) {
  if (r != ncclSuccess) fail("NCCL {}: {}", call, ncclGetErrorString(r));
}
#define MLA_NCCL_CHECK(call) nccl_check((call), #call)

ncclDataType_t nccl_type(DType t, const std::string& who) {
  switch (t) {
    case DType::F64: return ncclFloat64;
    case DType::F32: return ncclFloat32;
    case DType::BF16: return ncclBfloat16;
    case DType::F16: return ncclFloat16;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
    case DType::U8: return ncclUint8;
    default: fail("{}: NCCL has no {} collectives", who, dtype_name(t));
  }
}

bool ours_dtype(DType t) { return t == DType::F32 || t == DType::BF16; }

std::string describe(uint64_t tag) {
  using cuda::ArKind;
  const ArKind k = cuda::ar_tag_kind(tag);
  const char* what = k == ArKind::OneShot             ? "all_reduce (one-shot pull)"
                     : k == ArKind::TwoShot           ? "all_reduce (two-shot pull)"
                     : k == ArKind::OneShotPush       ? "all_reduce (one-shot push)"
                     : k == ArKind::TwoShotPush       ? "all_reduce (two-shot push)"
                     : k == ArKind::Fused             ? "all_reduce_add_rmsnorm"
                     : k == ArKind::NcclAllReduce     ? "all_reduce (NCCL)"
                     : k == ArKind::NcclAllGather     ? "all_gather"
                     : k == ArKind::NcclReduceScatter ? "reduce_scatter"
                     : k == ArKind::NcclBroadcast     ? "broadcast"
                                                      : "an unknown collective";
  const uint8_t d = cuda::ar_tag_dtype(tag);
  std::string s = fmt::format("{} of {} {}", what, cuda::ar_tag_numel(tag),
                              d <= uint8_t(DType::U8) ? std::string(dtype_name(DType(d))) : std::to_string(d));
  if (k == ArKind::NcclBroadcast) s += fmt::format(" from root {}", cuda::ar_tag_root(tag));
  return s;
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(int rank, int size, const std::string& id, Ops& ops, const NcclOptions& o)
      : ops_(gpu_ops(ops)), st_(ops_.stream()), o_(o), rank_(rank), size_(size) {
    if (size < 1) fail("nccl communicator: size must be at least 1 (got {})", size);
    if (rank < 0 || rank >= size) fail("nccl communicator: rank {} is outside [0, {})", rank, size);
    ncclUniqueId uid;
    if (id.size() != sizeof uid)
      fail("nccl communicator: the unique id has {} bytes, NCCL's have {}", id.size(), sizeof uid);
    if (!(o.barrier_timeout_s > 0)) fail("nccl communicator: barrier_timeout_s must be positive");
    std::copy(id.begin(), id.end(), reinterpret_cast<char*>(&uid));
    ops_.synchronize();
    MLA_NCCL_CHECK(ncclCommInitRank(&comm_, size, uid, rank));
    try {
      MLA_GPU_CHECK(cudaMalloc(&scratch_, size_t(size) * (sizeof(cudaIpcMemHandle_t) + 64)));
      if (o.use_ours && size >= 2 && size <= cuda::kArMaxRanks) map_peers();
    } catch (...) {
      release(true);
      throw;
    }
  }
  ~NcclCommunicator() override { release(broken_); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return fmt::format("nccl {}/{}", rank_, size_); }
  bool capturable() const override { return true; }  // device-side epochs and tags, NCCL's own capture
  void check() override { check_pending(); }

  void all_reduce(Tensor& x) override {
    check_pending();
    on_device(x, "all_reduce");
    if (size_ == 1) return;
    const size_t bytes = x.nbytes();
    if (p_.size && ours_dtype(x.dtype()) && bytes <= o_.two_shot_max_bytes) {
      using cuda::ArKind;
      const bool one = bytes <= o_.one_shot_max_bytes, push = o_.push;
      const ArKind k = one ? (push ? ArKind::OneShotPush : ArKind::OneShot) : (push ? ArKind::TwoShotPush : ArKind::TwoShot);
      const uint64_t tag = tag_of(k, x.dtype(), 0, x.numel());
      if (one) cuda::ar_one_shot(p_, x.data(), gpu::elem_of(x.dtype()), x.numel(), push, tag, st_);
      else cuda::ar_two_shot(p_, x.data(), gpu::elem_of(x.dtype()), x.numel(), push, tag, st_);
      return;
    }
    const ncclDataType_t t = nccl_type(x.dtype(), name());
    check_shapes(cuda::ArKind::NcclAllReduce, x.dtype(), 0, x.numel());
    MLA_NCCL_CHECK(ncclAllReduce(x.data(), x.data(), size_t(x.numel()), t, ncclSum, comm_, st_));
  }

  void all_gather(const Tensor& x, Tensor& out) override {
    check_pending();
    on_device(x, "all_gather"), on_device(out, "all_gather");
    if (out.numel() != x.numel() * size_ || out.dtype() != x.dtype())
      fail("{}: all_gather of {} {} needs an output of {} {}, got {} {}", name(), x.numel(), dtype_name(x.dtype()),
           x.numel() * size_, dtype_name(x.dtype()), out.numel(), dtype_name(out.dtype()));
    const ncclDataType_t t = nccl_type(x.dtype(), name());
    check_shapes(cuda::ArKind::NcclAllGather, x.dtype(), 0, x.numel());
    MLA_NCCL_CHECK(ncclAllGather(x.data(), out.data(), size_t(x.numel()), t, comm_, st_));
  }

  void reduce_scatter(const Tensor& x, Tensor& out) override {
    check_pending();
    on_device(x, "reduce_scatter"), on_device(out, "reduce_scatter");
    if (x.numel() != out.numel() * size_ || out.dtype() != x.dtype())
      fail("{}: reduce_scatter of {} {} over {} ranks needs an output of {} {}, got {} {}", name(), x.numel(),
           dtype_name(x.dtype()), size_, x.numel() / size_, dtype_name(x.dtype()), out.numel(), dtype_name(out.dtype()));
    const ncclDataType_t t = nccl_type(x.dtype(), name());
    check_shapes(cuda::ArKind::NcclReduceScatter, x.dtype(), 0, x.numel());
    MLA_NCCL_CHECK(ncclReduceScatter(x.data(), out.data(), size_t(out.numel()), t, ncclSum, comm_, st_));
  }

  void broadcast(Tensor& x, int root) override {
    check_pending();
    on_device(x, "broadcast");
    if (root < 0 || root >= size_) fail("{}: broadcast root {} is outside the {} ranks", name(), root, size_);
    const ncclDataType_t t = nccl_type(x.dtype(), name());
    check_shapes(cuda::ArKind::NcclBroadcast, x.dtype(), root, x.numel());
    MLA_NCCL_CHECK(ncclBroadcast(x.data(), x.data(), size_t(x.numel()), t, root, comm_, st_));
  }

  void all_reduce_add_rmsnorm(Tensor& y, Tensor& h, Tensor& x, const Tensor& w, double eps, Ops& ops) override {
    check_pending();
    const int64_t n = h.dim(-1);
    if (y.numel() != h.numel() || x.numel() != h.numel() || x.dtype() != h.dtype() || w.numel() != n)
      fail("{}: all_reduce_add_rmsnorm of y {} {} into h {} {}, x {} {}, w {}: shapes or dtypes disagree", name(),
           dtype_name(y.dtype()), shape_str(y.shape()), dtype_name(h.dtype()), shape_str(h.shape()),
           dtype_name(x.dtype()), shape_str(x.shape()), shape_str(w.shape()));
    if (&ops != &ops_ || !p_.size || !ours_dtype(y.dtype()) || !ours_dtype(h.dtype()) ||
        y.nbytes() > o_.one_shot_max_bytes || n == 0 || h.numel() / n > cuda::kArBlocks) {
      // (past kArBlocks rows a block of the fused kernel normalizes several rows one after another)
      all_reduce(y);
      ops.add_rmsnorm(h, y, x, w, eps);
      return;
    }
    on_device(y, "all_reduce_add_rmsnorm"), on_device(h, "all_reduce_add_rmsnorm"), on_device(x, "all_reduce_add_rmsnorm");
    const uint64_t tag = tag_of(cuda::ArKind::Fused, y.dtype(), 0, y.numel());
    cuda::ar_add_rmsnorm(p_, y.data(), gpu::elem_of(y.dtype()), h.data(), gpu::elem_of(h.dtype()), x.data(),
                         h.numel() / n, n, w.data(), gpu::elem_of(w.dtype()), float(eps), tag, st_);
  }

 private:
  static gpu::GpuOps& gpu_ops(Ops& ops) {
    auto* g = dynamic_cast<gpu::GpuOps*>(&ops);
    if (!g || ops.platform() != Platform::CUDA)
      fail("nccl communicator: needs the CUDA platform's ops, got {}", platform_name(ops.platform()));
    return *g;
  }
  static uint64_t tag_of(cuda::ArKind k, DType t, int root, int64_t numel) {
    return cuda::ar_tag(k, uint8_t(t), root, numel);
  }
  void on_device(const Tensor& t, const char* op) const {
    if (t.platform() != Platform::CUDA) fail("{}: {} of a {} tensor", name(), op, platform_name(t.platform()));
  }
  void check_shapes(cuda::ArKind k, DType t, int root, int64_t numel) {
    if (p_.size && o_.check_shapes) cuda::ar_check(p_, tag_of(k, t, root, numel), st_);
  }

  // A disagreement or timeout that a kernel recorded (host-mapped memory: read without waiting).
  void check_pending() {
    if (broken_) fail("{}", broken_msg_);
    if (!err_host_) return;
    volatile cuda::ArError* e = err_host_;
    const int code = e->code;
    if (code == 0) return;
    const int peer = e->peer;
    const uint64_t mine = e->mine, theirs = e->theirs;
    if (code == 1) {
      e->code = 0;
      fail("{}: ranks disagree: rank {} called {}, rank {} {}", name(), peer, describe(theirs), rank_, describe(mine));
    }
    broken_ = true;
    broken_msg_ = fmt::format("{}: rank {} did not come to {} within {} s (it stopped, or called another "
                              "collective); this communicator can no longer be used",
                              name(), peer, describe(mine), o_.barrier_timeout_s);
    fail("{}", broken_msg_);
  }

  void map_peers() {
    // The largest call of each path (the fused one pulls), in a half of whole 256-byte blocks.
    const size_t half = (std::max({cuda::ar_half_bytes(false, o_.push, size_, o_.one_shot_max_bytes),
                                   cuda::ar_half_bytes(false, false, size_, o_.one_shot_max_bytes),
                                   o_.two_shot_max_bytes > o_.one_shot_max_bytes
                                       ? cuda::ar_half_bytes(true, o_.push, size_, o_.two_shot_max_bytes)
                                       : size_t(0)}) + 255) / 256 * 256;
    MLA_GPU_CHECK(cudaMalloc(&region_, cuda::kArFlagBytes + 2 * half));
    MLA_GPU_CHECK(cudaMemset(region_, 0, cuda::kArFlagBytes));
    MLA_GPU_CHECK(cudaMalloc(&state_, 2 * cuda::kArBlocks * sizeof(uint64_t)));
    MLA_GPU_CHECK(cudaMemset(state_, 0, 2 * cuda::kArBlocks * sizeof(uint64_t)));
    MLA_GPU_CHECK(cudaHostAlloc(&err_host_, sizeof(cuda::ArError), cudaHostAllocMapped));
    *err_host_ = {};
    cuda::ArError* err_dev = nullptr;
    MLA_GPU_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&err_dev), err_host_, 0));
    MLA_GPU_CHECK(cudaDeviceSynchronize());  // the zeroed flags before any peer can see them

    // Every rank's handle and layout, gathered through NCCL: a rank writes into the peers' halves,
    // so all must have made the same ones.
    struct Shared {
      cudaIpcMemHandle_t handle;
      uint64_t half, push;
    };
    std::vector<Shared> all(static_cast<size_t>(size_));
    Shared& me = all[size_t(rank_)];
    MLA_GPU_CHECK(cudaIpcGetMemHandle(&me.handle, region_));
    me.half = half, me.push = o_.push;
    auto* dev = static_cast<char*>(scratch_);
    const size_t hs = sizeof(Shared);
    MLA_GPU_CHECK(cudaMemcpyAsync(dev + rank_ * hs, &me, hs, cudaMemcpyHostToDevice, st_));
    MLA_NCCL_CHECK(ncclAllGather(dev + rank_ * hs, dev, hs, ncclChar, comm_, st_));
    MLA_GPU_CHECK(cudaMemcpyAsync(all.data(), dev, hs * size_t(size_), cudaMemcpyDeviceToHost, st_));
    MLA_GPU_CHECK(cudaStreamSynchronize(st_));
    for (int r = 0; r < size_; ++r)
      if (all[size_t(r)].half != all[0].half || all[size_t(r)].push != all[0].push)
        fail("nccl communicator: rank {} chose other all-reduce options than rank 0 ({} against {} bytes of "
             "peer buffer, push {} against {}); every rank must pass the same NcclOptions",
             r, all[size_t(r)].half, all[0].half, bool(all[size_t(r)].push), bool(all[0].push));

    p_.rank = rank_;
    p_.half_bytes = half;
    p_.state = state_;
    p_.error = err_dev;
    p_.timeout_ns = uint64_t(o_.barrier_timeout_s * 1e9);
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) {
        p_.region[r] = static_cast<char*>(region_);
        continue;
      }
      void* q = nullptr;
      MLA_GPU_CHECK(cudaIpcOpenMemHandle(&q, all[size_t(r)].handle, cudaIpcMemLazyEnablePeerAccess));
      p_.region[r] = static_cast<char*>(q);
    }
    p_.size = size_;  // our kernels are on
  }

  // Waits until every rank is done with the peer memory (unless a rank is lost), then frees it.
  void release(bool abort) noexcept {
    if (comm_ && !abort && p_.size) {
      (void)cudaStreamSynchronize(st_);
      if (ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, st_) == ncclSuccess)
        (void)cudaStreamSynchronize(st_);
    }
    for (int r = 0; r < cuda::kArMaxRanks; ++r)
      if (p_.region[r] && r != rank_) (void)cudaIpcCloseMemHandle(p_.region[r]);
    if (region_) (void)cudaFree(region_);
    if (state_) (void)cudaFree(state_);
    if (err_host_) (void)cudaFreeHost(err_host_);
    if (scratch_) (void)cudaFree(scratch_);
    if (comm_) (void)(abort ? ncclCommAbort(comm_) : ncclCommDestroy(comm_));
    comm_ = nullptr;
  }

  gpu::GpuOps& ops_;
  cudaStream_t st_;
  NcclOptions o_;
  int rank_, size_;
  ncclComm_t comm_ = nullptr;
  void* scratch_ = nullptr;  // the handles' exchange, then the last barrier
  void* region_ = nullptr;
  uint64_t* state_ = nullptr;
  cuda::ArError* err_host_ = nullptr;
  cuda::ArPeers p_{};
  bool broken_ = false;
  std::string broken_msg_;
};

}  // namespace

std::string nccl_unique_id() {
  ncclUniqueId id;
  MLA_NCCL_CHECK(ncclGetUniqueId(&id));
  return std::string(reinterpret_cast<const char*>(&id), sizeof id);
}

std::unique_ptr<Communicator> nccl_communicator(int rank, int size, const std::string& unique_id, Ops& ops,
                                                const NcclOptions& options) {
  return std::make_unique<NcclCommunicator>(rank, size, unique_id, ops, options);
}

}  // namespace mla
