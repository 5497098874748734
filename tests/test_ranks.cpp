// The processes of a tensor-parallel group: ranks as forked processes joining over 127.0.0.1, rank 0's
// control channel, the socket communicator against sums made here (the in-process group's bits), the
// errors of joining, a lost peer ending the survivors, and starting a host's ranks as children.
// Processes are forked from a process without threads (gtest runs single-threaded, and the CPU Ops'
// worker threads only ever start in a forked rank); a forked rank reports through its exit status
// (0 only when none of its checks failed).
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#include "harness.h"
#include "mla/communicator.h"
#include "mla/error.h"
#include "mla/platform_ops.h"
#include "mla/random.h"
#include "mla/ranks.h"

namespace mla {
namespace {

using Clock = std::chrono::steady_clock;

// In a forked rank: dies with the test process, and never outlives a hang by long.
void child_setup() {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  ::alarm(30);
}

// Runs f(rank, group) on `n` ranks, each a forked process (this one only waits: the CPU Ops' worker
// threads must never exist in a process that forks ranks). A rank exits 0 only when f threw nothing and
// failed no check; here every rank's status is checked.
template <typename F>
void run_group(int n, F f, GroupOptions o = {}) {
  o.size = n;
  o.timeout_s = 20;
  std::optional<Rendezvous> rv(Rendezvous::listen(o));
  o.init_addr = rv->address();
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> kids;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      child_setup();
      if (r > 0) rv.reset();  // only rank 0 listens
      o.node_rank = node_of(o, r);
      int code = 0;
      try {
        auto g = r == 0 ? rv->accept() : RankGroup::connect(o, r);
        f(r, *g);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d threw: %s\n", r, e.what());
        code = 2;
      }
      if (::testing::Test::HasFailure()) code = 1;
      std::fflush(stdout);
      std::fflush(stderr);
      ::_exit(code);
    }
    kids.push_back(pid);
  }
  rv.reset();
  for (size_t i = 0; i < kids.size(); ++i) {
    int st = 0;
    ASSERT_EQ(::waitpid(kids[i], &st, 0), kids[i]);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0)
        << "rank " << i << ": " << (WIFEXITED(st) ? "exit status " : "signal ")
        << (WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
  }
}

