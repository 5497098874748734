// The NCCL communicator (mla/nccl.h) on every visible GPU, one process per GPU, forked before any
// CUDA call with CUDA_VISIBLE_DEVICES rotated so that device 0 is the rank's own GPU; rank 0 makes
// the NCCL ids and hands them over through pipes. Our all-reduces (one-shot, two-shot, fused with
// add + RMSNorm) against sums made here in rank order (the same bits), NCCL's within rounding, CUDA
// graph replays against eager runs, and ranks that disagree: every rank fails, none hangs.
#include <gtest/gtest.h>

#if defined(MLA_WITH_CUDA)
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "mla/dtype.h"
#include "mla/error.h"
#include "mla/nccl.h"
#include "mla/platform_ops.h"
#include "mla/random.h"
#include "platform/gpu/gpu_ops.h"
#endif

namespace mla {
namespace {

#if !defined(MLA_WITH_CUDA)

TEST(Nccl, NeedsCuda) { GTEST_SKIP() << "this build has no CUDA platform (the NCCL communicator needs it)"; }

#else

// ---- one process per GPU -----------------------------------------------------------------------

void write_all(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t k = ::write(fd, s.data() + done, s.size() - done);
    if (k <= 0) return;
    done += size_t(k);
  }
}
std::string read_exactly(int fd, size_t n) {
  std::string s(n, '\0');
  size_t done = 0;
  while (done < n) {
    const ssize_t k = ::read(fd, s.data() + done, n - done);
    if (k <= 0) fail("rank setup: the NCCL ids did not arrive");
    done += size_t(k);
  }
  return s;
}

// The GPUs this machine shows, counted in a child: this process must not start CUDA before forking.
int gpu_count() {
  static int count = -1;
  if (count >= 0) return count;
  int fd[2];
  if (::pipe(fd) != 0) return count = 0;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fd[0]);
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
  return count = k > 0 ? std::atoi(buf) : 0;
}

std::vector<std::string> visible_gpus(int n) {
  std::vector<std::string> ids;
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES"); v && *v) {
    std::stringstream ss(v);
    for (std::string s; std::getline(ss, s, ',');) ids.push_back(s);
  }
  if (int(ids.size()) < n) {
    ids.clear();
    for (int i = 0; i < n; ++i) ids.push_back(std::to_string(i));
  }
  ids.resize(size_t(n));
  return ids;
}

using RankFn = std::function<std::string(int rank, int n, const std::vector<std::string>& ids)>;

