// src/dist/socket_io.h — blocking TCP I/O for the ranks of a group: whole reads and writes (partial
// transfers, EINTR), optional deadlines, length-prefixed frames, and the group's shared connections.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "mla/ranks.h"

namespace mla::net {

using Clock = std::chrono::steady_clock;

// A failed transfer: the reason only ("connection closed", "timed out", strerror); callers add who.
struct IoError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// An owned file descriptor (closed on destruction).
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) reset(o.release());
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    const int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

std::string errno_str(int err);

// Every byte, or IoError. A deadline bounds the whole transfer ("timed out").
void send_all(int fd, const void* p, size_t n);
void recv_all(int fd, void* p, size_t n, std::optional<Clock::time_point> deadline = std::nullopt);

// Frames: [u8 type][u64 length][length bytes].
void send_frame(int fd, char type, std::string_view body);
void send_frame_header(int fd, char type, uint64_t length);  // the body follows with send_all
struct FrameHeader {
  char type;
  uint64_t length;
};
FrameHeader recv_frame_header(int fd, std::optional<Clock::time_point> deadline = std::nullopt);
std::string recv_body(int fd, uint64_t length, std::optional<Clock::time_point> deadline = std::nullopt);

// Little serializer for headers (same-architecture hosts: native byte order).
struct Writer {
  std::string s;
  template <typename T>
  Writer& put(T v) {
    s.append(reinterpret_cast<const char*>(&v), sizeof v);
    return *this;
  }
  Writer& str(std::string_view v) {
    put<uint64_t>(v.size());
    s.append(v);
    return *this;
  }
};
struct Reader {
  std::string_view s;
  size_t pos = 0;
  template <typename T>
  T get() {
    if (s.size() - pos < sizeof(T)) throw IoError("a truncated message");
    T v;
    std::memcpy(&v, s.data() + pos, sizeof v);
    pos += sizeof v;
    return v;
  }
  std::string str() {
    const auto n = get<uint64_t>();
    if (s.size() - pos < n) throw IoError("a truncated message");
    std::string v(s.substr(pos, n));
    pos += n;
    return v;
  }
};

// "host:port" → host (brackets of an IPv6 literal removed) and port; nullopt when malformed.
struct HostPort {
  std::string host;
  int port = 0;
};
std::optional<HostPort> parse_host_port(const std::string& s);
std::string join_host_port(const std::string& host, int port);

}  // namespace mla::net

namespace mla {

// The connections of one rank. Rank 0 holds one of each kind per peer (index = the peer's rank; its
// own slot is empty); a peer holds one of each to rank 0 (index 0).
struct RankGroup::Links {
  int rank = 0;
  int size = 1;
  double peer_timeout_s = 10;
  std::vector<int> pids;  // every rank's process id
  std::vector<net::Fd> ctrl, data, live;
  std::mutex ctrl_mu, data_mu;
  // A data connection failed mid-collective: later collectives fail at once with this reason.
  std::string broken;
  std::string who(int r) const;  // "rank 2 (pid 123)"
};

}  // namespace mla