// Memory shared by the forked ranks (made before the fork).
template <typename T>
T* shared_array(size_t n) {
  void* p = ::mmap(nullptr, sizeof(T) * n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  EXPECT_NE(p, MAP_FAILED);
  return new (p) T[n]();
}

std::string pattern(size_t n, uint32_t seed) {
  std::string s(n, '\0');
  uint32_t x = seed;
  for (char& c : s) {
    x = x * 1664525u + 1013904223u;
    c = char(x >> 24);  // every byte value, '\0' included
  }
  return s;
}

TEST(Ranks, JoinBroadcastInOrderAndBarrier) {
  for (int n : {2, 3, 4}) {
    std::atomic<int>* arrived = shared_array<std::atomic<int>>(2);
    const std::vector<std::string> msgs{"", "hello", pattern(8u << 20, 7), std::string(1, '\0'), "last"};
    run_group(n, [&](int r, RankGroup& g) {
      EXPECT_EQ(g.rank(), r);
      EXPECT_EQ(g.size(), n);
      EXPECT_EQ(g.pid_of(r), int(::getpid()));
      for (size_t i = 0; i < msgs.size(); ++i) {
        const std::string got = g.broadcast(r == 0 ? msgs[i] : "not this");
        EXPECT_TRUE(got == msgs[i]) << "rank " << r << " message " << i << ": " << got.size() << " bytes, want "
                                    << msgs[i].size();
      }
      // Nobody leaves a barrier before everyone arrived (the later ranks arrive later).
      for (int round = 0; round < 2; ++round) {
        std::this_thread::sleep_for(std::chrono::milliseconds(30 * r));
        arrived[round].fetch_add(1);
        g.barrier();
        EXPECT_EQ(arrived[round].load(), n) << "rank " << r << " round " << round;
      }
      EXPECT_EQ(g.broadcast(r == 0 ? "after" : ""), "after");
      // Every rank's bytes to every rank, in rank order (empty and 1 MB ones among them).
      const auto mine = [](int q) { return q == 1 ? std::string() : pattern(q == 2 ? (1u << 20) : 5u, uint32_t(q)); };
      const std::vector<std::string> all = g.all_gather(mine(r));
      ASSERT_EQ(all.size(), size_t(n));
      for (int q = 0; q < n; ++q) EXPECT_TRUE(all[size_t(q)] == mine(q)) << "rank " << r << " part " << q;
      EXPECT_EQ(g.broadcast(r == 0 ? "end" : ""), "end");
    });
    ::munmap(arrived, sizeof(std::atomic<int>) * 2);
  }
}

// Two hosts (here both on 127.0.0.1): rank 0 listens on every interface at init_addr's port.
TEST(Ranks, TwoHostsJoinAtAGivenAddress) {
  GroupOptions o;
  o.nnodes = 2;
  {
    Rendezvous probe = Rendezvous::listen(GroupOptions{});  // a free port
    o.init_addr = probe.address();
  }
  run_group(4, [&](int r, RankGroup& g) {
    EXPECT_EQ(g.size(), 4);
    EXPECT_EQ(g.broadcast(r == 0 ? "two hosts" : ""), "two hosts");
  }, o);
  o.size = 4;
  EXPECT_EQ(local_rank(o, 1), 1);
  EXPECT_EQ(local_rank(o, 2), 0);
  EXPECT_EQ(node_of(o, 3), 1);
}

// Ranks that mix up the control channel's calls fail with what each side did, and none waits for ever.
TEST(Ranks, ControlCallsThatDisagreeFail) {
  run_group(2, [](int r, RankGroup& g) {
    if (r == 0) EXPECT_EQ(g.broadcast("x"), "x");
    else expect_error([&] { g.barrier(); }, "rank 1: barrier: rank 0 sent a broadcast (1 bytes) where this rank waits at a barrier");
  });
  run_group(2, [](int r, RankGroup& g) {
    if (r == 0) expect_error([&] { g.all_gather("a"); }, {"rank 0: all_gather: rank 1 (pid ", ") waits at a barrier"});
    else expect_error([&] { g.barrier(); }, "rank 1: barrier with rank 0 (pid ");  // rank 0 left the group
  });
}

TEST(Ranks, OneRankIsAGroupToo) {
  run_group(1, [](int, RankGroup& g) {
    EXPECT_EQ(g.size(), 1);
    EXPECT_EQ(g.broadcast("x"), "x");
    g.barrier();
    auto ops = make_ops(Platform::CPU, DType::F32);
    auto c = g.communicator(*ops);
    Tensor x = ops->empty(DType::BF16, {5});
    ops->fill_random(x, 3, 1.0);
    const Tensor before = x.clone();
    c->all_reduce(x);
    EXPECT_EQ(0, std::memcmp(x.data(), before.data(), x.nbytes()));
    g.exit_when_peer_lost();  // nothing to watch
  });
}

// rank r's input: element i = hash_normalish(100 + r, i), as test_communicator's.
Tensor input(Ops& ops, DType t, int r, int64_t n) {
  Tensor x = ops.empty(t, {n});
  ops.fill_random(x, uint64_t(100 + r), 1.0);
  return x;
}
float stored(DType t, int r, int64_t i) {
  const float v = hash_normalish(uint64_t(100 + r), uint64_t(i), 1.f);
  return t == DType::BF16 ? bf16_to_float(float_to_bf16(v)) : v;
}
// The in-process group's sum: each rank's values as stored, added in f32 in rank order, rounded once.
std::vector<char> want_sum(DType t, int n, int64_t begin, int64_t len) {
  std::vector<char> want(size_t(len) * dtype_size(t));
  for (int64_t i = 0; i < len; ++i) {
    float acc = 0;
    for (int r = 0; r < n; ++r) acc = r == 0 ? stored(t, r, begin + i) : acc + stored(t, r, begin + i);
    store_from_double(want.data(), t, size_t(i), acc);
  }
  return want;
}
std::vector<char> bytes(const Tensor& t) {
  return {static_cast<const char*>(t.data()), static_cast<const char*>(t.data()) + t.nbytes()};
}

TEST(Ranks, SocketCommunicatorHasTheInProcessBits) {
  for (int n : {2, 3}) {
    run_group(n, [&](int r, RankGroup& g) {
      for (DType t : {DType::F32, DType::BF16}) {
        auto ops = make_ops(Platform::CPU, t);
        auto c = g.communicator(*ops);
        EXPECT_EQ(c->rank(), r);
        EXPECT_EQ(c->size(), n);
        EXPECT_EQ(c->name(), fmt::format("socket {}/{}", r, n));
        for (int64_t m : {int64_t(1), int64_t(1000), int64_t(1) << 20}) {
          const std::string ctx = fmt::format("rank {} {} m {}", r, dtype_name(t), m);
          Tensor x = input(*ops, t, r, m);
          c->all_reduce(x);
          EXPECT_TRUE(bytes(x) == want_sum(t, n, 0, m)) << "all_reduce " << ctx;

          Tensor big = input(*ops, t, r, n * m), mine = ops->empty(t, {m});
          c->reduce_scatter(big, mine);
          EXPECT_TRUE(bytes(mine) == want_sum(t, n, r * m, m)) << "reduce_scatter " << ctx;

          Tensor part = input(*ops, t, r, m), all = ops->empty(t, {n, m});
          c->all_gather(part, all);
          for (int q = 0; q < n; ++q) {
            const Tensor want = input(*ops, t, q, m);
            EXPECT_EQ(0, std::memcmp(static_cast<char*>(all.data()) + size_t(q) * want.nbytes(), want.data(),
                                     want.nbytes()))
                << "all_gather part " << q << " " << ctx;
          }
          for (int root : {0, n - 1}) {
            Tensor y = input(*ops, t, r, m);
            c->broadcast(y, root);
            EXPECT_TRUE(bytes(y) == bytes(input(*ops, t, root, m))) << "broadcast from " << root << " " << ctx;
          }
        }
      }
      // An all_gather into another dtype converts each rank's part as the in-process group does.
      auto ops = make_ops(Platform::CPU, DType::F32);
      auto c = g.communicator(*ops);
      Tensor part = input(*ops, DType::BF16, r, 5), all = ops->empty(DType::F32, {n * 5});
      c->all_gather(part, all);
      for (int q = 0; q < n; ++q)
        for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(all.ptr<float>()[q * 5 + i], stored(DType::BF16, q, i));
      // The group's control channel and its communicator are independent connections.
      EXPECT_EQ(g.broadcast(r == 0 ? "done" : ""), "done");
    });
  }
}

// 64 MB and more per rank, one call.
TEST(Ranks, SocketCommunicatorMovesBigTensors) {
  const int n = 2;
  const int64_t m = (int64_t(16) << 20) + 3;  // f32: 64 MB + 12 bytes
  run_group(n, [&](int r, RankGroup& g) {
    auto ops = make_ops(Platform::CPU, DType::F32);
    auto c = g.communicator(*ops);
    Tensor x = input(*ops, DType::F32, r, m);
    c->all_reduce(x);
    EXPECT_TRUE(bytes(x) == want_sum(DType::F32, n, 0, m)) << "rank " << r;
    Tensor y = input(*ops, DType::F32, r, m);
    c->broadcast(y, 1);
    EXPECT_TRUE(bytes(y) == bytes(input(*ops, DType::F32, 1, m))) << "rank " << r;
  });
}

// A rank whose process ends mid-collective (no watchdog here): every rank's collective fails with the
// reason, none waits, and later collectives fail at once.
TEST(Ranks, ALostRankBreaksTheGroupWithoutAHang) {
  const int n = 3;
  run_group(n, [&](int r, RankGroup& g) {
    auto ops = make_ops(Platform::CPU, DType::F32);
    auto c = g.communicator(*ops);
    Tensor x = ops->empty(DType::F32, {1000});
    c->all_reduce(x);
    if (r == 2) ::_exit(0);  // gone without leaving the group
    const std::string why = fmt::format("the group broke: rank 2 (pid {}): connection closed", g.pid_of(2));
    expect_error([&] { c->all_reduce(x); }, {fmt::format("socket {}/3: all_reduce: ", r) + why}, fmt::format("rank {}", r));
    expect_error([&] { c->all_reduce(x); }, {fmt::format("socket {}/3: all_reduce: the group is broken: rank 2 (pid ", r)},
                 fmt::format("rank {}", r));
  });
}

TEST(Ranks, DisagreementsFailOnEveryRankAndTheGroupGoesOn) {
  const int n = 3;
  run_group(n, [&](int r, RankGroup& g) {
    auto ops = make_ops(Platform::CPU, DType::F32);
    auto c = g.communicator(*ops);
    auto expect_all = [&](const std::function<void()>& call, const std::string& message) {
      expect_error(call, {fmt::format("socket {}/{}: ", r, n) + message}, fmt::format("rank {}", r));
      Tensor y = ops->empty(DType::F32, {4});  // the group is still usable afterwards
      ops->fill(y, 1.0);
      c->all_reduce(y);
      EXPECT_EQ(y.ptr<float>()[3], float(n)) << "rank " << r << " after: " << message;
    };
    Tensor x = ops->empty(DType::F32, {r == 1 ? 7 : 8});
    expect_all([&] { c->all_reduce(x); }, "all_reduce: rank 1 gave f32 [7] (root 0), rank 0 f32 [8] (root 0)");
    Tensor b = ops->empty(r == 2 ? DType::BF16 : DType::F32, {2, 3});
    expect_all([&] { c->broadcast(b, 0); }, "broadcast: rank 2 gave bf16 [2, 3] (root 0), rank 0 f32 [2, 3] (root 0)");
    Tensor z = ops->empty(DType::F32, {6});
    expect_all([&] { c->broadcast(z, r == 1 ? 1 : 2); }, "broadcast: rank 1 gave f32 [6] (root 1), rank 0 f32 [6] (root 2)");
    Tensor part = ops->empty(DType::F32, {4}), all = ops->empty(DType::F32, {r == 2 ? 11 : 12});
    expect_all([&] { c->all_gather(part, all); }, "all_gather: rank 2: all_gather of 4 elements needs an output of 12, got 11");
    Tensor whole = ops->empty(DType::F32, {9}), mine = ops->empty(DType::F32, {r == 0 ? 2 : 3});
    expect_all([&] { c->reduce_scatter(whole, mine); },
               "reduce_scatter: rank 0: reduce_scatter of 9 elements over 3 ranks needs an output of 3, got 2");
    Tensor w = ops->empty(DType::F32, {2});
    expect_all([&] { c->broadcast(w, 5); }, "broadcast: rank 0: broadcast root 5 is outside the 3 ranks");
    Tensor v = ops->empty(DType::F32, {2}), all6 = ops->empty(DType::F32, {6});
    expect_all([&] { r == 1 ? c->all_gather(v, all6) : c->all_reduce(v); }, "all_reduce: rank 1 called all_gather");
  });
}

TEST(Ranks, OptionsAreValidated) {
  auto with = [](auto set) {
    GroupOptions o;
    set(o);
    return o;
  };
  const std::vector<std::pair<GroupOptions, std::string>> bad{
      {with([](GroupOptions& o) { o.size = 0; }), "tensor-parallel size must be at least 1 (got 0)"},
      {with([](GroupOptions& o) { o.nnodes = 0; }), "nnodes must be at least 1 (got 0)"},
      {with([](GroupOptions& o) { o.size = 6, o.nnodes = 4, o.init_addr = "h:1"; }),
       "tensor-parallel size 6 is not a multiple of nnodes 4"},
      {with([](GroupOptions& o) { o.size = 4, o.nnodes = 2, o.node_rank = 2, o.init_addr = "h:1"; }),
       "node_rank 2 is outside [0, 2)"},
      {with([](GroupOptions& o) { o.node_rank = -1; }), "node_rank -1 is outside [0, 1)"},
      {with([](GroupOptions& o) { o.size = 4, o.nnodes = 2; }), "nnodes 2 needs init_addr"},
      {with([](GroupOptions& o) { o.timeout_s = 0; }), "join timeout_s must be positive (got 0)"},
      {with([](GroupOptions& o) { o.peer_timeout_s = -1; }), "peer_timeout_s must be positive (got -1)"},
  };
  for (const auto& [o, msg] : bad) expect_error([&] { o.validate(); }, msg);
  for (const std::string a : {"localhost", "host:", ":1234", "host:0", "host:65536", "host:12a", "::1:80", "[::1]80",
                              "h:-1", "[]:5"})
    expect_error([&] { with([&](GroupOptions& o) { o.init_addr = a; }).validate(); },
                 {"init_addr '" + a + "' is not host:port"}, a);
  for (const std::string a : {"127.0.0.1:29500", "[::1]:80", "node-1.example:1", "h:65535"})
    EXPECT_NO_THROW(with([&](GroupOptions& o) { o.init_addr = a; }).validate()) << a;
  GroupOptions o = with([](GroupOptions& o) { o.size = 8, o.nnodes = 2, o.node_rank = 1, o.init_addr = "h:1"; });
  EXPECT_EQ(local_rank(o, 5), 1);
  EXPECT_EQ(node_of(o, 5), 1);
  EXPECT_EQ(local_rank(o, 3), 3);
  EXPECT_EQ(node_of(o, 3), 0);
  expect_error([&] { local_rank(o, 8); }, "rank 8 is outside the group's [0, 8)");
  // Listening and connecting name the address.
  Rendezvous taken = Rendezvous::listen(GroupOptions{});
  expect_error([&] { Rendezvous::listen(with([&](GroupOptions& o) { o.init_addr = taken.address(); })); },
               {"rendezvous: cannot listen on " + taken.address() + ": Address already in use"});
  expect_error([&] { Rendezvous::listen(with([](GroupOptions& o) { o.init_addr = "192.0.2.1:29500"; })); },
               {"cannot listen on 192.0.2.1:29500"});
  expect_error([&] { RankGroup::connect(with([](GroupOptions& o) { o.size = 2; }), 1); }, "rank 1: no init_addr");
  expect_error([&] { RankGroup::connect(with([](GroupOptions& o) { o.size = 2, o.init_addr = "h:1"; }), 0); },
               "RankGroup::connect is for ranks 1..1, got rank 0");
  std::string free_addr;
  {
    Rendezvous gone = Rendezvous::listen(GroupOptions{});
    free_addr = gone.address();
  }
  const auto t0 = Clock::now();
  expect_error([&] { RankGroup::connect(with([&](GroupOptions& o) { o.size = 2, o.init_addr = free_addr, o.timeout_s = 0.3; }), 1); },
               {"rank 1: cannot reach rank 0 at " + free_addr + " within 0.3 s: Connection refused"});
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(2));
}

