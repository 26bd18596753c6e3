#include "launcher/supervision/job_guard.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <spdlog/spdlog.h>

namespace bt::launcher {
namespace {

// Descriptors a kernel without close_range is checked up to: the launcher opens few of its
// own beyond the rendezvous connections, and a guard that keeps one only delays its close.
constexpr int kMaxDescriptorScan = 65536;

// Reads exactly `size` bytes; false at end of file (the launcher is gone or done).
bool ReadExactly(int fd, void* data, size_t size) {
  auto* bytes = static_cast<char*>(data);
  size_t got = 0;
  while (got < size) {
    const ssize_t n = read(fd, bytes + got, size - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    got += size_t(n);
  }
  return true;
}

// The guard, in the forked child of a threaded process: async-signal-safe calls only.
// It keeps nothing of the launcher's open (a copy of the rendezvous connection would hide
// the launcher's death from the leader) and lives in its own process group, so that a
// signal to the launcher's group or the job's does not reach it (the launcher's blocked
// signals stay blocked in it too).
[[noreturn]] void GuardGroup(int command_fd) {
  dup2(command_fd, STDIN_FILENO);
  if (syscall(SYS_close_range, 1u, ~0u, 0u) != 0) {
    for (int fd = 1; fd < kMaxDescriptorScan; ++fd) close(fd);
  }
  setpgid(0, 0);
  pid_t group = 0;
  if (!ReadExactly(STDIN_FILENO, &group, sizeof group)) _exit(0);  // no command was spawned
  char released = 0;
  if (ReadExactly(STDIN_FILENO, &released, 1)) _exit(0);  // the launcher ended the guard: the command is over
  kill(-group, SIGKILL);  // end of file: the launcher is gone
  _exit(0);
}

}  // namespace

JobGuard::JobGuard() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    spdlog::warn("cannot guard the job against the launcher's death (pipe: {})", std::strerror(errno));
    return;
  }
  const pid_t pid = fork();
  if (pid == 0) GuardGroup(fds[0]);
  close(fds[0]);
  if (pid < 0) {
    spdlog::warn("cannot guard the job against the launcher's death (fork: {})", std::strerror(errno));
    close(fds[1]);
    return;
  }
  pid_ = pid;
  command_fd_ = fds[1];
}

void JobGuard::Guard(pid_t group) {
  if (command_fd_ < 0) return;
  [[maybe_unused]] ssize_t ignored = write(command_fd_, &group, sizeof group);  // a pipe takes 4 bytes at once
}

JobGuard::~JobGuard() {
  if (pid_ < 0) return;
  const char released = 1;
  [[maybe_unused]] ssize_t ignored = write(command_fd_, &released, 1);
  close(command_fd_);
  // The supervisor may have reaped it already (it reaps every child on SIGCHLD): ECHILD then.
  while (waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
  }
}

}  // namespace bt::launcher
