// Routes the signals a PID 1 must handle to one file descriptor.
#pragma once

#include <csignal>
#include <optional>
#include <vector>

namespace bt::launcher {

// The signals forwarded to the job. TERM, INT and QUIT go to its process group and start
// the grace period; HUP, USR1 and USR2 are only passed on, to the processes that handle them
// (trainers use them to checkpoint; see Supervisor::ForwardRequest).
const std::vector<int>& ForwardedSignals();
bool StartsShutdown(int signal_number);

// Blocks the forwarded signals, SIGCHLD and SIGTTOU in the calling thread and reads them
// from a signalfd. Must be created before any other thread starts, so that every thread
// inherits the blocked mask and no signal is delivered to a thread that ignores it.
class SignalRouter {
 public:
  SignalRouter();
  ~SignalRouter();
  SignalRouter(const SignalRouter&) = delete;
  SignalRouter& operator=(const SignalRouter&) = delete;

  int fd() const { return fd_; }
  // The next pending signal, without blocking; nullopt when none is pending.
  std::optional<int> Take();
  // Every pending signal read, and the first that starts a shutdown returned (nullopt when
  // none did); the others are dropped. Only for the waits before the job runs: a SIGCHLD
  // then is a child the launcher already waited for (rclone reading `latest`), and HUP,
  // USR1 and USR2 have no job to reach.
  std::optional<int> TakeShutdownRequest();
  // The mask to restore in children: the one the launcher was started with.
  const sigset_t& original_mask() const { return original_mask_; }
  const sigset_t& routed_signals() const { return routed_; }

 private:
  int fd_ = -1;
  sigset_t routed_{};
  sigset_t original_mask_{};
};

}  // namespace bt::launcher