// Rank 0 of `size` here, the given ranks (joining with `their_size`) forked; returns rank 0's accept
// error and checks each forked rank's connect error contains `child_needle`.
std::string join_failure(int size, std::vector<int> ranks, int their_size, double timeout_s, const std::string& child_needle) {
  GroupOptions o;
  o.size = size;
  o.timeout_s = timeout_s;
  std::optional<Rendezvous> rv(Rendezvous::listen(o));
  o.init_addr = rv->address();
  std::fflush(stdout);
  std::vector<pid_t> kids;
  for (int r : ranks) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      child_setup();
      rv.reset();
      GroupOptions mine = o;
      mine.size = their_size;
      mine.timeout_s = 10;
      int code = 1;
      try {
        RankGroup::connect(mine, r);
        std::fprintf(stderr, "rank %d joined\n", r);
      } catch (const Error& e) {
        code = std::string(e.what()).find(child_needle) != std::string::npos ? 0 : 2;
        if (code) std::fprintf(stderr, "rank %d: %s\n", r, e.what());
      }
      ::_exit(code);
    }
    kids.push_back(pid);
  }
  std::string err = "no error";
  try {
    rv->accept();
  } catch (const Error& e) {
    err = e.what();
  }
  for (pid_t k : kids) {
    int st = 0;
    ::waitpid(k, &st, 0);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "a joining rank's error lacks '" << child_needle << "'";
  }
  return err;
}

