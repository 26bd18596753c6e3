// Runs the real bt-launch binary for integration tests: output captured, a hard time
// bound, optional environment changes and a non-root user.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace bt::testing {

struct ProcessResult {
  int exit_code = -1;  // 128+signal when killed
  std::string out;
  std::string err;
  bool timed_out = false;
  std::chrono::milliseconds elapsed{0};
};

struct LaunchSpec {
  std::vector<std::string> args;                 // after the binary name
  std::map<std::string, std::string> set_env;
  std::vector<std::string> unset_env;
  std::optional<uid_t> run_as_uid;               // setuid (and setgid to the same id) before exec
  std::chrono::milliseconds timeout{30000};
  // When set, the launcher's stdout and stderr are this file, appended to (created if need
  // be), as `bt-launch run >> FILE 2>&1` gives them; ProcessResult's out and err stay empty.
  std::optional<std::string> output_file;
};

class LauncherProcess {
 public:
  explicit LauncherProcess(const LaunchSpec& spec, const std::string& binary = BT_LAUNCH_BINARY);
  ~LauncherProcess();
  LauncherProcess(const LauncherProcess&) = delete;
  LauncherProcess& operator=(const LauncherProcess&) = delete;

  pid_t pid() const { return pid_; }
  // Reads output until the job's stdout contains `text` (the launcher's own log, on
  // stderr, echoes the command text); false on timeout or exit.
  bool WaitForOutput(const std::string& text, std::chrono::milliseconds timeout);
  // The same for the launcher's own log (stderr).
  bool WaitForLog(const std::string& text, std::chrono::milliseconds timeout);
  // The launcher's own log as read so far (by the waits above).
  const std::string& LogSoFar() const { return result_.err; }
  void Signal(int signal_number);
  ProcessResult Finish();  // waits up to the spec's timeout, then SIGKILLs

 private:
  bool Pump(int timeout_ms);  // reads available output; false once both pipes are closed
  pid_t pid_ = -1;
  int out_fd_ = -1;
  int err_fd_ = -1;
  std::chrono::steady_clock::time_point start_;
  std::chrono::milliseconds timeout_;
  ProcessResult result_;
  bool finished_ = false;
};

ProcessResult RunLauncher(const LaunchSpec& spec, const std::string& binary = BT_LAUNCH_BINARY);

// Children of `parent` in state Z, from /proc.
std::vector<pid_t> ZombieChildrenOf(pid_t parent);
std::vector<pid_t> ChildrenOf(pid_t parent);

// The whole content of a file ("" when it cannot be read).
std::string ReadFile(const std::string& path);

// Writes `content` to `path` (creating parent directories).
void WriteFile(const std::string& path, const std::string& content = "");

// A TCP port that was free a moment ago, for a test's rendezvous: in [20000, 32000), below
// the kernel's ephemeral range.
uint16_t FreePort();

// A fresh directory under /tmp, removed by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string Write(const std::string& name, const std::string& content) const;

 private:
  std::string path_;
};

}  // namespace bt::testing
