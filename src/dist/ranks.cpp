// ranks.cpp — joining a tensor-parallel group over TCP (rank 0 listens, the others connect), the
// control channel (broadcast, barrier) and the liveness watchdog.
//
// Joining: each rank r > 0 opens three connections to rank 0 (control, data, liveness), each starting
// with a hello {magic, group size, rank, pid, channel}. Rank 0 answers on every control connection
// once the whole group is there: 'G' + its pid, or 'E' + the reason it gave up.
// Control frames: 'M' a broadcast message (rank 0 → r), 'B' arrived at a barrier (r → 0), 'G' leave the
// barrier (0 → r), 'A' a rank's bytes of an all_gather (r → 0) and everyone's (0 → r). Liveness frames: 'H' heartbeat, 'Q' leaving in order, 'L' + reason: rank 0 saw
// another rank go.
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <thread>

#include "mla/error.h"
#include "mla/ranks.h"
#include "socket_io.h"

namespace mla {

using net::Clock;
using net::Fd;
using net::IoError;

namespace {

constexpr uint32_t kMagic = 0x4d4c4154;  // "MLAT"
constexpr uint32_t kVersion = 1;
enum Channel : int32_t { kCtrl = 0, kData = 1, kLive = 2 };
constexpr int kChannels = 3;

struct Hello {
  uint32_t magic = kMagic, version = kVersion;
  int32_t size = 0, rank = 0, pid = 0, channel = 0;
};

Clock::time_point deadline_after(double s) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

void set_nodelay(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

struct AddrInfo {
  addrinfo* ai = nullptr;
  ~AddrInfo() {
    if (ai) ::freeaddrinfo(ai);
  }
};

// Resolves host:port for a TCP socket; Error naming `what` and the address.
void resolve(AddrInfo& out, const net::HostPort& hp, bool passive, const std::string& what) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  const std::string port = std::to_string(hp.port);
  const int e = ::getaddrinfo(hp.host.empty() ? nullptr : hp.host.c_str(), port.c_str(), &hints, &out.ai);
  if (e != 0 || !out.ai)
    fail("{}: cannot resolve {}: {}", what, net::join_host_port(hp.host, hp.port), ::gai_strerror(e));
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

// A connection to addr within the deadline (non-blocking connect, so an unreachable host does not
// hold it past the deadline); -1 and `err` set when this attempt failed.
int try_connect(const addrinfo* a, Clock::time_point deadline, int& err) {
  Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
  if (!fd.valid()) {
    err = errno;
    return -1;
  }
  if (::connect(fd.get(), a->ai_addr, a->ai_addrlen) != 0) {
    if (errno != EINPROGRESS && errno != EINTR) {
      err = errno;
      return -1;
    }
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) {
        err = ETIMEDOUT;
        return -1;
      }
      pollfd p{fd.get(), POLLOUT, 0};
      const int r = ::poll(&p, 1, int(std::min<long long>(left, 1000)));
      if (r < 0 && errno != EINTR) {
        err = errno;
        return -1;
      }
      if (r > 0) break;
    }
    int so = 0;
    socklen_t len = sizeof so;
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &so, &len);
    if (so != 0) {
      err = so;
      return -1;
    }
  }
  ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) & ~O_NONBLOCK);
  set_nodelay(fd.get());
  return fd.release();
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Options

void GroupOptions::validate() const {
  if (size < 1) fail("tensor-parallel size must be at least 1 (got {})", size);
  if (nnodes < 1) fail("nnodes must be at least 1 (got {})", nnodes);
  if (size % nnodes != 0) fail("tensor-parallel size {} is not a multiple of nnodes {}", size, nnodes);
  if (node_rank < 0 || node_rank >= nnodes) fail("node_rank {} is outside [0, {}) (nnodes {})", node_rank, nnodes, nnodes);
  if (nnodes > 1 && init_addr.empty())
    fail("nnodes {} needs init_addr, the host:port where rank 0 listens (reachable from every host)", nnodes);
  if (!init_addr.empty() && !net::parse_host_port(init_addr))
    fail("init_addr '{}' is not host:port (a host name or address, and a port in 1..65535)", init_addr);
  if (!(timeout_s > 0) || !std::isfinite(timeout_s)) fail("join timeout_s must be positive (got {})", timeout_s);
  if (!(peer_timeout_s > 0) || !std::isfinite(peer_timeout_s))
    fail("peer_timeout_s must be positive (got {})", peer_timeout_s);
}

