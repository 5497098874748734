// The in-process communicator: TP ranks as threads of one process. Collectives against sums made
// here in rank order; every rank gets the same bits; disagreeing ranks all fail, none hangs.
#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include "harness.h"
#include "mla/communicator.h"
#include "mla/error.h"
#include "mla/platform_ops.h"
#include "mla/random.h"

namespace mla {
namespace {

// Runs f(rank, communicator, ops) on `n` threads, one rank each, on platform p.
template <typename F>
void run_ranks(int n, Platform p, DType act, F f) {
  InProcessGroup g(n);
  std::vector<std::unique_ptr<Ops>> ops;
  for (int r = 0; r < n; ++r) ops.push_back(make_ops(p, act));
  std::vector<std::thread> threads;
  std::vector<std::string> errors(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        auto c = g.communicator(r, *ops[size_t(r)]);
        f(r, *c, *ops[size_t(r)]);
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[size_t(r)], "") << "rank " << r;
}

std::vector<Platform> platforms() {
  std::vector<Platform> v{Platform::CPU};
  if (platform_available(Platform::CUDA)) v.push_back(Platform::CUDA);
  return v;
}

// rank r's input: element i = hash_normalish(100 + r, i)
Tensor input(Ops& ops, DType t, int r, int64_t n) {
  Tensor x = ops.empty(t, {n});
  ops.fill_random(x, uint64_t(100 + r), 1.0);
  return x;
}

TEST(InProcess, AllReduceSumsInRankOrderInF32RoundedOnce) {
  for (Platform p : platforms())
    for (DType t : {DType::F32, DType::BF16})
      for (int n : {1, 2, 3, 4, 8}) {
        const int64_t len = 1000;
        std::vector<std::vector<char>> got(static_cast<size_t>(n));
        run_ranks(n, p, t, [&](int r, Communicator& c, Ops& ops) {
          EXPECT_EQ(c.rank(), r);
          EXPECT_EQ(c.size(), n);
          Tensor x = input(ops, t, r, len);
          c.all_reduce(x);
          const Tensor h = ops.download(x);
          got[size_t(r)].assign(static_cast<const char*>(h.data()), static_cast<const char*>(h.data()) + h.nbytes());
        });
        // The same sum here: each rank's values as stored, added in f32 in rank order, rounded once.
        std::vector<char> want(size_t(len) * dtype_size(t));
        for (int64_t i = 0; i < len; ++i) {
          float acc = 0;
          for (int r = 0; r < n; ++r) {
            const float v = hash_normalish(uint64_t(100 + r), uint64_t(i), 1.f);
            const float stored = t == DType::BF16 ? bf16_to_float(float_to_bf16(v)) : v;
            acc = r == 0 ? stored : acc + stored;
          }
          store_from_double(want.data(), t, size_t(i), acc);
        }
        for (int r = 0; r < n; ++r)
          EXPECT_EQ(got[size_t(r)], want) << platform_name(p) << " " << dtype_name(t) << " size " << n << " rank " << r;
      }
}

TEST(InProcess, AllGatherReduceScatterBroadcast) {
  for (Platform p : platforms()) {
    const int n = 4;
    const int64_t m = 300;
    run_ranks(n, p, DType::F32, [&](int r, Communicator& c, Ops& ops) {
      Tensor x = input(ops, DType::F32, r, m);
      Tensor all = ops.empty(DType::F32, {n * m});
      c.all_gather(x, all);
      const Tensor h = ops.download(all);
      for (int q = 0; q < n; ++q)
        for (int64_t i = 0; i < m; ++i)
          ASSERT_EQ(h.ptr<float>()[q * m + i], hash_normalish(uint64_t(100 + q), uint64_t(i), 1.f)) << q << " " << i;
      Tensor big = input(ops, DType::F32, r, n * m), mine = ops.empty(DType::F32, {m});
      c.reduce_scatter(big, mine);
      Tensor whole = input(ops, DType::F32, r, n * m);
      c.all_reduce(whole);
      const Tensor a = ops.download(mine), b = ops.download(whole);
      EXPECT_EQ(0, std::memcmp(a.data(), b.ptr<float>() + r * m, size_t(m) * 4)) << "rank " << r;
      Tensor y = input(ops, DType::F32, r, m);
      c.broadcast(y, 2);
      const Tensor yb = ops.download(y);
      for (int64_t i = 0; i < m; ++i) ASSERT_EQ(yb.ptr<float>()[i], hash_normalish(102, uint64_t(i), 1.f));
    });
  }
}

TEST(InProcess, RanksThatDisagreeAllFailAndNoneHangs) {
  const int n = 3;
  InProcessGroup g(n);
  std::vector<std::unique_ptr<Ops>> ops;
  for (int r = 0; r < n; ++r) ops.push_back(make_ops(Platform::CPU, DType::F32));
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      auto c = g.communicator(r, *ops[size_t(r)]);
      Tensor x = ops[size_t(r)]->empty(DType::F32, {r == 1 ? 7 : 8});
      try {
        c->all_reduce(x);
      } catch (const Error& e) {
        errors[size_t(r)] = e.what();
      }
      Tensor y = ops[size_t(r)]->empty(DType::F32, {4});  // the group is still usable afterwards
      ops[size_t(r)]->fill(y, 1.0);
      c->all_reduce(y);
      EXPECT_EQ(ops[size_t(r)]->download(y).ptr<float>()[3], float(n));
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r)
    EXPECT_NE(errors[size_t(r)].find("all_reduce: rank 1 gave f32 [7]"), std::string::npos) << errors[size_t(r)];
  expect_error([] { InProcessGroup bad(0); }, {"size must be at least 1"});
  expect_error([&] { g.communicator(3, *ops[0]); }, {"rank 3 is outside [0, 3)"});
}

// A rank whose thread fails aborts the group: the ranks waiting for it in a collective fail with the
// reason, and so does every later collective.
TEST(InProcess, AnAbortedGroupFailsItsWaitingRanks) {
  const int n = 3;
  InProcessGroup g(n);
  std::vector<std::unique_ptr<Ops>> ops;
  for (int r = 0; r < n; ++r) ops.push_back(make_ops(Platform::CPU, DType::F32));
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      auto c = g.communicator(r, *ops[size_t(r)]);
      Tensor x = ops[size_t(r)]->empty(DType::F32, {8});
      if (r == 2) return g.abort("rank 2 failed");
      try {
        c->all_reduce(x);
      } catch (const Error& e) {
        errors[size_t(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) EXPECT_EQ(errors[size_t(r)], "in-process group: rank 2 failed") << "rank " << r;
  auto c = g.communicator(0, *ops[0]);
  Tensor y = ops[0]->empty(DType::F32, {4});
  expect_error([&] { c->all_reduce(y); }, "in-process group: rank 2 failed");
}

}  // namespace
}  // namespace mla
