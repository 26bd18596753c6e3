#include "launcher/supervision/job_guard.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include <spdlog/spdlog.h>

namespace bt::launcher {
namespace {

// Descriptors a kernel without close_range is checked up to: the launcher opens few of its
// own beyond the rendezvous connections, and a guard that keeps one only delays its close.
constexpr int kMaxDescriptorScan = 65536;

// Processes the guard looks at when the launcher dies: a container's process table, with room.
constexpr size_t kMaxProcesses = 65536;

struct ProcessLink {
  pid_t pid;
  pid_t parent;
  pid_t group;
  bool tagged;  // its environment carries the guard's entry: the command's, inherited
};
// Static: the guard may not allocate (it is the forked child of a threaded process).
ProcessLink g_processes[kMaxProcesses];
bool g_doomed[kMaxProcesses];

// The guard's entry ("BT_JOB_GUARD=<its pid>"), set before the fork: the guard may not allocate.
char g_entry[32];
size_t g_entry_length = 0;

// /proc/<pid_text>/<leaf>, opened without allocating.
int OpenProcFile(const char* pid_text, const char* leaf) {
  char path[64] = "/proc/";
  size_t length = 6;
  for (const char* c = pid_text; *c != '\0' && length < 32; ++c) path[length++] = *c;
  path[length++] = '/';
  for (const char* c = leaf; *c != '\0' && length < sizeof path - 1; ++c) path[length++] = *c;
  path[length] = '\0';
  return open(path, O_RDONLY | O_CLOEXEC);
}

// Whether /proc/<pid>/environ (the environment the process was started with) holds the
// guard's entry, matched entry by entry across reads.
bool CarriesGuardEntry(const char* pid_text) {
  const int fd = OpenProcFile(pid_text, "environ");
  if (fd < 0) return false;
  char chunk[4096];
  size_t matched = 0;  // of g_entry, in the current entry; past the length: no match
  bool found = false;
  for (ssize_t got; !found && (got = read(fd, chunk, sizeof chunk)) > 0;) {
    for (ssize_t i = 0; i < got && !found; ++i) {
      if (chunk[i] == '\0') {
        found = matched == g_entry_length;
        matched = 0;
      } else {
        matched = matched < g_entry_length && chunk[i] == g_entry[matched] ? matched + 1 : g_entry_length + 1;
      }
    }
  }
  close(fd);
  return found;
}

// Parses "pid (comm) state ppid pgrp ..." from /proc/<pid>/stat without allocating.
bool ReadLink(const char* pid_text, ProcessLink& link) {
  const int fd = OpenProcFile(pid_text, "stat");
  if (fd < 0) return false;
  char text[512];
  const ssize_t got = read(fd, text, sizeof text - 1);
  close(fd);
  if (got <= 0) return false;
  text[got] = '\0';
  const char* cursor = nullptr;
  for (ssize_t i = got - 1; i >= 0 && cursor == nullptr; --i) {
    if (text[i] == ')') cursor = text + i + 1;  // the command may hold spaces and parentheses
  }
  if (cursor == nullptr) return false;
  long fields[2] = {0, 0};  // ppid, pgrp: the 2nd and 3rd fields after the state
  for (int field = -1; field < 2; ++field) {
    while (*cursor == ' ') ++cursor;
    long value = 0;
    while (*cursor != ' ' && *cursor != '\0') value = value * 10 + (*cursor++ - '0');
    if (field >= 0) fields[field] = value;
  }
  link.parent = pid_t(fields[0]);
  link.group = pid_t(fields[1]);
  return true;
}

// Every process's parent and group, from /proc through getdents64 (no allocation).
size_t ReadProcessTable() {
  const int proc = open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (proc < 0) return 0;
  size_t count = 0;
  alignas(8) char buffer[8192];
  while (count < kMaxProcesses) {
    const long got = syscall(SYS_getdents64, proc, buffer, sizeof buffer);
    if (got <= 0) break;
    for (long offset = 0; offset < got && count < kMaxProcesses;) {
      struct Entry {
        uint64_t inode;
        int64_t next;
        unsigned short length;
        unsigned char type;
        char name[1];
      };
      const auto* entry = reinterpret_cast<const Entry*>(buffer + offset);
      offset += entry->length;
      if (entry->name[0] < '1' || entry->name[0] > '9') continue;
      ProcessLink link{0, 0, 0, false};
      for (const char* c = entry->name; *c >= '0' && *c <= '9'; ++c) link.pid = link.pid * 10 + (*c - '0');
      if (!ReadLink(entry->name, link)) continue;
      link.tagged = CarriesGuardEntry(entry->name);
      g_processes[count++] = link;
    }
  }
  close(proc);
  return count;
}

// The launcher is gone: the group is frozen (no fork escapes the walk), then every process
// of it, every process that carries the guard's entry, and every descendant of those, in
// whatever group or session, is killed. The walk finds torchrun's workers (sessions of
// their own); the entry finds what the walk cannot: a daemon whose parent exited before
// the launcher died, and the command itself when the launcher died between the spawn and
// naming the group (`group` 0).
void KillJob(pid_t group) {
  if (group > 0) kill(-group, SIGSTOP);
  const size_t count = ReadProcessTable();
  for (size_t i = 0; i < count; ++i) g_doomed[i] = (group > 0 && g_processes[i].group == group) || g_processes[i].tagged;
  for (bool grew = true; grew;) {
    grew = false;
    for (size_t i = 0; i < count; ++i) {
      if (g_doomed[i]) continue;
      for (size_t j = 0; j < count && !g_doomed[i]; ++j) {
        if (g_doomed[j] && g_processes[j].pid == g_processes[i].parent) g_doomed[i] = grew = true;
      }
    }
  }
  for (size_t i = 0; i < count; ++i) {
    if (g_doomed[i]) kill(g_processes[i].pid, SIGKILL);
  }
  if (group > 0) kill(-group, SIGKILL);
}

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
  if (!ReadExactly(STDIN_FILENO, &group, sizeof group)) {
    KillJob(0);  // gone before naming the group: a spawned command still carries the entry
    _exit(0);
  }
  char released = 0;
  if (ReadExactly(STDIN_FILENO, &released, 1)) _exit(0);  // the launcher ended the guard: the command is over
  KillJob(group);  // end of file: the launcher is gone
  _exit(0);
}

}  // namespace

JobGuard::JobGuard() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    spdlog::warn("cannot guard the job against the launcher's death (pipe: {})", std::strerror(errno));
    return;
  }
  // The launcher's pid and a sequence number name this guard in both processes; the child
  // reads its copy from the static buffer.
  static unsigned sequence = 0;
  entry_ = std::string(kGuardVariable) + "=" + std::to_string(getpid()) + "." + std::to_string(++sequence);
  g_entry_length = entry_.copy(g_entry, sizeof g_entry - 1);
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