int node_of(const GroupOptions& o, int rank) {
  if (rank < 0 || rank >= o.size) fail("rank {} is outside the group's [0, {})", rank, o.size);
  return rank / (o.size / o.nnodes);
}

int local_rank(const GroupOptions& o, int rank) {
  if (rank < 0 || rank >= o.size) fail("rank {} is outside the group's [0, {})", rank, o.size);
  return rank % (o.size / o.nnodes);
}

// ---------------------------------------------------------------------------------------------------
// Rendezvous (rank 0)

struct Rendezvous::Impl {
  GroupOptions o;
  Fd listener;
  std::string addr;
  bool accepted = false;
};

Rendezvous::Rendezvous(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Rendezvous::Rendezvous(Rendezvous&&) noexcept = default;
Rendezvous& Rendezvous::operator=(Rendezvous&&) noexcept = default;
Rendezvous::~Rendezvous() = default;

std::string Rendezvous::address() const { return impl_->addr; }

Rendezvous Rendezvous::listen(const GroupOptions& o) {
  o.validate();
  const net::HostPort hp = o.init_addr.empty() ? net::HostPort{"127.0.0.1", 0} : *net::parse_host_port(o.init_addr);
  const std::string shown = o.init_addr.empty() ? "127.0.0.1:0" : o.init_addr;
  // Several hosts: every interface at the port (the name may resolve to loopback on rank 0's host).
  AddrInfo ai;
  resolve(ai, o.nnodes > 1 ? net::HostPort{"", hp.port} : hp, o.nnodes > 1, "rendezvous");
  std::string why = "no address";
  for (const addrinfo* a = ai.ai; a; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (!fd.valid()) {
      why = net::errno_str(errno);
      continue;
    }
    const int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd.get(), 128) != 0) {
      why = net::errno_str(errno);
      continue;
    }
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&ss), &len);
    const int port = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                              : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    auto impl = std::make_unique<Impl>();
    impl->o = o;
    impl->listener = std::move(fd);
    impl->addr = net::join_host_port(hp.host, port);
    return Rendezvous(std::move(impl));
  }
  fail("rendezvous: cannot listen on {}: {}", shown, why);
}

