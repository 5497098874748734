// socket_io.cpp — whole transfers with EINTR and partial reads/writes handled, frames, host:port.
#include "socket_io.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <climits>

#include <fmt/format.h>

namespace mla::net {

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

std::string errno_str(int err) {
  char buf[256];
  // GNU strerror_r returns the message (maybe not in buf).
  return ::strerror_r(err, buf, sizeof buf);
}

void send_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t k = ::send(fd, c, std::min<size_t>(n, size_t(1) << 30), MSG_NOSIGNAL);
    if (k < 0) {
      if (errno == EINTR) continue;
      throw IoError(errno == EPIPE ? std::string("connection closed") : errno_str(errno));
    }
    c += k;
    n -= size_t(k);
  }
}

// Waits until fd is readable or the deadline passes (IoError "timed out").
static void wait_readable(int fd, Clock::time_point deadline) {
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) throw IoError("timed out");
    pollfd pfd{fd, POLLIN, 0};
    const int r = ::poll(&pfd, 1, int(std::min<long long>(left, INT_MAX)));
    if (r > 0) return;  // readable, closed or failed: the recv says which
    if (r < 0 && errno != EINTR) throw IoError(errno_str(errno));
  }
}

void recv_all(int fd, void* p, size_t n, std::optional<Clock::time_point> deadline) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    if (deadline) wait_readable(fd, *deadline);
    const ssize_t k = ::recv(fd, c, std::min<size_t>(n, size_t(1) << 30), 0);
    if (k == 0) throw IoError("connection closed");
    if (k < 0) {
      if (errno == EINTR) continue;
      throw IoError(errno_str(errno));
    }
    c += k;
    n -= size_t(k);
  }
}

void send_frame_header(int fd, char type, uint64_t length) {
  char h[9];
  h[0] = type;
  std::memcpy(h + 1, &length, 8);
  send_all(fd, h, sizeof h);
}

void send_frame(int fd, char type, std::string_view body) {
  if (body.size() <= 4096) {  // one write: one segment for the small control messages
    std::string buf(9 + body.size(), '\0');
    buf[0] = type;
    const uint64_t length = body.size();
    std::memcpy(buf.data() + 1, &length, 8);
    std::memcpy(buf.data() + 9, body.data(), body.size());
    send_all(fd, buf.data(), buf.size());
    return;
  }
  send_frame_header(fd, type, body.size());
  send_all(fd, body.data(), body.size());
}

FrameHeader recv_frame_header(int fd, std::optional<Clock::time_point> deadline) {
  char h[9];
  recv_all(fd, h, sizeof h, deadline);
  FrameHeader f{h[0], 0};
  std::memcpy(&f.length, h + 1, 8);
  return f;
}

std::string recv_body(int fd, uint64_t length, std::optional<Clock::time_point> deadline) {
  std::string s(length, '\0');
  recv_all(fd, s.data(), s.size(), deadline);
  return s;
}

std::optional<HostPort> parse_host_port(const std::string& s) {
  const size_t colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == s.size()) return std::nullopt;
  std::string host = s.substr(0, colon);
  const std::string port = s.substr(colon + 1);
  if (host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') return std::nullopt;
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != std::string::npos) {
    return std::nullopt;  // an IPv6 literal needs brackets
  }
  if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  const int p = std::stoi(port);
  if (p < 1 || p > 65535) return std::nullopt;
  return HostPort{host, p};
}

std::string join_host_port(const std::string& host, int port) {
  return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port) : fmt::format("{}:{}", host, port);
}

}  // namespace mla::net

namespace mla {

std::string RankGroup::Links::who(int r) const {
  return fmt::format("rank {} (pid {})", r, pids.at(size_t(r)));
}

}  // namespace mla
