// What stops a command's process group when the launcher dies without warning (SIGKILL
// from mpirun a second after its SIGTERM, the OOM killer): a small process forked beside
// the job that waits on a pipe only the launcher holds. The kernel closes that pipe when
// the launcher dies, however it dies; the guard then SIGKILLs the group, every process whose
// environment carries the guard's entry (the command gets it, and its descendants inherit
// it) and every descendant of those (torchrun's workers run in sessions of their own), so
// no training outlives its launcher holding the GPUs. A launcher that ends normally says so first and
// the guard exits without a signal.
#pragma once

#include <sys/types.h>

#include <string>

namespace bt::launcher {

// The variable the command's environment carries: which guard stands for it.
inline constexpr const char* kGuardVariable = "BT_JOB_GUARD";

class JobGuard {
 public:
  // Forks the guard, before the command is spawned. On failure (no pipe, no fork) warns and
  // guards nothing: the job still runs, as before.
  JobGuard();
  ~JobGuard();  // the command is over: the guard exits quietly and is reaped
  JobGuard(const JobGuard&) = delete;
  JobGuard& operator=(const JobGuard&) = delete;

  // The command's process group, spawned: from now on the launcher's death kills it.
  void Guard(pid_t group);
  pid_t pid() const { return pid_; }  // -1 when nothing is guarded
  // "BT_JOB_GUARD=...", for the command's environment; "" when nothing is guarded.
  std::string environment_entry() const { return pid_ < 0 ? "" : entry_; }

 private:
  pid_t pid_ = -1;
  std::string entry_;
  int command_fd_ = -1;  // the write end: the group id, then one byte for "ended normally"
};

}  // namespace bt::launcher