TEST(Ranks, JoinFailuresNameTheRank) {
  std::string e = join_failure(3, {1}, 3, 0.5, "rank 1: rank 0 at 127.0.0.1:");
  EXPECT_NE(e.find("rendezvous at 127.0.0.1:"), std::string::npos) << e;
  EXPECT_NE(e.find(": rank 2 did not join within 0.5 s"), std::string::npos) << e;
  e = join_failure(4, {2}, 4, 0.5, "refused: ranks 1, 3 did not join within 0.5 s");
  EXPECT_NE(e.find("ranks 1, 3 did not join within 0.5 s"), std::string::npos) << e;
  // A rank that says another group size is refused, and rank 0 stops with the same reason at once.
  const auto t0 = Clock::now();
  e = join_failure(2, {1}, 3, 10, "rank 1: rank 0 at 127.0.0.1:");
  EXPECT_NE(e.find("says the group has 3 ranks, rank 0 has 2"), std::string::npos) << e;
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5));
  e = join_failure(2, {1}, 3, 10, "refused: rank 1 (pid ");
  EXPECT_NE(e.find("rank 1 (pid "), std::string::npos) << e;
}

// A death test's stderr holds every one of these pieces, in order. (Not the regex matchers: libonig,
// linked into the tests, exports a regcomp/regexec of its own that gtest's POSIX regex calls reach.)
class HasPieces : public ::testing::MatcherInterface<const std::string&> {
 public:
  explicit HasPieces(std::vector<std::string> pieces) : pieces_(std::move(pieces)) {}
  bool MatchAndExplain(const std::string& s, ::testing::MatchResultListener*) const override {
    size_t at = 0;
    for (const std::string& p : pieces_) {
      at = s.find(p, at);
      if (at == std::string::npos) return false;
      at += p.size();
    }
    return true;
  }
  void DescribeTo(std::ostream* os) const override {
    *os << "has";
    for (const std::string& p : pieces_) *os << " '" << p << "'";
  }

