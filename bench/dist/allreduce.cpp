// bench_allreduce — the all-reduce of the NCCL communicator (mla/nccl.h) on every visible GPU, one
// process per GPU (forked before any CUDA call, CUDA_VISIBLE_DEVICES rotated). For each size from
// 16 KB to 256 MB (bf16): NCCL, one-shot and two-shot (push, and pull: mla/nccl.h) and the default
// choice, each eager (back-to-back
// calls) and inside a CUDA graph of 20 back-to-back all-reduces; µs per call and bus bandwidth
// 2(n−1)/n · bytes / t. The ceiling measured in the same run: a 256 MB cudaMemcpyPeerAsync from
// rank 0's GPU to rank 1's. Prints one JSON object (rank 0) on stdout.
//   NCCL_NVLS_ENABLE=0 bench_allreduce [max_bytes]
#include <nccl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "mla/error.h"
#include "mla/nccl.h"
#include "mla/platform_ops.h"
#include "platform/gpu/gpu_check.h"
#include "platform/gpu/gpu_ops.h"

namespace {

using namespace mla;

void write_all(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t k = ::write(fd, s.data() + done, s.size() - done);
    if (k <= 0) return;
    done += size_t(k);
  }
}

int gpu_count() {
  int fd[2];
  if (::pipe(fd) != 0) return 0;
  const pid_t pid = ::fork();
  if (pid == 0) {
    int c = 0;
    if (cudaGetDeviceCount(&c) != cudaSuccess) c = 0;
    write_all(fd[1], std::to_string(c));
    ::_exit(0);
  }
  ::close(fd[1]);
  char buf[16] = {};
  const ssize_t k = ::read(fd[0], buf, sizeof buf - 1);
  ::close(fd[0]);
  ::waitpid(pid, nullptr, 0);
  return k > 0 ? std::atoi(buf) : 0;
}

struct Timer {
  cudaEvent_t a, b;
  Timer() { cudaEventCreate(&a), cudaEventCreate(&b); }
  ~Timer() { cudaEventDestroy(a), cudaEventDestroy(b); }
  template <typename F>
  double ms(cudaStream_t st, F&& f) {
    MLA_GPU_CHECK(cudaEventRecord(a, st));
    f();
    MLA_GPU_CHECK(cudaEventRecord(b, st));
    MLA_GPU_CHECK(cudaEventSynchronize(b));
    float t = 0;
    MLA_GPU_CHECK(cudaEventElapsedTime(&t, a, b));
    return double(t);
  }
};

