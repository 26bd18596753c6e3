#include "launcher/supervision/supervisor.h"

#include <poll.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <dirent.h>
#include <fcntl.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include <spdlog/spdlog.h>

#include "launcher/supervision/job_guard.h"
#include "launcher/supervision/output_relay.h"
#include "launcher/supervision/proc_table.h"

namespace bt::launcher {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::milliseconds kGroupPollInterval{20};

int ExitCodeOf(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 70;
}

std::string Describe(const Command& command) {
  if (command.argv.size() == 3 && command.argv[0] == "/bin/sh") return command.argv[2];
  std::string text;
  for (const auto& arg : command.argv) text += (text.empty() ? "" : " ") + arg;
  return text;
}

// bt-launch's own helpers (the checkpoint uploader and what it runs) are stopped by their
// owner, after the drain: never by the job's signals.
bool IsLauncherHelper(pid_t pid) {
  std::ifstream file("/proc/" + std::to_string(pid) + "/cmdline", std::ios::binary);
  std::string program;
  std::string subcommand;
  std::getline(file, program, '\0');
  std::getline(file, subcommand, '\0');
  return subcommand == "upload-worker";
}

// The pids a /proc/self/task/<tid>/children file lists (space-separated), added to
// `children`. Read with read(2), not a stream: this runs twice on every start, where a
// stream's set-up was most of its cost.
void AddChildrenOf(const char* tid, std::set<pid_t>& children) {
  const std::string path = std::string("/proc/self/task/") + tid + "/children";
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  std::string text;
  char chunk[4096];
  for (ssize_t got; (got = read(fd, chunk, sizeof chunk)) > 0;) text.append(chunk, size_t(got));
  close(fd);
  const char* cursor = text.c_str();
  for (char* end = nullptr;; cursor = end) {
    const long pid = std::strtol(cursor, &end, 10);
    if (end == cursor) return;
    children.insert(pid_t(pid));
  }
}

// Our direct children, from /proc/self/task/*/children: a few small reads, not a walk of
// every process, since the launcher calls this on every start.
std::set<pid_t> CurrentChildren() {
  std::set<pid_t> children;
  DIR* tasks = opendir("/proc/self/task");
  if (tasks == nullptr) return children;
  while (dirent* task = readdir(tasks)) {
    if (std::isdigit(static_cast<unsigned char>(task->d_name[0]))) AddChildrenOf(task->d_name, children);
  }
  closedir(tasks);
  return children;
}

// Every live process below this launcher, outside `skip_group`, outside helpers, and
// outside what the launcher already had as children when it started supervising: a shell's
// process substitution (`bt-launch ... > >(sed ...)`) is forked before the exec, so the
// log consumer is our child, and stopping it would cut our own output.
std::vector<pid_t> EscapedDescendants(pid_t skip_group, const std::set<pid_t>& inherited) {
  const auto processes = AllProcesses();
  std::vector<pid_t> found;
  std::vector<pid_t> parents = {getpid()};
  while (!parents.empty()) {
    pid_t parent = parents.back();
    parents.pop_back();
    for (const auto& process : processes) {
      if (process.parent != parent || process.state == 'Z' || IsLauncherHelper(process.pid)) continue;
      if (parent == getpid() && inherited.contains(process.pid)) continue;
      parents.push_back(process.pid);
      if (process.group != skip_group) found.push_back(process.pid);
    }
  }
  return found;
}

// Members that still run: a zombie counts for kill(-pgid, 0) until its parent reaps it,
// and a parent that escaped the group (setsid) may never reap it.
bool GroupHasMembers(pid_t group) {
  if (kill(-group, 0) != 0) return false;
  for (const auto& process : AllProcesses()) {
    if (process.group == group && process.state != 'Z') return true;
  }
  return false;
}

// `run -- CMD` is looked up in the job's PATH, as a shell started with that environment
// would, not in the launcher's.
std::string ResolveInJobPath(const std::string& name, const std::vector<std::string>& environ) {
  if (name.find('/') != std::string::npos) return name;
  std::string path = "/usr/local/bin:/usr/bin:/bin";
  for (const auto& entry : environ) {
    if (entry.rfind("PATH=", 0) == 0) path = entry.substr(5);
  }
  std::istringstream directories(path);
  for (std::string directory; std::getline(directories, directory, ':');) {
    const std::string candidate = (directory.empty() ? "." : directory) + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return name;  // not found: posix_spawn reports ENOENT, which becomes 127
}

// The job reads the terminal only if its group is the terminal's foreground group;
// otherwise an interactive `bt-launch run -- bash` would stop on SIGTTIN.
bool HandTerminalTo(pid_t group) {
  if (!isatty(STDIN_FILENO) || tcgetpgrp(STDIN_FILENO) != getpgrp()) return false;
  return tcsetpgrp(STDIN_FILENO, group) == 0;
}

void ReclaimTerminal(bool handed) {
  if (handed) tcsetpgrp(STDIN_FILENO, getpgrp());
}

// posix_spawn (vfork-fast) with the child's mask and dispositions reset: the launcher's
// blocked signals must not stay blocked in the job, or it could never be stopped. With a
// relay, the streams it takes over are its pipes in the child.
pid_t Spawn(const Command& command, const std::vector<std::string>& environ, const std::string& guard_entry,
            const std::string& working_dir, const sigset_t& child_mask, const sigset_t& reset_signals,
            const OutputRelay* relay, int& spawn_error) {
  std::vector<char*> argv;
  for (const auto& arg : command.argv) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const auto& entry : environ) envp.push_back(const_cast<char*>(entry.c_str()));
  if (!guard_entry.empty()) envp.push_back(const_cast<char*>(guard_entry.c_str()));
  envp.push_back(nullptr);

  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  posix_spawnattr_setpgroup(&attributes, 0);  // its own group: we signal the whole tree at once
  posix_spawnattr_setsigmask(&attributes, &child_mask);
  posix_spawnattr_setsigdefault(&attributes, &reset_signals);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (!working_dir.empty()) posix_spawn_file_actions_addchdir_np(&actions, working_dir.c_str());
  if (relay != nullptr) relay->AddToSpawn(actions);

  pid_t pid = -1;
  const std::string program = command.search_path ? ResolveInJobPath(command.argv[0], environ) : command.argv[0];
  spawn_error = posix_spawn(&pid, program.c_str(), &actions, &attributes, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  return spawn_error == 0 ? pid : -1;
}

}  // namespace

Command ShellCommand(const std::string& text) { return Command{{"/bin/sh", "-c", text}, false}; }

Supervisor::Supervisor(SignalRouter& signals, std::chrono::milliseconds grace_period,
                       std::chrono::milliseconds peer_failure_grace, watchdog::Progress* progress,
                       const watchdog::OutputFiles* output_files)
    : signals_(signals),
      grace_period_(grace_period),
      peer_failure_grace_(peer_failure_grace),
      active_grace_(grace_period),
      inherited_children_(CurrentChildren()),
      progress_(progress),
      output_files_(output_files) {
  // Not PID 1 (docker run without --init, a local test, mpirun): become a subreaper so
  // that orphaned grandchildren are re-parented to us and reaped, not to the host's init.
  if (getpid() != 1 && prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
    spdlog::warn("cannot become a child subreaper ({}); orphans will be reaped by init", std::strerror(errno));
  }
}

Supervisor::~Supervisor() = default;

JobOutcome Supervisor::Run(const std::vector<Command>& commands, const std::vector<std::string>& environ,
                           const std::string& working_dir, StopRequests* stop, const std::string& label) {
  JobOutcome outcome;
  for (size_t index = 0; index < commands.size(); ++index) {
    DrainSignalsBetweenCommands(outcome);
    if (shutting_down_) break;
    if (stop != nullptr) {
      if (auto reason = stop->TakeStop()) {
        outcome.stop_reason = reason;
        break;
      }
    }
    spdlog::info("{} {}/{}: {}", label, index + 1, commands.size(), Describe(commands[index]));
    int code = RunOne(commands[index], environ, working_dir, stop, outcome);
    outcome.commands_run = index + 1;
    outcome.exit_code = code;
    if (code != 0) {
      outcome.failed_command = index;
      if (!shutting_down_) spdlog::error("{} {} exited with code {}: {}", label, index + 1, code, Describe(commands[index]));
      break;
    }
  }
  StopEscapedDescendants();
  // Once nothing of the job runs (what left its group was stopped just above), the relay
  // forwards the rest: the pipes' end of file, or what is there when its bound passes.
  if (relay_) {
    relay_->Finish(kRelayDrainBound);
    relay_.reset();
  }
  // A job that handled the signal and exited 0 keeps its 0, unless the signal kept later
  // start commands from running: then the job did not complete.
  bool incomplete = outcome.commands_run < commands.size();
  if (outcome.shutdown_signal && outcome.exit_code == 0 && incomplete) outcome.exit_code = 128 + *outcome.shutdown_signal;
  return outcome;
}

int Supervisor::RunOne(const Command& command, const std::vector<std::string>& environ, const std::string& working_dir,
                       StopRequests* stop, JobOutcome& outcome) {
  sigset_t reset = signals_.routed_signals();
  sigaddset(&reset, SIGPIPE);
  // One relay for all the commands of this Run: a process that left a command's group
  // (setsid) may write on while the next command runs, until the end of the Run stops it.
  if (progress_ != nullptr && !relay_) {
    OutputRelay::Options options;
    options.files = output_files_;
    options.on_lines = on_lines_;
    relay_ = std::make_unique<OutputRelay>(*progress_, STDOUT_FILENO, STDERR_FILENO, options);
  }
  // Under mpirun the launcher may be SIGKILLed a second after its SIGTERM: the group must
  // not outlive it. The guard is ours, not the job's: never signalled as an escaped process.
  JobGuard guard;
  inherited_children_.insert(guard.pid());
  int spawn_error = 0;
  pid_t child = Spawn(command, environ, guard.environment_entry(), working_dir, signals_.original_mask(), reset,
                      relay_.get(), spawn_error);
  if (child < 0) {
    inherited_children_.erase(guard.pid());
    spdlog::error("cannot execute {}: {}", command.argv.front(), std::strerror(spawn_error));
    return spawn_error == ENOENT ? 127 : 126;  // the shell's codes for "not found" / "not executable"
  }
  guard.Guard(child);
  bool terminal_handed = HandTerminalTo(child);
  std::optional<int> status;
  while (!status) {
    // Once a stop has been taken its fd may stay readable (a leader that is gone): polling it
    // again would spin a core through the grace period.
    const bool watch_stop = stop != nullptr && !outcome.stop_reason;
    pollfd fds[2] = {{signals_.fd(), POLLIN, 0}, {watch_stop ? stop->fd() : -1, POLLIN, 0}};
    if (Poll(fds, 2, PollTimeoutMs()) < 0 && errno != EINTR) {
      spdlog::critical("poll failed: {}", std::strerror(errno));
      kill(-child, SIGKILL);
    }
    EscalateIfGraceOver(child);
    while (auto signal_number = signals_.Take()) {
      if (*signal_number == SIGCHLD) {
        ReapChildren(child, status);
      } else if (*signal_number != SIGTTOU) {
        OnSignal(*signal_number, child, outcome);
      }
    }
    if (watch_stop && (fds[1].revents & POLLIN)) {
      if (auto reason = stop->TakeStop()) {
        outcome.stop_reason = reason;
        spdlog::error("stopping the job: {}", *reason);
        kill(-child, SIGTERM);
        // Another node failed: the collectives this training waits on cannot complete, so
        // a long grace only delays the job's end.
        BeginShutdown(child, peer_failure_grace_);
      }
    }
  }
  ReclaimTerminal(terminal_handed);
  CleanUpGroup(child, outcome);
  // The command's last output (a traceback) comes before the launcher's lines about its end.
  if (relay_) relay_->Sync(kRelayDrainBound);
  outcome.terminating_signal = WIFSIGNALED(*status) ? std::optional<int>(WTERMSIG(*status)) : std::nullopt;
  inherited_children_.erase(guard.pid());
  return ExitCodeOf(*status);
}

// A shutdown signal goes to the whole group, so a shell's children (torchrun, its
// workers, dataloaders) see it too, not just the shell.
void Supervisor::OnSignal(int signal_number, pid_t group, JobOutcome& outcome) {
  if (!StartsShutdown(signal_number)) {
    ForwardRequest(signal_number, group);
    return;
  }
  spdlog::info("received {}; forwarding it to process group {}", strsignal(signal_number), group);
  kill(-group, signal_number);
  // Processes that left the group (torchrun starts its workers in new sessions) get it too:
  // once their parent is SIGKILLed after the grace, nobody else would tell them.
  for (pid_t pid : EscapedDescendants(group, inherited_children_)) {
    spdlog::info("forwarding {} to process {} ({}), which left the job's process group", strsignal(signal_number), pid,
                 CommandLine(pid));
    kill(pid, signal_number);
  }
  if (!outcome.shutdown_signal) outcome.shutdown_signal = signal_number;
  BeginShutdown(group, grace_period_);
}

// HUP, USR1 and USR2 ask the job for something (Slurm's --signal=USR1@90 and Lightning's
// auto-requeue ask for a checkpoint): they go to the processes that handle them. The
// `/bin/sh -c` wrapper of a compound command (`cd X && python train.py`) and the stages of a
// pipeline (`| tee`) keep the default action, which is to die, and their death would end the
// job: they are left alone. When no process handles the signal, the whole group gets it, as
// it would without a launcher.
void Supervisor::ForwardRequest(int signal_number, pid_t group) {
  std::vector<pid_t> handlers;
  for (const auto& process : AllProcesses()) {
    if (process.group == group && process.state != 'Z' && HandlesSignal(process.pid, signal_number)) handlers.push_back(process.pid);
  }
  for (pid_t pid : EscapedDescendants(group, inherited_children_)) {
    if (HandlesSignal(pid, signal_number)) handlers.push_back(pid);
  }
  if (handlers.empty()) {
    spdlog::info("received {}; no process of the job handles it: forwarding it to process group {}", strsignal(signal_number), group);
    kill(-group, signal_number);
    return;
  }
  for (pid_t pid : handlers) {
    spdlog::info("received {}; forwarding it to process {} ({}), which handles it", strsignal(signal_number), pid, CommandLine(pid));
    kill(pid, signal_number);
  }
}

void Supervisor::BeginShutdown(pid_t group, std::chrono::milliseconds grace) {
  shutting_down_ = true;
  // The stop's one grace also covers what left the group, even when the group's clean-up
  // after its command exited is already under way (on its own, earlier, deadline).
  if (!stop_grace_ends_) stop_grace_ends_ = Clock::now() + grace;
  if (kill_deadline_) return;
  kill_deadline_ = stop_grace_ends_;
  active_grace_ = grace;
  spdlog::info("process group {} has {} ms to exit before SIGKILL", group, grace.count());
}

void Supervisor::EscalateIfGraceOver(pid_t group) {
  if (!kill_deadline_ || Clock::now() < *kill_deadline_) return;
  spdlog::warn("grace period of {} ms is over: sending SIGKILL to process group {}", active_grace_.count(), group);
  kill(-group, SIGKILL);
  kill_deadline_ = Clock::time_point::max();
}

// SIGCHLD is coalesced: one signal may stand for many exits, so reap until none is left.
void Supervisor::ReapChildren(pid_t child, std::optional<int>& child_status) {
  while (true) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;
    if (pid == child) {
      child_status = status;
    } else {
      spdlog::debug("reaped orphan process {} (exit code {})", pid, ExitCodeOf(status));
    }
  }
}

