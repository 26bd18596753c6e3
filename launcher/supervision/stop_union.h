// Two sources of stops as one (the supervisor watches one): the peers (another node failed)
// and the watchdog of a node that judges its own job. Readable when either is.
#pragma once

#include <optional>
#include <string>

#include "launcher/supervision/supervisor.h"

namespace bt::launcher {

class StopUnion final : public StopRequests {
 public:
  // Either may be null; neither is owned.
  StopUnion(StopRequests* first, StopRequests* second);
  ~StopUnion() override;
  StopUnion(const StopUnion&) = delete;
  StopUnion& operator=(const StopUnion&) = delete;

  int fd() const override { return fd_; }
  std::optional<std::string> TakeStop() override;

 private:
  StopRequests* first_;
  StopRequests* second_;
  int fd_ = -1;           // an epoll descriptor over both, or the one source's own
  bool owns_fd_ = false;  // the epoll descriptor is ours to close
};

}  // namespace bt::launcher