 private:
  std::vector<std::string> pieces_;
};
::testing::Matcher<const std::string&> pieces(std::vector<std::string> p) {
  return ::testing::MakeMatcher(new HasPieces(std::move(p)));
}

// The death tests: the statement's process is one rank (the survivor); the others are forked from it.
// It sleeps past `survive_s` after the loss and exits 0 when still alive then (the test fails).
[[noreturn]] void outlive(Clock::time_point until) {
  std::this_thread::sleep_until(until);
  std::fprintf(stderr, "still alive\n");
  ::_exit(0);
}

// n ranks; `victim` is SIGKILLed 0.3 s after a first all_reduce while the others sit in a second one
// (or, with `idle`, in a sleep that knows nothing of the group). `me` is this process's rank.
[[noreturn]] void lose_a_rank(int n, int me, int victim, bool idle) {
  GroupOptions o;
  o.size = n;
  o.timeout_s = 10;
  std::optional<Rendezvous> rv(Rendezvous::listen(o));
  o.init_addr = rv->address();
  auto body = [&](int r, RankGroup& g) {
    auto ops = make_ops(Platform::CPU, DType::F32);
    auto c = g.communicator(*ops);
    g.exit_when_peer_lost();
    Tensor x = ops->empty(DType::F32, {1000});
    c->all_reduce(x);
    const auto start = Clock::now();
    if (r == victim) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      ::raise(SIGKILL);
    }
    if (idle) outlive(start + std::chrono::milliseconds(2300));
    try {
      c->all_reduce(x);
    } catch (const Error&) {  // the collective fails at once; the watchdog ends the process
    }
    outlive(start + std::chrono::milliseconds(2300));
  };
  for (int r = 0; r < n; ++r) {
    if (r == me) continue;
    if (::fork() == 0) {
      child_setup();
      if (r != 0) rv.reset();
      std::unique_ptr<RankGroup> g = r == 0 ? rv->accept() : RankGroup::connect(o, r);
      body(r, *g);
    }
  }
  if (me != 0) rv.reset();
  std::unique_ptr<RankGroup> g = me == 0 ? rv->accept() : RankGroup::connect(o, me);
  body(me, *g);
  ::_exit(0);
}

