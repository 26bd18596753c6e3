// The launcher's own failures, as sysexits.h codes (DESIGN.md §3). The job's own exit
// code, or 128+signal, is passed through unchanged and never mixed with these.
#pragma once

#include <stdexcept>
#include <string>

namespace bt::launcher {

enum ExitCode : int {
  kExitUsage = 64,        // bad command line
  kExitConfig = 65,       // bad config, identity or secret
  kExitUnavailable = 69,  // a peer or the rendezvous failed
  kExitInternal = 70,     // a bug or an impossible system state
  kExitIo = 74,           // directories, weights, files
  kExitUnhealthy = 75,    // this node's hardware cannot train (launcher.health): replace the node
  kExitHung = 124,        // the job made no progress (launcher.watchdog): timeout(1)'s code
};

// A failure of the launcher itself; main() logs what() once and exits with code().
class LaunchFailure : public std::runtime_error {
 public:
  LaunchFailure(int code, const std::string& message) : std::runtime_error(message), code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};

}  // namespace bt::launcher
