// Every thread's Python stack of every Python process of the job, without ptrace (which
// containers often forbid): a startup hook, a sitecustomize.py placed first on the job's
// PYTHONPATH, arms faulthandler on a real-time signal in each interpreter and leaves a
// marker naming the process; the launcher signals only processes that armed, so a shell
// or a native binary of the job never receives a signal whose default action kills it.
// faulthandler's handler is C code that needs no GIL: a worker stuck in a C call that
// holds the GIL still answers.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace bt::launcher::watchdog {

// The signal the hook arms: a real-time one, which no training framework uses (SIGUSR1
// is Lightning's requeue signal under Slurm).
int StackSignal();

// Writes the hook into `hook_dir` and creates `dumps_dir`. Returns what the job's
// environment needs: PYTHONPATH (the hook first, then `user_pythonpath`), BT_STACK_DIR
// and BT_STACK_SIGNAL. The hook runs the sitecustomize it shadows, if the image or the
// user has one. Throws std::runtime_error naming the path it could not write.
std::map<std::string, std::string> InstallPythonStackHook(const std::filesystem::path& hook_dir,
                                                          const std::filesystem::path& dumps_dir,
                                                          const std::string& user_pythonpath);

// Removes the markers and dumps of processes that are gone: every forked DataLoader worker
// leaves a pair, and a long training forks tens of thousands.
void PruneStaleMarkers(const std::filesystem::path& dumps_dir);

struct ProcessStack {
  pid_t pid = 0;
  std::map<std::string, std::string> labels;  // BT_NODE_RANK, RANK, LOCAL_RANK... as the process saw them
  std::string command;                        // its command line, arguments separated by spaces
  std::string dump;                           // faulthandler's text for this request, capped
  bool answered = false;                      // false: armed and alive, but wrote nothing in time
};

// Signals every live process that armed the hook and gathers what each wrote, at most
// `max_bytes` per process, waiting at most `timeout` for all of them together.
// `stop` ends the wait early (the cycle ended meanwhile): what was written by then is kept.
std::vector<ProcessStack> CollectPythonStacks(const std::filesystem::path& dumps_dir, std::chrono::milliseconds timeout,
                                              size_t max_bytes, const std::function<bool()>& stop = {});

}  // namespace bt::launcher::watchdog
