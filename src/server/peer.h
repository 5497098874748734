// src/server/peer.h — whether the client of a request is still connected.
//
// cpp-httplib 0.11 (Debian 12) gives a handler neither its socket nor a "connection closed" query; a
// streamed response learns of a closed peer from a failed write, but a non-streamed one writes
// nothing until the result is complete. These find the connection's socket by its two ends and
// read its state without reading from it.
#pragma once
#include <string>

namespace mla::server {

// The descriptor of this process's TCP socket whose local end is local_ip:local_port and whose peer
// is remote_ip:remote_port (addresses as getnameinfo(NI_NUMERICHOST) writes them, as cpp-httplib
// fills Request::local_addr / remote_addr); -1 when there is none. A handler's own connection stays
// open, under the same descriptor, while the handler runs.
int find_connection_socket(const std::string& local_ip, int local_port, const std::string& remote_ip,
                           int remote_port);

// Whether the peer has closed (or shut down its sending side of) the connection, or it has failed.
// Never blocks and reads nothing: a request the client already sent on the connection stays there.
bool peer_closed(int fd);

}  // namespace mla::server