// The command's shell is gone but its group may live on (background jobs, dataloader
// workers). They belong to this command: TERM them, give them the grace, then KILL.
void Supervisor::CleanUpGroup(pid_t group, JobOutcome& outcome) {
  if (!GroupHasMembers(group)) return;
  spdlog::info("command exited but processes remain in its group {}; sending SIGTERM", group);
  kill(-group, SIGTERM);
  if (!kill_deadline_) kill_deadline_ = Clock::now() + grace_period_;
  std::optional<int> unused;
  while (GroupHasMembers(group)) {
    pollfd fds[1] = {{signals_.fd(), POLLIN, 0}};
    Poll(fds, 1, int(kGroupPollInterval.count()));
    EscalateIfGraceOver(group);
    while (auto signal_number = signals_.Take()) {
      if (*signal_number == SIGCHLD) {
        ReapChildren(-1, unused);
      } else if (*signal_number != SIGTTOU) {
        OnSignal(*signal_number, group, outcome);  // a TERM now still stops the job
      }
    }
  }
  ReapChildren(-1, unused);
  if (!shutting_down_) kill_deadline_.reset();
}

// When bt-launch is not PID 1 (under a shell, mpirun, Slurm), a process that left the job's
// group (setsid, a daemonising tool) would outlive the launcher: as their subreaper we find
// them after the job and stop them as the group is stopped: TERM, the grace, then KILL.
void Supervisor::StopEscapedDescendants() {
  // Anything that escaped and outlived its parents is re-parented to us (the subreaper):
  // without a child of our own beyond the inherited ones and helpers, there is nothing to walk.
  std::set<pid_t> own = CurrentChildren();
  std::erase_if(own, [&](pid_t pid) { return inherited_children_.contains(pid) || IsLauncherHelper(pid); });
  if (own.empty()) return;
  std::vector<pid_t> escaped = EscapedDescendants(0, inherited_children_);
  if (escaped.empty()) return;
  for (pid_t pid : escaped) {
    spdlog::warn("process {} ({}) outlived the job's commands: sending SIGTERM", pid, CommandLine(pid));
    kill(pid, SIGTERM);
  }
  const auto deadline = stop_grace_ends_.value_or(Clock::now() + grace_period_);
  std::optional<int> unused;
  while (Clock::now() < deadline && !EscapedDescendants(0, inherited_children_).empty()) {
    pollfd fds[1] = {{signals_.fd(), POLLIN, 0}};
    Poll(fds, 1, int(kGroupPollInterval.count()));
    while (auto signal_number = signals_.Take()) {
      if (*signal_number == SIGCHLD) {
        ReapChildren(-1, unused);
      } else if (StartsShutdown(*signal_number)) {
        // Already stopping them: the deadline stands, within one grace of the first stop.
        spdlog::info("received {} while stopping processes that outlived the job; they are already being stopped",
                     strsignal(*signal_number));
      }
    }
  }
  for (pid_t pid : EscapedDescendants(0, inherited_children_)) {
    spdlog::warn("process {} ({}) is still running after the grace period: sending SIGKILL", pid, CommandLine(pid));
    kill(pid, SIGKILL);
  }
  std::this_thread::sleep_for(kGroupPollInterval);
  ReapChildren(-1, unused);
}