// Runs f on every GPU, one forked process each; f returns its failures ("" when none). `num_ids`
// NCCL unique ids (one per communicator) come from rank 0. Returns each rank's report; a rank that
// does not finish within `timeout_s` is killed and reported as hung.
std::vector<std::string> run_ranks(int n, int num_ids, const RankFn& f, int timeout_s = 240) {
  const std::vector<std::string> gpus = visible_gpus(n);
  const size_t un = static_cast<size_t>(n);
  std::vector<int> id_rd(un), id_wr(un), res_rd(un), res_wr(un);
  for (int r = 0; r < n; ++r) {
    int a[2], b[2];
    if (::pipe(a) != 0 || ::pipe(b) != 0) return {"pipe failed"};
    id_rd[size_t(r)] = a[0], id_wr[size_t(r)] = a[1], res_rd[size_t(r)] = b[0], res_wr[size_t(r)] = b[1];
  }
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      std::string vis;
      for (int i = 0; i < n; ++i) vis += (i ? "," : "") + gpus[size_t((r + i) % n)];
      ::setenv("CUDA_VISIBLE_DEVICES", vis.c_str(), 1);
      ::setenv("NCCL_NVLS_ENABLE", "0", 1);
      for (int q = 0; q < n; ++q) {
        ::close(res_rd[size_t(q)]);
        if (q != r) ::close(res_wr[size_t(q)]), ::close(id_rd[size_t(q)]);
        if (r != 0) ::close(id_wr[size_t(q)]);
      }
      std::string out;
      try {
        std::vector<std::string> ids;
        if (r == 0) {
          std::string all;
          for (int i = 0; i < num_ids; ++i) ids.push_back(nccl_unique_id()), all += ids.back();
          for (int q = 1; q < n; ++q) write_all(id_wr[size_t(q)], all);
        } else {
          const std::string all = read_exactly(id_rd[size_t(r)], size_t(num_ids) * 128);
          for (int i = 0; i < num_ids; ++i) ids.push_back(all.substr(size_t(i) * 128, 128));
        }
        out = f(r, n, ids);
      } catch (const std::exception& e) {
        out = std::string("threw: ") + e.what();
      }
      write_all(res_wr[size_t(r)], out);
      ::_exit(0);
    }
    pids.push_back(pid);
  }
  for (int r = 0; r < n; ++r) ::close(id_rd[size_t(r)]), ::close(id_wr[size_t(r)]), ::close(res_wr[size_t(r)]);
  std::vector<std::string> out(static_cast<size_t>(n));
  std::vector<bool> open(un, true);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  int left = n;
  while (left > 0) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) break;
    std::vector<pollfd> fds;
    std::vector<int> who;
    for (int r = 0; r < n; ++r)
      if (open[size_t(r)]) fds.push_back({res_rd[size_t(r)], POLLIN, 0}), who.push_back(r);
    const int ms = int(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count());
    if (::poll(fds.data(), fds.size(), ms) <= 0) continue;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP))) continue;
      char buf[4096];
      const ssize_t k = ::read(fds[i].fd, buf, sizeof buf);
      if (k > 0) out[size_t(who[i])].append(buf, size_t(k));
      else open[size_t(who[i])] = false, --left;
    }
  }
  for (int r = 0; r < n; ++r) {
    if (open[size_t(r)]) {
      out[size_t(r)] += fmt::format("rank {} hung (killed after {} s)", r, timeout_s);
      ::kill(pids[size_t(r)], SIGKILL);
    }
    ::close(res_rd[size_t(r)]);
    ::waitpid(pids[size_t(r)], nullptr, 0);
  }
  return out;
}

// Runs f on every GPU and expects no rank to report a failure.
void on_every_gpu(int num_ids, const RankFn& f) {
  const int n = gpu_count();
  if (n < 2) GTEST_SKIP() << "needs 2 or more CUDA GPUs (found " << n << ")";
  const std::vector<std::string> out = run_ranks(std::min(n, 8), num_ids, f);
  for (size_t r = 0; r < out.size(); ++r) {
    std::stringstream ss(out[r]);
    for (std::string line; std::getline(ss, line);)
      if (line.rfind("note: ", 0) == 0) std::printf("rank %zu %s\n", r, line.c_str());
      else ADD_FAILURE() << "rank " << r << ": " << line;
  }
}

// ---- checks inside a rank ----------------------------------------------------------------------

struct Report {
  std::string text;
  int failures = 0;
  template <typename... A>
  void fail(fmt::format_string<A...> f, A&&... a) {
    if (++failures <= 20) text += fmt::format(f, std::forward<A>(a)...) + "\n";
  }
  template <typename... A>
  void note(fmt::format_string<A...> f, A&&... a) {
    text += "note: " + fmt::format(f, std::forward<A>(a)...) + "\n";
  }
};

gpu::GpuOps& gpu_ops(Ops& ops) { return dynamic_cast<gpu::GpuOps&>(ops); }

// rank r's input: element i = hash_normalish(seed + r, i), stored as t
Tensor input(Ops& ops, DType t, uint64_t seed, int64_t n) {
  Tensor x = ops.empty(t, {n});
  ops.fill_random(x, seed, 1.0);
  return x;
}
float stored(DType t, uint64_t seed, int64_t i) {
  const float v = hash_normalish(seed, uint64_t(i), 1.f);
  return t == DType::BF16 ? bf16_to_float(float_to_bf16(v)) : v;
}

// What every rank's all_reduce must give: the stored inputs summed in f32 in rank order, rounded
// once (the in-process rule); and Σ_r |x_r| for the tolerance of NCCL's order.
struct Want {
  std::vector<char> bits;
  std::vector<double> exact, magnitude;
};
Want rank_order_sum(DType t, int n, int64_t len, uint64_t seed) {
  Want w;
  w.bits.resize(size_t(len) * dtype_size(t));
  w.exact.resize(size_t(len));
  w.magnitude.resize(size_t(len));
  for (int64_t i = 0; i < len; ++i) {
    float acc = 0;
    double ex = 0, mag = 0;
    for (int r = 0; r < n; ++r) {
      const float v = stored(t, seed + uint64_t(r), i);
      acc = r == 0 ? v : acc + v;
      ex += v, mag += std::fabs(v);
    }
    store_from_double(w.bits.data(), t, size_t(i), acc);
    w.exact[size_t(i)] = ex, w.magnitude[size_t(i)] = mag;
  }
  return w;
}