TEST(RanksDeathTest, APeerKilledMidCollectiveStopsTheSurvivor) {
  EXPECT_EXIT(lose_a_rank(2, 0, 1, false), ::testing::ExitedWithCode(3),
              pieces({"mla: tensor-parallel rank 0: rank 1 (pid ", ") is gone: connection closed; stopping\n"}));
  EXPECT_EXIT(lose_a_rank(2, 1, 0, true), ::testing::ExitedWithCode(3),
              pieces({"mla: tensor-parallel rank 1: rank 0 (pid ", ") is gone: connection closed; stopping\n"}));
  // Rank 0 passes the loss of rank 2 on to rank 1.
  EXPECT_EXIT(lose_a_rank(3, 1, 2, false), ::testing::ExitedWithCode(3),
              pieces({"mla: tensor-parallel rank 1: rank 2 (pid ", ") is gone: connection closed (seen by rank 0); stopping\n"}));
}

// A peer that stops sending (its host died, or it is stopped) is lost after peer_timeout_s.
[[noreturn]] void silent_peer() {
  GroupOptions o;
  o.size = 2;
  o.timeout_s = 10;
  o.peer_timeout_s = 0.5;
  std::optional<Rendezvous> rv(Rendezvous::listen(o));
  o.init_addr = rv->address();
  if (::fork() == 0) {
    child_setup();
    rv.reset();
    auto g = RankGroup::connect(o, 1);
    g->exit_when_peer_lost();
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ::raise(SIGSTOP);  // its connections stay open, its heartbeats stop
    ::_exit(0);
  }
  auto g = rv->accept();
  const auto start = Clock::now();
  g->exit_when_peer_lost();
  outlive(start + std::chrono::milliseconds(2000));
}

