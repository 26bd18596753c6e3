#include "launcher/supervision/stop_union.h"

#include <sys/epoll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace bt::launcher {

// An epoll descriptor is readable while any descriptor it watches is: the supervisor polls
// it as it polls one source. With one source (a single node's watchdog, or peers without
// it) that source's descriptor serves as it is: no epoll is set up on every start.
StopUnion::StopUnion(StopRequests* first, StopRequests* second) : first_(first), second_(second) {
  if (first_ == nullptr || second_ == nullptr) {
    StopRequests* only = first_ != nullptr ? first_ : second_;
    fd_ = only != nullptr ? only->fd() : -1;
    return;
  }
  fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (fd_ < 0) throw std::runtime_error(std::string("epoll_create1: ") + std::strerror(errno));
  owns_fd_ = true;
  for (StopRequests* source : {first_, second_}) {
    if (source->fd() < 0) continue;
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.fd = source->fd();
    if (epoll_ctl(fd_, EPOLL_CTL_ADD, source->fd(), &event) != 0) {
      const int error = errno;
      close(fd_);
      throw std::runtime_error(std::string("epoll_ctl: ") + std::strerror(error));
    }
  }
}

StopUnion::~StopUnion() {
  if (owns_fd_) close(fd_);
}

std::optional<std::string> StopUnion::TakeStop() {
  std::optional<std::string> stop;
  // Both are asked every time: each clears its own readiness as it is taken.
  for (StopRequests* source : {first_, second_}) {
    if (source == nullptr) continue;
    auto reason = source->TakeStop();
    if (reason && !stop) stop = std::move(reason);
  }
  return stop;
}

}  // namespace bt::launcher
