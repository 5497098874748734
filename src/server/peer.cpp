// src/server/peer.cpp — a request's connection found by its two ends; its peer's state by poll().
#include "server/peer.h"

#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstdlib>
#include <string>

namespace mla::server {
namespace {

// Whether a socket end is want_ip:want_port (the address numeric, as cpp-httplib writes it). The
// port is compared first: most descriptors differ there, and cost no getnameinfo().
bool is_end(int fd, bool peer, const std::string& want_ip, int want_port) {
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  const int rc = peer ? getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len)
                      : getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  if (rc != 0) return false;
  int port = -1;
  if (a.ss_family == AF_INET) port = ntohs(reinterpret_cast<const sockaddr_in*>(&a)->sin_port);
  else if (a.ss_family == AF_INET6) port = ntohs(reinterpret_cast<const sockaddr_in6*>(&a)->sin6_port);
  if (port != want_port) return false;
  char host[NI_MAXHOST];
  const int rc_name =
      getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, host, sizeof(host), nullptr, 0, NI_NUMERICHOST);
  return rc_name == 0 && want_ip == host;
}

}  // namespace

int find_connection_socket(const std::string& local_ip, int local_port, const std::string& remote_ip,
                           int remote_port) {
  if (local_port < 0 || remote_port < 0) return -1;
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return -1;
  int found = -1;
  while (dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    if (is_end(int(fd), true, remote_ip, remote_port) && is_end(int(fd), false, local_ip, local_port)) {
      found = int(fd);
      break;
    }
  }
  closedir(dir);
  return found;
}

bool peer_closed(int fd) {
  if (fd < 0) return false;
  pollfd p{};
  p.fd = fd;
  p.events = POLLRDHUP;  // the peer closed, or shut down writing
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace mla::server