TEST(RanksDeathTest, ASilentPeerIsLostAfterPeerTimeout) {
  EXPECT_EXIT(silent_peer(), ::testing::ExitedWithCode(3),
              pieces({"mla: tensor-parallel rank 0: rank 1 (pid ", ") is gone: nothing heard for 0.5 s; stopping\n"}));
}

// A rank that leaves in order (destroys its group) is not lost for the others, which keep watching.
TEST(Ranks, LeavingInOrderIsNotALoss) {
  std::atomic<int>* lost = shared_array<std::atomic<int>>(1);
  for (int leaver : {0, 1, 2})
    run_group(3, [&](int r, RankGroup& g) {
      g.exit_when_peer_lost([&](const std::string& why) {
        std::fprintf(stderr, "rank %d lost: %s\n", r, why.c_str());
        lost->fetch_add(1);
      });
      g.barrier();
      if (r != leaver) std::this_thread::sleep_for(std::chrono::milliseconds(400));  // watching it go
    });
  EXPECT_EQ(lost->load(), 0);
  ::munmap(lost, sizeof(std::atomic<int>));
}

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    char t[] = "/tmp/mla-ranks-XXXXXX";
    path = ::mkdtemp(t);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string read(const std::string& name) const {
    std::ifstream f(path / name);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }
};

// Sets (or unsets, with nullptr) an environment variable for the scope.
struct ScopedEnv {
  std::string name;
  std::optional<std::string> old;
  ScopedEnv(const char* n, const char* v) : name(n) {
    if (const char* o = std::getenv(n)) old = o;
    v ? ::setenv(n, v, 1) : ::unsetenv(n);
  }
  ~ScopedEnv() { old ? ::setenv(name.c_str(), old->c_str(), 1) : ::unsetenv(name.c_str()); }
};

TEST(Ranks, SpawnPassesRankAddressAndRotatedGpus) {
  TempDir d;
  // $0.. are the appended arguments; fd 1 as the child got it; the child's CUDA_VISIBLE_DEVICES.
  const std::vector<std::string> argv{
      "sh", "-c", "o=$(readlink /proc/$$/fd/1); echo \"$0 $1 $2 $3|${CUDA_VISIBLE_DEVICES-unset}|$o\" > " +
                      d.path.string() + "/out$1"};
  GroupOptions o;
  o.size = 4;
  {
    ScopedEnv env("CUDA_VISIBLE_DEVICES", nullptr);
    RankChildren c = spawn_local_ranks(argv, o, 0, "127.0.0.1:29500", true, 4);
    EXPECT_EQ(c.ranks, (std::vector<int>{1, 2, 3}));
    ASSERT_EQ(c.pids.size(), 3u);
    ASSERT_TRUE(c.wait(10));
    EXPECT_EQ(d.read("out1"), "--rank 1 --dist-init-addr 127.0.0.1:29500|1,2,3,0|/dev/null\n");
    EXPECT_EQ(d.read("out2"), "--rank 2 --dist-init-addr 127.0.0.1:29500|2,3,0,1|/dev/null\n");
    EXPECT_EQ(d.read("out3"), "--rank 3 --dist-init-addr 127.0.0.1:29500|3,0,1,2|/dev/null\n");
    // No GPU count and no CUDA_VISIBLE_DEVICES, or no rotation: the variable is left alone.
    RankChildren c2 = spawn_local_ranks(argv, o, 2, "h:5", true, -1);
    ASSERT_TRUE(c2.wait(10));
    EXPECT_EQ(d.read("out3"), "--rank 3 --dist-init-addr h:5|unset|/dev/null\n");
    EXPECT_EQ(d.read("out0"), "--rank 0 --dist-init-addr h:5|unset|/dev/null\n");
  }
  {
    // The entries of an existing CUDA_VISIBLE_DEVICES; the second of two hosts runs ranks 2 and 3.
    ScopedEnv env("CUDA_VISIBLE_DEVICES", "7,5,GPU-ab");
    o.nnodes = 2;
    o.node_rank = 1;
    o.init_addr = "h:5";
    RankChildren c = spawn_local_ranks(argv, o, 2, "h:5", true, 8);
    EXPECT_EQ(c.ranks, (std::vector<int>{3}));
    ASSERT_TRUE(c.wait(10));
    EXPECT_EQ(d.read("out3"), "--rank 3 --dist-init-addr h:5|5,GPU-ab,7|/dev/null\n");
    RankChildren c2 = spawn_local_ranks(argv, o, 3, "h:5", false, 8);
    ASSERT_TRUE(c2.wait(10));
    EXPECT_EQ(d.read("out2"), "--rank 2 --dist-init-addr h:5|7,5,GPU-ab|/dev/null\n");
    expect_error([&] { spawn_local_ranks(argv, o, 1, "h:5", true, 8); },
                 "spawn_local_ranks: rank 1 does not run on host 1 (ranks 2..3)");
    o.size = 8;
    expect_error([&] { spawn_local_ranks(argv, o, 4, "h:5", true, 8); },
                 "spawn_local_ranks: 4 ranks on this host, but only 3 GPUs (CUDA_VISIBLE_DEVICES)");
  }
  GroupOptions two;
  two.size = 2;
  expect_error([&] { spawn_local_ranks({"no-such-mla-program"}, two, 0, "h:5", false); },
               "spawn_local_ranks: program 'no-such-mla-program' is not on PATH");
  expect_error([&] { spawn_local_ranks({"/nonexistent/mla"}, two, 0, "h:5", false); },
               "spawn_local_ranks: cannot start rank 1: /nonexistent/mla: No such file or directory");
  expect_error([&] { spawn_local_ranks({"sh"}, two, 0, "nowhere", false); }, "rank 0's address 'nowhere' is not host:port");
}