// The first element whose bits differ, or -1.
int64_t first_difference(const Tensor& host, const std::vector<char>& want) {
  if (host.nbytes() != want.size()) return 0;
  if (std::memcmp(host.data(), want.data(), want.size()) == 0) return -1;
  const size_t es = dtype_size(host.dtype());
  for (size_t i = 0; i * es < want.size(); ++i)
    if (std::memcmp(static_cast<const char*>(host.data()) + i * es, want.data() + i * es, es) != 0) return int64_t(i);
  return -1;
}

// Largest |got − exact| / (ε · Σ|x_r|) (ε: the dtype's unit roundoff); checked against n (one rounding
// per addition, and the final one).
double rounding_ratio(const Tensor& host, const Want& w) {
  const double eps = host.dtype() == DType::BF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -24);
  double worst = 0;
  for (size_t i = 0; i < w.exact.size(); ++i) {
    const double err = std::fabs(host.at(i) - w.exact[i]);
    worst = std::max(worst, w.magnitude[i] > 0 ? err / (eps * w.magnitude[i]) : (err > 0 ? 1e30 : 0.0));
  }
  return worst;
}

NcclOptions one_shot_only(bool push = true) {
  NcclOptions o;
  o.one_shot_max_bytes = o.two_shot_max_bytes = size_t(64) << 20;
  o.push = push;
  return o;
}
NcclOptions two_shot_only(bool push = true) {
  NcclOptions o;
  o.one_shot_max_bytes = 0;
  o.two_shot_max_bytes = size_t(64) << 20;
  o.push = push;
  return o;
}
NcclOptions nccl_only() {
  NcclOptions o;
  o.use_ours = false;
  return o;
}

// ---- the tests ---------------------------------------------------------------------------------

TEST(Nccl, AllReduceOursGiveRankOrderBitsNcclWithinRounding) {
  on_every_gpu(6, [](int r, int n, const std::vector<std::string>& ids) {
    Report rep;
    auto ops = make_ops(Platform::CUDA, DType::BF16);
    struct Path {
      const char* name;
      std::unique_ptr<Communicator> c;
      bool exact;
    };
    std::vector<Path> paths;
    paths.push_back({"default", nccl_communicator(r, n, ids[0], *ops), false});  // ours up to two_shot_max_bytes
    paths.push_back({"one-shot push", nccl_communicator(r, n, ids[1], *ops, one_shot_only(true)), true});
    paths.push_back({"one-shot pull", nccl_communicator(r, n, ids[2], *ops, one_shot_only(false)), true});
    paths.push_back({"two-shot push", nccl_communicator(r, n, ids[3], *ops, two_shot_only(true)), true});
    paths.push_back({"two-shot pull", nccl_communicator(r, n, ids[4], *ops, two_shot_only(false)), true});
    paths.push_back({"nccl", nccl_communicator(r, n, ids[5], *ops, nccl_only()), false});
    for (DType t : {DType::F32, DType::BF16})
      for (int64_t len : {int64_t(1), int64_t(3), int64_t(1000), int64_t(128 * 7168),
                          int64_t((64 << 20) / dtype_size(t))}) {
        const Want w = rank_order_sum(t, n, len, 100);
        for (Path& p : paths) {
          Tensor x = input(*ops, t, 100 + uint64_t(r), len);
          p.c->all_reduce(x);
          const Tensor h = ops->download(x);
          const int64_t bad = first_difference(h, w.bits);
          const double ratio = rounding_ratio(h, w);
          const bool exact = p.exact || (p.c == paths[0].c && h.nbytes() <= NcclOptions{}.two_shot_max_bytes);
          if (exact && bad >= 0)
            rep.fail("{} {} [{}]: element {} is {}, the rank-order sum {}", p.name, dtype_name(t), len, bad, h.at(size_t(bad)),
                     load_as_double(w.bits.data(), t, size_t(bad)));
          if (ratio > n)
            rep.fail("{} {} [{}]: off the exact sum by {} ε·Σ|x| (allowed {})", p.name, dtype_name(t), len, ratio, n);
          if (!exact && r == 0 && len >= 1000)
            rep.note("{} {} [{}]: {} rank-order bits, worst {:.3f} ε·Σ|x|", p.name, dtype_name(t), len,
                     bad < 0 ? "same" : "not the", ratio);
        }
      }
    return rep.text;
  });
}

