// Runs the job's commands as PID 1 (or as a child subreaper) would: one process group
// per command, signals forwarded to the group, zombies reaped, SIGKILL after the grace
// period, and the exit status turned into an exit code.
#pragma once

#include <poll.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "launcher/supervision/signals.h"
#include "launcher/watchdog/output_files.h"
#include "launcher/watchdog/progress.h"

namespace bt::launcher {

// A reason to end the job that is not a signal: a peer node failed. `fd()` becomes
// readable when TakeStop() may have something.
class StopRequests {
 public:
  virtual ~StopRequests() = default;
  virtual int fd() const = 0;
  virtual std::optional<std::string> TakeStop() = 0;
};

struct Command {
  std::vector<std::string> argv;
  bool search_path = false;  // execvp-style lookup (commands given after `--`)
};

Command ShellCommand(const std::string& text);

struct JobOutcome {
  int exit_code = 0;
  size_t commands_run = 0;
  std::optional<size_t> failed_command;  // index of the first failing command
  std::optional<int> terminating_signal;  // the last command's wait status says a signal ended it
                                          // (a shell's own `exit 130` is no signal)
  std::optional<int> shutdown_signal;    // the signal that ended the job early
  std::optional<std::string> stop_reason;  // set when a StopRequests ended the job
  std::optional<std::string> launcher_failure;  // the launcher itself failed before the commands (weights, seed)
  std::optional<std::string> cause;     // why this node's job failed, where the launcher knows (its hardware)
  std::optional<std::string> left_job;  // why this launcher left a job that goes on (its node unhealthy)
};

class OutputRelay;

class Supervisor {
 public:
  // `peer_failure_grace` replaces `grace_period` when the stop comes from another node.
  // With `progress`, the commands' stdout and stderr go through the launcher (OutputRelay:
  // pipes and one thread per Run, for the streams that are not a terminal, nor a file in
  // `output_files`, which the commands write through their own descriptions) and every
  // byte they write is noted there; without it (nullptr) the commands inherit the launcher's.
  Supervisor(SignalRouter& signals, std::chrono::milliseconds grace_period,
             std::chrono::milliseconds peer_failure_grace = std::chrono::seconds(5),
             watchdog::Progress* progress = nullptr, const watchdog::OutputFiles* output_files = nullptr);
  ~Supervisor();
  // With `progress`: every block of whole lines the commands write (OutputRelayOptions::on_lines).
  void ObserveLines(std::function<void(std::string_view lines)> on_lines) { on_lines_ = std::move(on_lines); }

  // Runs `commands` in order and stops at the first that fails or at a shutdown. `label`
  // names them in the log ("start command 2/3: ...").
  JobOutcome Run(const std::vector<Command>& commands, const std::vector<std::string>& environ,
                 const std::string& working_dir, StopRequests* stop, const std::string& label = "start command");

 private:
  int RunOne(const Command& command, const std::vector<std::string>& environ, const std::string& working_dir,
             StopRequests* stop, JobOutcome& outcome);
  void OnSignal(int signal_number, pid_t group, JobOutcome& outcome);
  void ForwardRequest(int signal_number, pid_t group);
  void BeginShutdown(pid_t group, std::chrono::milliseconds grace);
  void ReapChildren(pid_t child, std::optional<int>& child_status);
  void EscalateIfGraceOver(pid_t group);
  void CleanUpGroup(pid_t group, JobOutcome& outcome);
  void DrainSignalsBetweenCommands(JobOutcome& outcome);
  void StopEscapedDescendants();
  int PollTimeoutMs() const;
  int Poll(pollfd* fds, int count, int timeout_ms);

  SignalRouter& signals_;
  std::chrono::milliseconds grace_period_;
  std::chrono::milliseconds peer_failure_grace_;
  std::chrono::milliseconds active_grace_;
  std::set<pid_t> inherited_children_;  // ours before we spawned anything, and the job's guard: not the job's
  std::optional<std::chrono::steady_clock::time_point> kill_deadline_;
  // When the grace of a stop (a signal, a failed peer) ends: it covers processes that left
  // the group as well, so the whole stop fits one grace (Slurm's KillWait, a pod's period).
  std::optional<std::chrono::steady_clock::time_point> stop_grace_ends_;
  bool shutting_down_ = false;
  watchdog::Progress* progress_ = nullptr;
  const watchdog::OutputFiles* output_files_ = nullptr;
  std::unique_ptr<OutputRelay> relay_;  // during Run, with `progress_`
  std::function<void(std::string_view lines)> on_lines_;
};

}  // namespace bt::launcher