nlohmann::json run_rank(int r, int n, const std::vector<std::string>& ids, size_t max_bytes) {
  auto ops = make_ops(Platform::CUDA, DType::BF16);
  const cudaStream_t st = dynamic_cast<gpu::GpuOps&>(*ops).stream();
  NcclOptions one, two, one_pull, two_pull, nccl, def;
  one.one_shot_max_bytes = one.two_shot_max_bytes = max_bytes;
  two.one_shot_max_bytes = 0, two.two_shot_max_bytes = max_bytes;
  one_pull = one, two_pull = two;
  one_pull.push = two_pull.push = false;
  nccl.use_ours = false;
  struct Mode {
    const char* name;
    std::unique_ptr<Communicator> c;
  };
  std::vector<Mode> modes;
  modes.push_back({"nccl", nccl_communicator(r, n, ids[0], *ops, nccl)});
  modes.push_back({"one_shot", nccl_communicator(r, n, ids[1], *ops, one)});
  modes.push_back({"two_shot", nccl_communicator(r, n, ids[2], *ops, two)});
  modes.push_back({"one_shot_pull", nccl_communicator(r, n, ids[3], *ops, one_pull)});
  modes.push_back({"two_shot_pull", nccl_communicator(r, n, ids[4], *ops, two_pull)});
  modes.push_back({"default", nccl_communicator(r, n, ids[5], *ops, def)});
  Timer timer;
  constexpr int kGraphCalls = 20;
  nlohmann::json sizes = nlohmann::json::array();
  for (size_t bytes = 16 << 10; bytes <= max_bytes; bytes *= 2) {
    Tensor x = ops->empty(DType::BF16, {int64_t(bytes / 2)});
    ops->fill_random(x, 1 + uint64_t(r), 1e-3);
    const double bus = 2.0 * (n - 1) / n * double(bytes);
    nlohmann::json row = {{"bytes", bytes}};
    for (Mode& m : modes) {
      const int iters = std::clamp(int(4e8 / double(bytes)), 5, 200);
      for (int i = 0; i < 3; ++i) m.c->all_reduce(x);
      const double eager = timer.ms(st, [&] {
        for (int i = 0; i < iters; ++i) m.c->all_reduce(x);
      }) * 1e3 / iters;
      cudaGraph_t g = nullptr;
      cudaGraphExec_t ge = nullptr;
      MLA_GPU_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
      for (int i = 0; i < kGraphCalls; ++i) m.c->all_reduce(x);
      MLA_GPU_CHECK(cudaStreamEndCapture(st, &g));
      MLA_GPU_CHECK(cudaGraphInstantiate(&ge, g, 0));
      MLA_GPU_CHECK(cudaGraphLaunch(ge, st));
      const int reps = std::clamp(int(2e8 / (double(bytes) * kGraphCalls)), 3, 20);
      const double graph = timer.ms(st, [&] {
        for (int i = 0; i < reps; ++i) MLA_GPU_CHECK(cudaGraphLaunch(ge, st));
      }) * 1e3 / (reps * kGraphCalls);
      MLA_GPU_CHECK(cudaGraphExecDestroy(ge));
      MLA_GPU_CHECK(cudaGraphDestroy(g));
      row[m.name] = {{"eager_us", eager}, {"graph_us", graph}, {"eager_busbw_GBps", bus / eager * 1e-3},
                     {"graph_busbw_GBps", bus / graph * 1e-3}};
    }
    sizes.push_back(row);
  }
  // Decode's residual step: all_reduce + add_rmsnorm against the fused kernel (default options),
  // [M, 7168] bf16, in a graph of 20 steps.
  nlohmann::json fused = nlohmann::json::array();
  Communicator& dc = *modes.back().c;
  for (int64_t M : {1, 8, 32, 64, 128}) {
    const int64_t d = 7168;
    Tensor y = ops->empty(DType::BF16, {M, d}), h = ops->empty(DType::BF16, {M, d}), x = ops->empty(DType::BF16, {M, d});
    Tensor w = ops->empty(DType::BF16, {d});
    ops->fill_random(y, 1 + uint64_t(r), 1e-3), ops->fill_random(h, 9, 1.0), ops->fill_random(w, 7, 1.0);
    nlohmann::json row = {{"rows", M}, {"bytes", M * d * 2}};
    for (bool fuse : {false, true}) {
      auto step = [&] {
        if (fuse) dc.all_reduce_add_rmsnorm(y, h, x, w, 1e-6, *ops);
        else {
          dc.all_reduce(y);
          ops->add_rmsnorm(h, y, x, w, 1e-6);
        }
      };
      cudaGraph_t g = nullptr;
      cudaGraphExec_t ge = nullptr;
      MLA_GPU_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
      for (int i = 0; i < kGraphCalls; ++i) step();
      MLA_GPU_CHECK(cudaStreamEndCapture(st, &g));
      MLA_GPU_CHECK(cudaGraphInstantiate(&ge, g, 0));
      MLA_GPU_CHECK(cudaGraphLaunch(ge, st));
      const int reps = 20;
      const double us = timer.ms(st, [&] {
        for (int i = 0; i < reps; ++i) MLA_GPU_CHECK(cudaGraphLaunch(ge, st));
      }) * 1e3 / (reps * kGraphCalls);
      MLA_GPU_CHECK(cudaGraphExecDestroy(ge));
      MLA_GPU_CHECK(cudaGraphDestroy(g));
      row[fuse ? "fused_graph_us" : "unfused_graph_us"] = us;
    }
    fused.push_back(row);
  }
  nlohmann::json out;
  if (r == 0) {
    // The ceiling: one 256 MB copy from this GPU into the next one, alone on the link.
    const size_t cb = size_t(256) << 20;
    void *src = nullptr, *dst = nullptr;
    MLA_GPU_CHECK(cudaSetDevice(1));
    MLA_GPU_CHECK(cudaMalloc(&dst, cb));
    MLA_GPU_CHECK(cudaSetDevice(0));
    MLA_GPU_CHECK(cudaMalloc(&src, cb));
    if (cudaDeviceEnablePeerAccess(1, 0) != cudaSuccess) (void)cudaGetLastError();  // may be on already
    MLA_GPU_CHECK(cudaMemcpyPeerAsync(dst, 1, src, 0, cb, st));
    const int reps = 5;
    const double ms = timer.ms(st, [&] {
      for (int i = 0; i < reps; ++i) MLA_GPU_CHECK(cudaMemcpyPeerAsync(dst, 1, src, 0, cb, st));
    }) / reps;
    MLA_GPU_CHECK(cudaFree(src));
    MLA_GPU_CHECK(cudaSetDevice(1));
    MLA_GPU_CHECK(cudaFree(dst));
    MLA_GPU_CHECK(cudaSetDevice(0));
    cudaDeviceProp prop{};
    MLA_GPU_CHECK(cudaGetDeviceProperties(&prop, 0));
    int v = 0;
    ncclGetVersion(&v);
    out = {{"gpus", n},
           {"device", prop.name},
           {"nccl_version", v},
           {"peer_copy_GBps", double(cb) / (ms * 1e-3) * 1e-9},
           {"default_one_shot_max_bytes", def.one_shot_max_bytes},
           {"default_two_shot_max_bytes", def.two_shot_max_bytes},
           {"default_push", def.push},
           {"graph_calls", kGraphCalls},
           {"sizes", sizes},
           {"all_reduce_add_rmsnorm", fused}};
  }
  // Every rank waits here for rank 0's copy, so that the communicators are freed together.
  Tensor one_elem = ops->empty(DType::F32, {1});
  ops->fill(one_elem, 1.0);
  modes[0].c->all_reduce(one_elem);
  ops->synchronize();
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const size_t max_bytes = argc > 1 ? size_t(std::atoll(argv[1])) : size_t(256) << 20;
  const int n = std::min(gpu_count(), 8);
  if (n < 2) {
    std::fprintf(stderr, "bench_allreduce: needs 2 or more CUDA GPUs (found %d)\n", n);
    return 2;
  }
  std::vector<std::string> gpus;
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES"); v && *v) {
    std::string s = v;
    for (size_t p = 0; p <= s.size();) {
      const size_t q = std::min(s.find(',', p), s.size());
      gpus.push_back(s.substr(p, q - p));
      p = q + 1;
    }
  }
  if (int(gpus.size()) < n) {
    gpus.clear();
    for (int i = 0; i < n; ++i) gpus.push_back(std::to_string(i));
  }
  const size_t un = static_cast<size_t>(n);
  std::vector<int> rd(un), wr(un);
  for (int r = 0; r < n; ++r) {
    int p[2];
    if (::pipe(p) != 0) return 1;
    rd[size_t(r)] = p[0], wr[size_t(r)] = p[1];
  }
  std::vector<pid_t> pids;
  constexpr int kIds = 6;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = ::fork();
    if (pid != 0) {
      pids.push_back(pid);
      continue;
    }
    std::string vis;
    for (int i = 0; i < n; ++i) vis += (i ? "," : "") + gpus[size_t((r + i) % n)];
    ::setenv("CUDA_VISIBLE_DEVICES", vis.c_str(), 1);
    ::setenv("NCCL_NVLS_ENABLE", "0", 1);
    try {
      std::vector<std::string> ids;
      if (r == 0) {
        std::string all;
        for (int i = 0; i < kIds; ++i) ids.push_back(nccl_unique_id()), all += ids.back();
        for (int q = 1; q < n; ++q) write_all(wr[size_t(q)], all);
      } else {
        std::string all(kIds * 128, '\0');
        size_t done = 0;
        while (done < all.size()) {
          const ssize_t k = ::read(rd[size_t(r)], all.data() + done, all.size() - done);
          if (k <= 0) fail("rank {}: the NCCL ids did not arrive", r);
          done += size_t(k);
        }
        for (int i = 0; i < kIds; ++i) ids.push_back(all.substr(size_t(i) * 128, 128));
      }
      const nlohmann::json out = run_rank(r, n, ids, max_bytes);
      if (r == 0) std::printf("%s\n", out.dump(1).c_str());
      std::fflush(stdout);
      ::_exit(0);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench_allreduce rank %d: %s\n", r, e.what());
      ::_exit(1);
    }
  }
  int rc = 0;
  for (pid_t p : pids) {
    int status = 0;
    ::waitpid(p, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = 1;
  }
  return rc;
}