TEST(Nccl, GatherScatterBroadcastThroughNccl) {
  on_every_gpu(1, [](int r, int n, const std::vector<std::string>& ids) {
    Report rep;
    auto ops = make_ops(Platform::CUDA, DType::BF16);
    auto c = nccl_communicator(r, n, ids[0], *ops);
    for (DType t : {DType::F32, DType::BF16})
      for (int64_t m : {int64_t(1000), int64_t(128 * 7168)}) {
        Tensor x = input(*ops, t, 200 + uint64_t(r), m), all = ops->empty(t, {n * m});
        c->all_gather(x, all);
        const Tensor ha = ops->download(all);
        for (int q = 0; q < n; ++q)
          for (int64_t i = 0; i < m; ++i)
            if (ha.at(size_t(q * m + i)) != stored(t, 200 + uint64_t(q), i)) {
              rep.fail("all_gather {} [{}]: rank {}'s element {} is {}", dtype_name(t), m, q, i, ha.at(size_t(q * m + i)));
              break;
            }
        // reduce_scatter: slice r of the sum of every rank's [n · m] input
        const Want w = rank_order_sum(t, n, n * m, 300);
        Tensor big = input(*ops, t, 300 + uint64_t(r), n * m), mine = ops->empty(t, {m});
        c->reduce_scatter(big, mine);
        const Tensor hm = ops->download(mine);
        Want slice;
        slice.exact.assign(w.exact.begin() + r * m, w.exact.begin() + (r + 1) * m);
        slice.magnitude.assign(w.magnitude.begin() + r * m, w.magnitude.begin() + (r + 1) * m);
        const double ratio = rounding_ratio(hm, slice);
        if (ratio > n) rep.fail("reduce_scatter {} [{}]: off the exact sum by {} ε·Σ|x|", dtype_name(t), m, ratio);
        Tensor y = input(*ops, t, 400 + uint64_t(r), m);
        c->broadcast(y, n - 1);
        const Tensor hy = ops->download(y);
        for (int64_t i = 0; i < m; ++i)
          if (hy.at(size_t(i)) != stored(t, 400 + uint64_t(n - 1), i)) {
            rep.fail("broadcast {} [{}]: element {} is {}", dtype_name(t), m, i, hy.at(size_t(i)));
            break;
          }
      }
    // Shapes that cannot work fail at once, on this rank, before any collective.
    Tensor a = ops->empty(DType::F32, {10}), b = ops->empty(DType::F32, {10 * n + 1});
    try {
      c->all_gather(a, b);
      rep.fail("all_gather into a wrong-sized output did not throw");
    } catch (const Error& e) {
      if (std::string(e.what()).find("needs an output of") == std::string::npos) rep.fail("all_gather: {}", e.what());
    }
    return rep.text;
  });
}