// A signal that arrives while no command runs still counts: TERM between two start
// commands must not let the next one start.
void Supervisor::DrainSignalsBetweenCommands(JobOutcome& outcome) {
  std::optional<int> unused;
  while (auto signal_number = signals_.Take()) {
    if (*signal_number == SIGCHLD) {
      ReapChildren(-1, unused);
    } else if (StartsShutdown(*signal_number)) {
      spdlog::info("received {} between commands; not starting the next one", strsignal(*signal_number));
      if (!outcome.shutdown_signal) outcome.shutdown_signal = *signal_number;
      shutting_down_ = true;
    }
  }
}

// poll(2) over `fds` (at most 2) and, until the relay's thread runs, the relay's pipes: the
// job's first output starts it (OutputRelay::StartWhenReadable).
int Supervisor::Poll(pollfd* fds, int count, int timeout_ms) {
  if (!relay_) return poll(fds, nfds_t(count), timeout_ms);
  pollfd all[4];
  std::copy(fds, fds + count, all);
  const auto relay_fds = relay_->StartWhenReadable();
  std::copy(relay_fds.begin(), relay_fds.end(), all + count);
  const int ready = poll(all, nfds_t(count + 2), timeout_ms);
  std::copy(all, all + count, fds);
  if (ready > 0 && (all[count].revents != 0 || all[count + 1].revents != 0)) relay_->Start();
  return ready;
}

int Supervisor::PollTimeoutMs() const {
  if (!kill_deadline_ || *kill_deadline_ == Clock::time_point::max()) return -1;
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*kill_deadline_ - Clock::now()).count();
  return int(std::max<int64_t>(0, left) + 1);
}

}  // namespace bt::launcher
