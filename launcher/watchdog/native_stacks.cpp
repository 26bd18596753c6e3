#include "launcher/watchdog/native_stacks.h"

#include <unistd.h>

#include <mutex>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "storage/subprocess.h"

namespace bt::launcher::watchdog {
namespace {

using Clock = std::chrono::steady_clock;

// gdb's output without its chatter ("[New LWP ...]", symbol warnings): thread headers and
// frames.
std::string FramesOf(const std::string& output, size_t max_bytes) {
  std::string frames;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("Thread ", 0) != 0 && line.rfind('#', 0) != 0) continue;
    if (frames.size() + line.size() + 1 > max_bytes) return frames + "... (cut at " + std::to_string(max_bytes) + " bytes)\n";
    frames += line + "\n";
  }
  return frames;
}

}  // namespace

NativeStacks CollectNativeStacks(const std::vector<pid_t>& pids, std::chrono::milliseconds timeout, size_t max_bytes,
                                 const std::function<bool()>& stop) {
  NativeStacks stacks;
  const std::string gdb = storage::FindOnPath("gdb");
  if (gdb.empty()) {
    stacks.note = "native frames: SKIPPED (gdb is not installed; apt-get install gdb to have them)";
    return stacks;
  }
  std::mutex mutex;
  std::vector<std::string> failures;
  std::vector<std::thread> threads;
  const auto deadline = Clock::now() + timeout;
  for (size_t index = 0; index < pids.size() && index < kMaxNativeProcesses; ++index) {
    threads.emplace_back([&, pid = pids[index]] {
      const std::vector<std::string> argv = {gdb, "-p", std::to_string(pid), "-batch", "-nx", "-ex", "set pagination off",
                                             "-ex", "thread apply all bt 40"};
      std::string errors;
      const auto collect = [&](const std::string& line) {
        if (errors.size() < 512) errors += line + " ";
      };
      const auto stop_at_deadline = [&] {
        if (Clock::now() >= deadline) throw std::runtime_error("gdb did not finish in time");
        if (stop && stop()) throw std::runtime_error("stopped: the cycle ended");
      };
      std::string frames;
      std::string failure;
      try {
        const storage::ProcessResult result = storage::RunProcess(argv, {"PATH=/usr/bin:/bin", "LC_ALL=C"}, collect, stop_at_deadline);
        frames = FramesOf(result.output, max_bytes);
        if (frames.empty()) failure = "pid " + std::to_string(pid) + ": " + (errors.empty() ? "no frames" : errors);
      } catch (const std::exception& error) {
        failure = "pid " + std::to_string(pid) + ": " + error.what();
      }
      std::lock_guard lock(mutex);
      if (!frames.empty()) stacks.by_pid[pid] = std::move(frames);
      if (!failure.empty()) failures.push_back(std::move(failure));
    });
  }
  for (std::thread& thread : threads) thread.join();
  stacks.note = "native frames: gdb (" + gdb + ") for " + std::to_string(stacks.by_pid.size()) + " of " +
                std::to_string(pids.size()) + " processes";
  if (pids.size() > kMaxNativeProcesses) stacks.note += " (at most " + std::to_string(kMaxNativeProcesses) + ")";
  for (const std::string& failure : failures) stacks.note += "; " + failure;
  return stacks;
}

}  // namespace bt::launcher::watchdog