// A graph of: fill, three all-reduces back to back (a fused step on the fused path); replayed twice,
// each replay gives the eager bits.
TEST(Nccl, GraphReplaysGiveEagerBits) {
  on_every_gpu(5, [](int r, int n, const std::vector<std::string>& ids) {
    Report rep;
    auto ops = make_ops(Platform::CUDA, DType::BF16);
    const cudaStream_t st = gpu_ops(*ops).stream();
    struct Path {
      const char* name;
      std::unique_ptr<Communicator> c;
    };
    std::vector<Path> paths;
    paths.push_back({"one-shot push", nccl_communicator(r, n, ids[0], *ops, one_shot_only(true))});
    paths.push_back({"one-shot pull", nccl_communicator(r, n, ids[1], *ops, one_shot_only(false))});
    paths.push_back({"two-shot push", nccl_communicator(r, n, ids[2], *ops, two_shot_only(true))});
    paths.push_back({"two-shot pull", nccl_communicator(r, n, ids[3], *ops, two_shot_only(false))});
    paths.push_back({"nccl", nccl_communicator(r, n, ids[4], *ops, nccl_only())});
    for (Path& p : paths)
      for (DType t : {DType::F32, DType::BF16})
        for (int64_t len : {int64_t(1000), int64_t(128 * 7168), int64_t(3 << 20)}) {
          Tensor x = ops->empty(t, {len});
          auto step = [&] {
            ops->fill_random(x, 500 + uint64_t(r), 1.0);
            for (int k = 0; k < 3; ++k) p.c->all_reduce(x);
          };
          step();
          const Tensor eager = ops->download(x);
          std::vector<char> want(static_cast<const char*>(eager.data()),
                                 static_cast<const char*>(eager.data()) + eager.nbytes());
          cudaGraph_t g = nullptr;
          cudaGraphExec_t ge = nullptr;
          if (cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) != cudaSuccess)
            return std::string("begin capture failed\n");
          step();
          if (cudaStreamEndCapture(st, &g) != cudaSuccess || cudaGraphInstantiate(&ge, g, 0) != cudaSuccess)
            return std::string("capture failed\n");
          for (int replay = 0; replay < 2; ++replay) {
            ops->fill(x, 0.0);
            if (cudaGraphLaunch(ge, st) != cudaSuccess) return std::string("graph launch failed\n");
            const int64_t bad = first_difference(ops->download(x), want);
            if (bad >= 0 && std::string(p.name) == "nccl")  // NCCL promises no more than rounding
              rep.note("nccl {} [{}] replay {}: element {} differs from the eager run", dtype_name(t), len, replay, bad);
            else if (bad >= 0)
              rep.fail("{} {} [{}] replay {}: element {} differs from the eager run", p.name, dtype_name(t), len, replay,
                       bad);
          }
          cudaGraphExecDestroy(ge);
          cudaGraphDestroy(g);
        }
    return rep.text;
  });
}

// all_reduce_add_rmsnorm: the fused kernel against all_reduce + Ops::add_rmsnorm, every output bit
// for bit, eager and in a graph.
TEST(Nccl, FusedAddRmsnormGivesUnfusedBits) {
  on_every_gpu(2, [](int r, int n, const std::vector<std::string>& ids) {
    Report rep;
    auto ops = make_ops(Platform::CUDA, DType::BF16);
    const cudaStream_t st = gpu_ops(*ops).stream();
    auto fused = nccl_communicator(r, n, ids[0], *ops, one_shot_only());
    auto plain = nccl_communicator(r, n, ids[1], *ops, one_shot_only());
    struct Case {
      int64_t M, d;
      DType h, y;
    };
    for (const Case& k : {Case{1, 7168, DType::BF16, DType::BF16}, Case{37, 1000, DType::BF16, DType::BF16},
                          Case{64, 7168, DType::BF16, DType::BF16}, Case{5, 7168, DType::F32, DType::F32},
                          Case{16, 2048, DType::BF16, DType::F32}}) {
      const std::string what = fmt::format("h {} y {} [{}, {}]", dtype_name(k.h), dtype_name(k.y), k.M, k.d);
      Tensor w = ops->empty(DType::BF16, {k.d});
      ops->fill_random(w, 7, 1.0);
      auto run = [&](bool use_fused, bool graph) {
        Tensor y = ops->empty(k.y, {k.M, k.d}), h = ops->empty(k.h, {k.M, k.d}), x = ops->empty(k.h, {k.M, k.d});
        auto step = [&] {
          ops->fill_random(y, 600 + uint64_t(r), 1.0);
          ops->fill_random(h, 700, 4.0);
          for (int rep2 = 0; rep2 < 2; ++rep2) {  // twice: h and x carry over
            if (use_fused) fused->all_reduce_add_rmsnorm(y, h, x, w, 1e-6, *ops);
            else {
              plain->all_reduce(y);
              ops->add_rmsnorm(h, y, x, w, 1e-6);
            }
          }
        };
        if (!graph) step();
        else {
          cudaGraph_t g = nullptr;
          cudaGraphExec_t ge = nullptr;
          if (cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) != cudaSuccess) fail("capture");
          step();
          if (cudaStreamEndCapture(st, &g) != cudaSuccess || cudaGraphInstantiate(&ge, g, 0) != cudaSuccess) fail("capture");
          if (cudaGraphLaunch(ge, st) != cudaSuccess) fail("graph launch");
          ops->synchronize();
          cudaGraphExecDestroy(ge);
          cudaGraphDestroy(g);
        }
        std::vector<std::vector<char>> out;
        for (const Tensor* t : {&y, &h, &x}) {
          const Tensor hst = ops->download(*t);
          out.emplace_back(static_cast<const char*>(hst.data()), static_cast<const char*>(hst.data()) + hst.nbytes());
        }
        return out;
      };
      const auto want = run(false, false);
      for (bool graph : {false, true}) {
        const auto got = run(true, graph);
        const char* names[] = {"y", "h", "x"};
        for (int i = 0; i < 3; ++i)
          if (got[size_t(i)] != want[size_t(i)])
            rep.fail("{}{}: fused {} differs from all_reduce + add_rmsnorm", what, graph ? " (graph)" : "", names[i]);
      }
    }
    return rep.text;
  });
}