std::unique_ptr<RankGroup> Rendezvous::accept() {
  Impl& s = *impl_;
  if (s.accepted) fail("rendezvous at {}: accept was called already", s.addr);
  s.accepted = true;
  const GroupOptions& o = s.o;
  auto l = std::make_shared<RankGroup::Links>();
  l->rank = 0;
  l->size = o.size;
  l->peer_timeout_s = o.peer_timeout_s;
  l->pids.assign(size_t(o.size), 0);
  l->pids[0] = int(::getpid());
  l->ctrl.resize(size_t(o.size));
  l->data.resize(size_t(o.size));
  l->live.resize(size_t(o.size));
  const auto deadline = deadline_after(o.timeout_s);
  auto slot = [&](int r, int ch) -> Fd& { return ch == kCtrl ? l->ctrl[size_t(r)] : ch == kData ? l->data[size_t(r)] : l->live[size_t(r)]; };
  auto missing = [&] {
    std::vector<int> m;
    for (int r = 1; r < o.size; ++r)
      for (int ch = 0; ch < kChannels; ++ch)
        if (!slot(r, ch).valid()) {
          m.push_back(r);
          break;
        }
    return m;
  };
  // Gives up: every joined rank learns why (its connect fails with the same reason), then Error.
  auto give_up = [&](const std::string& why) {
    for (int r = 1; r < o.size; ++r)
      if (l->ctrl[size_t(r)].valid()) try {
          net::send_frame(l->ctrl[size_t(r)].get(), 'E', why);
        } catch (const IoError&) {
        }
    s.listener.reset();
    fail("rendezvous at {}: {}", s.addr, why);
  };
  for (;;) {
    const std::vector<int> m = missing();
    if (m.empty()) break;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0)
      give_up(fmt::format("{} {} did not join within {} s", m.size() == 1 ? "rank" : "ranks", rank_list(m), o.timeout_s));
    pollfd p{s.listener.get(), POLLIN, 0};
    const int pr = ::poll(&p, 1, int(std::min<long long>(left, 1000)));
    if (pr <= 0) continue;  // timed out (checked above) or EINTR
    Fd c(::accept4(s.listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!c.valid()) continue;
    set_nodelay(c.get());
    Hello h;
    try {  // a connection that is not a rank (no hello soon, a wrong magic) is dropped
      net::recv_all(c.get(), &h, sizeof h, std::min(deadline, deadline_after(2.0)));
    } catch (const IoError&) {
      continue;
    }
    if (h.magic != kMagic || h.channel < 0 || h.channel >= kChannels) continue;
    std::string bad;
    if (h.version != kVersion)
      bad = fmt::format("rank {} (pid {}) speaks protocol version {}, rank 0 version {}", h.rank, h.pid, h.version, kVersion);
    else if (h.size != o.size)
      bad = fmt::format("rank {} (pid {}) says the group has {} ranks, rank 0 has {}", h.rank, h.pid, h.size, o.size);
    else if (h.rank < 1 || h.rank >= o.size)
      bad = fmt::format("a process (pid {}) joined as rank {}, outside [1, {})", h.pid, h.rank, o.size);
    else if (slot(h.rank, h.channel).valid() || (l->pids[size_t(h.rank)] != 0 && l->pids[size_t(h.rank)] != h.pid))
      bad = fmt::format("rank {} joined twice (pids {} and {})", h.rank, l->pids[size_t(h.rank)], h.pid);
    if (!bad.empty()) {
      try {
        net::send_frame(c.get(), 'E', bad);
      } catch (const IoError&) {
      }
      give_up(bad);
    }
    l->pids[size_t(h.rank)] = h.pid;
    slot(h.rank, h.channel) = std::move(c);
  }
  s.listener.reset();
  net::Writer w;
  for (int pid : l->pids) w.put<int32_t>(pid);
  for (int r = 1; r < o.size; ++r) {
    try {
      net::send_frame(l->ctrl[size_t(r)].get(), 'G', w.s);
    } catch (const IoError& e) {
      fail("rendezvous at {}: {} left while the group formed: {}", s.addr, l->who(r), e.what());
    }
  }
  return std::unique_ptr<RankGroup>(new RankGroup(std::move(l)));
}

// ---------------------------------------------------------------------------------------------------
// RankGroup

struct RankGroup::Watchdog {
  Fd wake_r, wake_w;  // a byte on wake_w stops the thread
  std::thread thread;
};

RankGroup::RankGroup(std::shared_ptr<Links> links) : l_(std::move(links)) {}