[[noreturn]] void spawn_and_outlive(const std::string& script) {
  GroupOptions o;
  o.size = 3;
  RankChildren c = spawn_local_ranks({"/bin/sh", "-c", script}, o, 0, "127.0.0.1:1", false);
  outlive(Clock::now() + std::chrono::seconds(3));
}

TEST(RanksDeathTest, AFailedChildStopsTheParent) {
  EXPECT_EXIT(spawn_and_outlive("[ \"$1\" = 2 ] && exit 1; exec sleep 10"), ::testing::ExitedWithCode(3),
              pieces({"mla: tensor-parallel rank 2 exited (status 1); stopping\n"}));
  EXPECT_EXIT(spawn_and_outlive("[ \"$1\" = 1 ] && kill -9 $$; exec sleep 10"), ::testing::ExitedWithCode(3),
              pieces({"mla: tensor-parallel rank 1 exited (signal 9); stopping\n"}));
}

[[noreturn]] void spawn_sleeper(const std::string& pidfile) {
  GroupOptions o;
  o.size = 2;
  RankChildren c = spawn_local_ranks(
      {"/bin/sh", "-c", "echo $$ > " + pidfile + ".tmp; mv " + pidfile + ".tmp " + pidfile + "; exec sleep 30"}, o, 0,
      "127.0.0.1:1", false);
  while (!std::filesystem::exists(pidfile)) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ::_exit(0);
}

// Children die with their parent.
TEST(Ranks, ChildrenDieWithTheParent) {
  TempDir d;
  const std::string pidfile = (d.path / "pid").string();
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t parent = ::fork();  // (not a death test: gtest would wait for the child's copy of its pipe)
  if (parent == 0) {
    ::alarm(30);
    spawn_sleeper(pidfile);
  }
  int st = 0;
  ASSERT_EQ(::waitpid(parent, &st, 0), parent);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  const int pid = std::stoi(d.read("pid"));
  auto alive = [&] {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string s;
    std::getline(stat, s);
    const size_t close = s.rfind(')');
    return !s.empty() && close + 2 < s.size() && s[close + 2] != 'Z';
  };
  const auto t0 = Clock::now();
  while (alive() && Clock::now() - t0 < std::chrono::seconds(3)) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(alive()) << "pid " << pid << " outlived its parent";
  if (alive()) ::kill(pid, SIGKILL);
}

}  // namespace
}  // namespace mla
