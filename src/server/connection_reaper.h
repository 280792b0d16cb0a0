// Ending an HTTP connection from inside a cpp-httplib handler.
//
// cpp-httplib 0.11 gives a handler no socket, and after a response whose request body it did not
// read whole it keeps the connection and parses what follows as the next request: the rest of a
// body trickled a byte a second would hold the connection's thread on, past the body deadline.
// No option of the library closes it, so this finds the connection's socket by its two addresses
// (unique among the server's connections) and shuts its reading side: the response still goes
// out, then httplib reads end-of-file and closes.
#pragma once
#include <string>

namespace dhs::server {

// Shuts the reading side of this process's TCP socket whose local end is (local_addr,
// local_port) and remote end (remote_addr, remote_port); numeric addresses as httplib writes them.
// Returns false when no such socket is open.
bool stop_reading_connection(const std::string& local_addr, int local_port, const std::string& remote_addr,
                             int remote_port);

}  // namespace dhs::server