std::unique_ptr<RankGroup> RankGroup::connect(const GroupOptions& o, int rank) {
  o.validate();
  if (rank < 1 || rank >= o.size) fail("RankGroup::connect is for ranks 1..{}, got rank {}", o.size - 1, rank);
  if (o.init_addr.empty()) fail("rank {}: no init_addr (host:port of rank 0) to join the group", rank);
  const net::HostPort hp = *net::parse_host_port(o.init_addr);
  const auto deadline = deadline_after(o.timeout_s);
  auto l = std::make_shared<Links>();
  l->rank = rank;
  l->size = o.size;
  l->peer_timeout_s = o.peer_timeout_s;
  l->ctrl.resize(1);
  l->data.resize(1);
  l->live.resize(1);
  const std::string what = fmt::format("rank {}", rank);
  // Rank 0's answer on the control connection: 'G' + every rank's pid, or 'E' + why it refused.
  auto answer = [&](Clock::time_point until) {
    try {
      const net::FrameHeader f = net::recv_frame_header(l->ctrl[0].get(), until);
      if (f.length > (1 << 20)) fail("rank {}: rank 0 at {} answered with a malformed message", rank, o.init_addr);
      const std::string body = net::recv_body(l->ctrl[0].get(), f.length, until);
      if (f.type == 'E') fail("rank {}: rank 0 at {} refused: {}", rank, o.init_addr, body);
      if (f.type != 'G' || body.size() != size_t(o.size) * 4)
        fail("rank {}: rank 0 at {} answered with a malformed message", rank, o.init_addr);
      net::Reader rd{body};
      for (int r = 0; r < o.size; ++r) l->pids.push_back(rd.get<int32_t>());
    } catch (const IoError& e) {
      fail("rank {}: joining the group at {}: {} ({} s)", rank, o.init_addr,
           std::string(e.what()) == "timed out" ? "the others did not all join in time" : e.what(), o.timeout_s);
    }
  };
  // Past the control channel, a failure may follow rank 0's refusal: its answer is read first (waiting
  // up to wait_ms for it), so the error names the reason rather than the closed socket.
  auto answer_if_refused = [&](int wait_ms) {
    pollfd p{l->ctrl[0].get(), POLLIN, 0};
    if (::poll(&p, 1, wait_ms) > 0) answer(deadline);
  };
  for (int ch = 0; ch < kChannels; ++ch) {
    int err = 0;
    for (;;) {  // rank 0 may not listen yet: retry until the deadline
      AddrInfo ai;
      resolve(ai, hp, false, what);
      int fd = -1;
      for (const addrinfo* a = ai.ai; a && fd < 0; a = a->ai_next) fd = try_connect(a, deadline, err);
      if (fd >= 0) {
        (ch == kCtrl ? l->ctrl : ch == kData ? l->data : l->live)[0] = Fd(fd);
        break;
      }
      if (ch > 0) answer_if_refused(0);  // rank 0 stopped listening: it may have refused this rank already
      if (Clock::now() + std::chrono::milliseconds(100) >= deadline)
        fail("rank {}: cannot reach rank 0 at {} within {} s: {}", rank, o.init_addr, o.timeout_s, net::errno_str(err));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    Hello h;
    h.size = o.size;
    h.rank = rank;
    h.pid = int(::getpid());
    h.channel = ch;
    try {
      net::send_all((ch == kCtrl ? l->ctrl : ch == kData ? l->data : l->live)[0].get(), &h, sizeof h);
    } catch (const IoError& e) {
      if (ch > 0) answer_if_refused(500);  // the connection was in the backlog of a listener rank 0 closed
      fail("rank {}: rank 0 at {} closed the connection while joining: {}", rank, o.init_addr, e.what());
    }
  }
  answer(deadline);
  return std::unique_ptr<RankGroup>(new RankGroup(std::move(l)));
}

RankGroup::~RankGroup() {
  if (watch_) {
    const char b = 1;
    [[maybe_unused]] ssize_t n = ::write(watch_->wake_w.get(), &b, 1);
    if (watch_->thread.joinable()) watch_->thread.join();
  }
  static const char quit[9] = {'Q', 0, 0, 0, 0, 0, 0, 0, 0};
  for (const Fd& fd : l_->live)  // leaving in order: the peers' watchdogs stop watching this rank
    if (fd.valid()) [[maybe_unused]] ssize_t k = ::send(fd.get(), quit, sizeof quit, MSG_NOSIGNAL | MSG_DONTWAIT);
}

int RankGroup::rank() const { return l_->rank; }
int RankGroup::size() const { return l_->size; }
int RankGroup::pid_of(int rank) const {
  if (rank < 0 || rank >= l_->size) fail("pid_of: rank {} is outside the group's [0, {})", rank, l_->size);
  return l_->pids[size_t(rank)];
}

std::string RankGroup::broadcast(const std::string& msg) {
  std::lock_guard lock(l_->ctrl_mu);
  if (l_->rank == 0) {
    for (int r = 1; r < l_->size; ++r) try {
        net::send_frame(l_->ctrl[size_t(r)].get(), 'M', msg);
      } catch (const IoError& e) {
        fail("rank 0: broadcast to {}: {}", l_->who(r), e.what());
      }
    return msg;
  }
  try {
    const net::FrameHeader f = net::recv_frame_header(l_->ctrl[0].get());
    if (f.type != 'M')
      fail("rank {}: broadcast: rank 0 sent {} where this rank waits for a broadcast", l_->rank,
           f.type == 'G' ? "a barrier's end" : f.type == 'A' ? "an all_gather's result" : "an unknown message");
    return net::recv_body(l_->ctrl[0].get(), f.length);
  } catch (const IoError& e) {
    fail("rank {}: broadcast from {}: {}", l_->rank, l_->who(0), e.what());
  }
}

std::vector<std::string> RankGroup::all_gather(const std::string& mine) {
  std::lock_guard lock(l_->ctrl_mu);
  const int n = l_->size;
  std::vector<std::string> all(static_cast<size_t>(n));
  if (l_->rank == 0) {
    all[0] = mine;
    for (int r = 1; r < n; ++r) try {
        const net::FrameHeader f = net::recv_frame_header(l_->ctrl[size_t(r)].get());
        all[size_t(r)] = net::recv_body(l_->ctrl[size_t(r)].get(), f.length);
        if (f.type != 'A')
          fail("rank 0: all_gather: {} {}", l_->who(r), f.type == 'B' ? "waits at a barrier" : "sent an unknown message");
      } catch (const IoError& e) {
        fail("rank 0: all_gather: {}: {}", l_->who(r), e.what());
      }
    net::Writer w;
    for (const std::string& a : all) w.str(a);
    for (int r = 1; r < n; ++r) try {
        net::send_frame(l_->ctrl[size_t(r)].get(), 'A', w.s);
      } catch (const IoError& e) {
        fail("rank 0: all_gather: {}: {}", l_->who(r), e.what());
      }
    return all;
  }
  try {
    net::send_frame(l_->ctrl[0].get(), 'A', mine);
    const net::FrameHeader f = net::recv_frame_header(l_->ctrl[0].get());
    const std::string body = net::recv_body(l_->ctrl[0].get(), f.length);
    if (f.type != 'A')
      fail("rank {}: all_gather: rank 0 sent {} where this rank waits for an all_gather", l_->rank,
           f.type == 'M' ? "a broadcast" : f.type == 'G' ? "a barrier's end" : "an unknown message");
    net::Reader rd{body};
    for (std::string& a : all) a = rd.str();
  } catch (const IoError& e) {
    fail("rank {}: all_gather with {}: {}", l_->rank, l_->who(0), e.what());
  }
  return all;
}

void RankGroup::barrier() {
  std::lock_guard lock(l_->ctrl_mu);
  if (l_->rank == 0) {
    for (int r = 1; r < l_->size; ++r) try {
        const net::FrameHeader f = net::recv_frame_header(l_->ctrl[size_t(r)].get());
        net::recv_body(l_->ctrl[size_t(r)].get(), f.length);
        if (f.type != 'B')
          fail("rank 0: barrier: {} {}", l_->who(r), f.type == 'A' ? "called all_gather" : "sent an unknown message");
      } catch (const IoError& e) {
        fail("rank 0: barrier: {}: {}", l_->who(r), e.what());
      }
    for (int r = 1; r < l_->size; ++r) try {
        net::send_frame(l_->ctrl[size_t(r)].get(), 'G', "");
      } catch (const IoError& e) {
        fail("rank 0: barrier: {}: {}", l_->who(r), e.what());
      }
    return;
  }
  try {
    net::send_frame(l_->ctrl[0].get(), 'B', "");
    const net::FrameHeader f = net::recv_frame_header(l_->ctrl[0].get());
    const std::string body = net::recv_body(l_->ctrl[0].get(), f.length);
    if (f.type == 'M')
      fail("rank {}: barrier: rank 0 sent a broadcast ({} bytes) where this rank waits at a barrier", l_->rank, body.size());
    if (f.type != 'G')
      fail("rank {}: barrier: rank 0 sent {} where this rank waits at a barrier", l_->rank,
           f.type == 'A' ? "an all_gather's result" : "an unknown message");
  } catch (const IoError& e) {
    fail("rank {}: barrier with {}: {}", l_->rank, l_->who(0), e.what());
  }
}

void RankGroup::exit_when_peer_lost(std::function<void(const std::string&)> on_lost) {
  if (watch_) fail("rank {}: exit_when_peer_lost was called already", l_->rank);
  if (l_->size == 1) return;
  if (!on_lost) {
    const int me = l_->rank;
    on_lost = [me](const std::string& reason) {
      std::fprintf(stderr, "mla: tensor-parallel rank %d: %s; stopping\n", me, reason.c_str());
      std::fflush(stderr);
      ::_exit(3);
    };
  }
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) fail("rank {}: exit_when_peer_lost: pipe: {}", l_->rank, net::errno_str(errno));
  watch_ = std::make_unique<Watchdog>();
  watch_->wake_r = Fd(p[0]);
  watch_->wake_w = Fd(p[1]);
  const double silence = l_->peer_timeout_s;
  watch_->thread = std::thread([l = l_, wake = watch_->wake_r.get(), on_lost = std::move(on_lost), silence] {
    struct Peer {
      int rank, fd;
      std::string buf;
      bool heard = false;  // it sends heartbeats: silence counts against it
      bool left = false;   // it left in order
      Clock::time_point last;
    };
    std::vector<Peer> peers;
    for (size_t r = 0; r < l->live.size(); ++r)
      if (l->live[r].valid()) peers.push_back({int(r), l->live[r].get(), "", false, false, Clock::now()});
    auto lost = [&](const std::string& reason) {
      if (l->rank == 0)  // the others learn why before this rank stops (and they see it go)
        for (const Peer& q : peers) {
          if (q.left) continue;
          std::string msg(9, 'L');
          const uint64_t n = reason.size();
          std::memcpy(msg.data() + 1, &n, 8);
          msg += reason;
          [[maybe_unused]] ssize_t k = ::send(q.fd, msg.data(), msg.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        }
      on_lost(reason);
    };
    const auto beat = std::chrono::milliseconds(200);
    auto next_beat = Clock::now();
    for (;;) {
      const auto now = Clock::now();
      if (now >= next_beat) {
        static const char hb[9] = {'H', 0, 0, 0, 0, 0, 0, 0, 0};
        for (Peer& q : peers)  // a failed send shows as a closed or reset connection below
          if (!q.left) [[maybe_unused]] ssize_t k = ::send(q.fd, hb, sizeof hb, MSG_NOSIGNAL | MSG_DONTWAIT);
        next_beat = now + beat;
      }
      for (Peer& q : peers)
        if (!q.left && q.heard && now - q.last > std::chrono::duration<double>(silence))
          return lost(fmt::format("{} is gone: nothing heard for {} s", l->who(q.rank), silence));
      std::vector<pollfd> pfds{{wake, POLLIN, 0}};
      for (const Peer& q : peers) pfds.push_back({q.left ? -1 : q.fd, POLLIN, 0});
      const int pr = ::poll(pfds.data(), pfds.size(), 100);
      if (pr < 0 && errno != EINTR) return lost(fmt::format("watchdog: poll: {}", net::errno_str(errno)));
      if (pr <= 0) continue;
      if (pfds[0].revents) return;  // the group is being destroyed
      for (size_t i = 0; i < peers.size(); ++i) {
        Peer& q = peers[i];
        if (q.left || !pfds[i + 1].revents) continue;
        char buf[4096];
        const ssize_t k = ::recv(q.fd, buf, sizeof buf, MSG_DONTWAIT);
        if (k == 0 || (k < 0 && errno == ECONNRESET))  // its process ended (a reset: after our heartbeat)
          return lost(fmt::format("{} is gone: connection closed", l->who(q.rank)));
        if (k < 0) {
          if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
          return lost(fmt::format("{} is gone: {}", l->who(q.rank), net::errno_str(errno)));
        }
        q.buf.append(buf, size_t(k));
        q.heard = true;
        q.last = Clock::now();
        while (q.buf.size() >= 9) {  // whole frames
          uint64_t n;
          std::memcpy(&n, q.buf.data() + 1, 8);
          if (q.buf.size() < 9 + n) break;
          const char type = q.buf[0];
          const std::string body = q.buf.substr(9, n);
          q.buf.erase(0, 9 + n);
          if (type == 'Q') q.left = true;
          else if (type == 'L') return on_lost(body + " (seen by rank 0)");
        }
      }
    }
  });
}

}  // namespace mla
