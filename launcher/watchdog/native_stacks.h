// Native frames of the job's processes at a hang, from gdb where it is installed and ptrace
// is allowed (a container without CAP_SYS_PTRACE, or Yama's ptrace_scope 3, forbids it):
// what a rank stuck in NCCL, CUDA or any C++ waits in, which its Python stack ends above.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace bt::launcher::watchdog {

struct NativeStacks {
  std::map<pid_t, std::string> by_pid;  // gdb's "thread apply all bt" frames, capped
  std::string note;                     // one line: how they were taken, or why not (SKIPPED ...)
};

// Attaches gdb to each of `pids` at once (at most kMaxNativeProcesses), each for at most
// `timeout`, and keeps at most `max_bytes` of frames a process.
// `stop` ends them early (each gdb is killed; it detaches from its process as it dies).
NativeStacks CollectNativeStacks(const std::vector<pid_t>& pids, std::chrono::milliseconds timeout, size_t max_bytes,
                                 const std::function<bool()>& stop = {});

inline constexpr size_t kMaxNativeProcesses = 16;

}  // namespace bt::launcher::watchdog