// Ranks that disagree on an all-reduce's size: nothing hangs, every rank's next collective throws
// naming both sides, and the group works afterwards.
TEST(Nccl, RanksThatDisagreeAllFailAndNoneHangs) {
  on_every_gpu(1, [](int r, int n, const std::vector<std::string>& ids) {
    Report rep;
    auto ops = make_ops(Platform::CUDA, DType::BF16);
    NcclOptions o;
    o.barrier_timeout_s = 20;
    auto c = nccl_communicator(r, n, ids[0], *ops, o);
    // 7 against 8 elements (one-shot on both), then 2M f32 (two-shot) against 8 (one-shot)
    for (int64_t odd : {int64_t(7), int64_t(2) << 20}) {
      Tensor x = ops->empty(DType::F32, {r == 1 ? odd : 8});
      ops->fill(x, 1.0);
      c->all_reduce(x);
      ops->synchronize();
      Tensor y = ops->empty(DType::F32, {4});
      ops->fill(y, 1.0);
      const std::string other =
          r == 1 ? "rank 0 called all_reduce (one-shot push) of 8 f32"
                 : fmt::format("rank 1 called all_reduce ({} push) of {} f32", odd == 7 ? "one-shot" : "two-shot", odd);
      try {
        c->all_reduce(y);
        rep.fail("size {}: no error after ranks disagreed", odd);
      } catch (const Error& e) {
        const std::string msg = e.what();
        if (msg.find("ranks disagree") == std::string::npos || msg.find(other) == std::string::npos)
          rep.fail("size {}: message '{}' lacks '{}'", odd, msg, other);
      }
      c->all_reduce(y);  // usable again
      const Tensor h = ops->download(y);
      if (h.at(3) != double(n)) rep.fail("size {}: the all_reduce after the error gave {}", odd, h.at(3));
    }
    return rep.text;
  });
}

// Disagreeing on an NCCL collective: the check before it stops the device on both sides (the NCCL
// call never runs, nothing hangs), and the next collective names the disagreement.
TEST(Nccl, DisagreementBeforeNcclStopsTheDeviceInsteadOfHanging) {
  on_every_gpu(1, [](int r, int n, const std::vector<std::string>& ids) {
    Report rep;
    // Never destroyed: CUDA is unusable in this process afterwards.
    Ops* ops = make_ops(Platform::CUDA, DType::BF16).release();
    Communicator* c = nccl_communicator(r, n, ids[0], *ops).release();
    Tensor x = ops->empty(DType::F32, {r == 1 ? 7 : 8}), out = ops->empty(DType::F32, {n * (r == 1 ? 7 : 8)});
    c->all_gather(x, out);
    try {
      ops->synchronize();
      rep.fail("the device did not stop");
    } catch (const Error&) {
    }
    try {
      c->broadcast(x, 0);
      rep.fail("no error after ranks disagreed");
    } catch (const Error& e) {
      const std::string other = r == 1 ? "rank 0 called all_gather of 8 f32" : "rank 1 called all_gather of 7 f32";
      if (std::string(e.what()).find(other) == std::string::npos) rep.fail("message '{}' lacks '{}'", e.what(), other);
    }
    return rep.text;
  });
}

#endif

}  // namespace
}  // namespace mla
