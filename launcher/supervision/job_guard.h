// What stops a command's process group when the launcher dies without warning (SIGKILL
// from mpirun a second after its SIGTERM, the OOM killer): a small process forked beside
// the job that waits on a pipe only the launcher holds. The kernel closes that pipe when
// the launcher dies, however it dies; the guard then SIGKILLs the group and every
// descendant of it (torchrun's workers run in sessions of their own), so no training
// outlives its launcher holding the GPUs. A launcher that ends normally says so first and
// the guard exits without a signal.
#pragma once

#include <sys/types.h>

namespace bt::launcher {

class JobGuard {
 public:
  // Forks the guard, before the command is spawned: once the command runs, only the write
  // of its group id stands between it and a guard, not a fork. On failure (no pipe, no
  // fork) warns and guards nothing: the job still runs, as before.
  JobGuard();
  ~JobGuard();  // the command is over: the guard exits quietly and is reaped
  JobGuard(const JobGuard&) = delete;
  JobGuard& operator=(const JobGuard&) = delete;

  // The command's process group, spawned: from now on the launcher's death kills it.
  void Guard(pid_t group);
  pid_t pid() const { return pid_; }  // -1 when nothing is guarded

 private:
  pid_t pid_ = -1;
  int command_fd_ = -1;  // the write end: the group id, then one byte for "ended normally"
};

}  // namespace bt::launcher
