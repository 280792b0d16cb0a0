// connection_socket.h: the socket found by a scan of /proc/self/fd for the one whose addresses
// match.
#include "server/connection_socket.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>

namespace dhs::server {

namespace {

// The numeric address and port of a socket end, or false for a non-IP socket.
bool endpoint(const sockaddr_storage& sa, std::string& addr, int& port) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (sa.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(sa);
    if (!inet_ntop(AF_INET, &in.sin_addr, buf, sizeof buf)) return false;
    port = ntohs(in.sin_port);
  } else if (sa.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(sa);
    if (!inet_ntop(AF_INET6, &in6.sin6_addr, buf, sizeof buf)) return false;
    port = ntohs(in6.sin6_port);
  } else {
    return false;
  }
  addr = buf;
  return true;
}

bool ends_match(int fd, const std::string& local_addr, int local_port, const std::string& remote_addr, int remote_port) {
  sockaddr_storage sa{};
  socklen_t len = sizeof sa;
  std::string addr;
  int port = 0;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0 || !endpoint(sa, addr, port)) return false;
  if (port != remote_port || addr != remote_addr) return false;
  len = sizeof sa;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0 || !endpoint(sa, addr, port)) return false;
  return port == local_port && addr == local_addr;
}

}  // namespace

int find_connection_socket(const std::string& local_addr, int local_port, const std::string& remote_addr,
                           int remote_port) {
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return -1;
  const int dir_fd = dirfd(dir);
  int found = -1;
  while (const dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dir_fd) continue;
    struct stat st{};
    if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    if (ends_match(static_cast<int>(fd), local_addr, local_port, remote_addr, remote_port)) {
      found = static_cast<int>(fd);
      break;
    }
  }
  closedir(dir);
  return found;
}

bool peer_has_closed(int fd) {
  char c;
  const ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

bool stop_reading_connection(const std::string& local_addr, int local_port, const std::string& remote_addr,
                             int remote_port) {
  const int fd = find_connection_socket(local_addr, local_port, remote_addr, remote_port);
  return fd >= 0 && shutdown(fd, SHUT_RD) == 0;
}

}  // namespace dhs::server
