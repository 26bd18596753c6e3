#include "launcher/supervision/stop_union.h"

#include <sys/epoll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace bt::launcher {

// An epoll descriptor is readable while any descriptor it watches is: the supervisor polls
// it as it polls one source.
StopUnion::StopUnion(StopRequests* first, StopRequests* second) : first_(first), second_(second) {
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0) throw std::runtime_error(std::string("epoll_create1: ") + std::strerror(errno));
  for (StopRequests* source : {first_, second_}) {
    if (source == nullptr || source->fd() < 0) continue;
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.fd = source->fd();
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, source->fd(), &event) != 0) {
      const int error = errno;
      close(epoll_fd_);
      throw std::runtime_error(std::string("epoll_ctl: ") + std::strerror(error));
    }
  }
}

StopUnion::~StopUnion() { close(epoll_fd_); }

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
