// The socket of the HTTP connection a cpp-httplib handler is serving.
//
// cpp-httplib 0.11 gives a handler no socket, and two things need it:
// - after a response whose request body it did not read whole, httplib keeps the connection and
//   parses what follows as the next request: the rest of a body trickled a byte a second would
//   hold the connection's thread past the body deadline. Shutting the socket's reading side once
//   the answer is written ends it (httplib then reads end-of-file and closes);
// - a non-streaming request whose client leaves should be cancelled, as a stream's is: the
//   handler waits on the scheduler, and only the socket tells it the client is gone.
// The socket is found by the connection's two addresses, unique among the server's connections.
// It stays this connection's while the handler runs (httplib closes it only after).
#pragma once
#include <string>

namespace dhs::server {

// This process's TCP socket whose local end is (local_addr, local_port) and remote end
// (remote_addr, remote_port), numeric addresses as httplib writes them; -1 when none is open.
// A scan of /proc/self/fd: one getsockname/getpeername pair per open descriptor.
int find_connection_socket(const std::string& local_addr, int local_port, const std::string& remote_addr,
                           int remote_port);

// Whether the peer has closed its end (a pending read would return end-of-file). Data the
// client sent after its request (a pipelined request) reads as still open.
bool peer_has_closed(int fd);

// Shuts the reading side of the connection's socket; false when it is not found.
bool stop_reading_connection(const std::string& local_addr, int local_port, const std::string& remote_addr,
                             int remote_port);

}  // namespace dhs::server
