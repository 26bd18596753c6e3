#include "launcher/watchdog/python_stacks.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <thread>

#include <nlohmann/json.hpp>

#include "launcher/supervision/proc_table.h"
#include "storage/durable_file.h"
#include "storage/json_bytes.h"

namespace bt::launcher::watchdog {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;

// What the hook does, in the job's interpreters. Kept short and defensive: nothing here
// may stop the user's program, nor write a word on its stdout or stderr (a program's
// captured output): a failure to arm is silent, and that process's stacks come from gdb
// only. A fork arms nothing (no cost per DataLoader worker, no file): it inherits the
// handler and its file, and the launcher asks it after the process it was forked from.
constexpr const char* kSiteCustomize = R"PY(# Written by bt-launch (launcher/watchdog/python_stacks.cpp): arms faulthandler so that
# bt-launch can read every thread's stack of this process when the job stops making
# progress, then runs the sitecustomize this file shadows (the image's or the user's).
import os
import sys


def _bt_launch_arm():
    import faulthandler
    import json
    directory = os.environ.get("BT_STACK_DIR")
    signum = int(os.environ.get("BT_STACK_SIGNAL") or 0)
    if not directory or signum <= 0:
        return
    pid = os.getpid()
    with open("/proc/self/stat") as stat:
        start_time = stat.read().rsplit(")", 1)[1].split()[19]
    with open("/proc/self/cmdline", "rb") as cmdline:
        command = [part.decode("utf-8", "replace") for part in cmdline.read().split(b"\0") if part]
    dump = open(os.path.join(directory, "%d.stack" % pid), "a")
    faulthandler.register(signum, file=dump, all_threads=True)
    globals()["_bt_launch_dump"] = dump  # faulthandler holds only the descriptor
    labels = {name: os.environ[name] for name in ("BT_NODE_RANK", "RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE")
              if name in os.environ}
    labels["PPID"] = str(os.getppid())  # a spawned worker inherits RANK: its parent tells it apart
    marker = os.path.join(directory, "%d.armed" % pid)
    with open(marker + ".tmp", "w") as out:
        json.dump({"pid": pid, "start_time": start_time, "labels": labels, "command": command}, out)
    os.replace(marker + ".tmp", marker)


def _bt_launch_arm_quietly():
    try:
        _bt_launch_arm()
    except Exception:  # a stack we cannot take must never stop the training, nor print into its output
        pass


def _bt_launch_run_shadowed():
    here = os.path.dirname(os.path.abspath(__file__))
    ours = sys.modules.pop("sitecustomize", None)
    saved = sys.path[:]
    sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or ".") != here]
    try:
        import sitecustomize  # noqa: F401
    except ImportError as error:
        if error.name != "sitecustomize":
            raise
        sys.modules["sitecustomize"] = ours
    finally:
        sys.path[:] = saved


_bt_launch_arm_quietly()
_bt_launch_run_shadowed()
)PY";

// The process's start time (field 22 of /proc/PID/stat) as text: with the pid, it names
// one process, so a pid reused since the hook armed is never signalled.
std::optional<std::string> StartTime(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t name_end = text.rfind(')');
  if (name_end == std::string::npos) return std::nullopt;
  std::istringstream fields(text.substr(name_end + 1));
  std::string field;
  for (int index = 3; index <= 22 && fields >> field; ++index) {
    if (index == 22) return field;
  }
  return std::nullopt;
}

// Whether the file holds `text` and nothing else, read straight into one buffer (at most one
// byte more than `text`): this runs on every start, where a stream iterator cost ~13 us.
bool HoldsExactly(const fs::path& path, std::string_view text) {
  storage::FileDescriptor fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return false;
  std::string bytes(text.size() + 1, '\0');
  size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t count = read(fd.get(), bytes.data() + got, bytes.size() - got);
    if (count < 0 && errno == EINTR) continue;
    if (count <= 0) break;
    got += size_t(count);
  }
  return std::string_view(bytes.data(), got) == text;
}

off_t FileSize(const fs::path& path) {
  struct stat info {};
  return stat(path.c_str(), &info) == 0 ? info.st_size : 0;
}

// Bytes [offset, offset + max_bytes) of the file.
std::string ReadFrom(const fs::path& path, off_t offset, size_t max_bytes) {
  storage::FileDescriptor fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return "";
  std::string bytes(max_bytes, '\0');
  ssize_t got = pread(fd.get(), bytes.data(), bytes.size(), offset);
  bytes.resize(got > 0 ? size_t(got) : 0);
  return bytes;
}

struct ArmedProcess {
  ProcessStack stack;
  fs::path dump_path;
  off_t dump_offset = 0;  // what earlier requests wrote
  off_t last_size = 0;
  Clock::time_point last_growth;
};

std::optional<ArmedProcess> ReadMarker(const fs::path& marker) {
  std::ifstream in(marker);
  nlohmann::json json = nlohmann::json::parse(in, nullptr, false);
  if (json.is_discarded() || !json.contains("pid") || !json["pid"].is_number_integer()) return std::nullopt;
  ArmedProcess process;
  process.stack.pid = json["pid"].get<pid_t>();
  if (StartTime(process.stack.pid) != storage::FieldOr(json, "start_time", std::string())) return std::nullopt;  // gone, or reused
  // The same process may have exec'd another program since it armed (os.execvp, pty.spawn):
  // the signal would kill it. Only a process that still catches the signal is one to ask.
  if (!HandlesSignal(process.stack.pid, StackSignal())) return std::nullopt;
  const nlohmann::json labels = storage::FieldOr(json, "labels", nlohmann::json::object());
  for (const auto& [name, value] : labels.items()) {
    if (value.is_string()) process.stack.labels[name] = value.get<std::string>();
  }
  const nlohmann::json command = storage::FieldOr(json, "command", nlohmann::json::array());
  for (const auto& part : command) {
    if (part.is_string()) process.stack.command += (process.stack.command.empty() ? "" : " ") + part.get<std::string>();
  }
  process.dump_path = marker.parent_path() / (std::to_string(process.stack.pid) + ".stack");
  process.dump_offset = process.last_size = FileSize(process.dump_path);
  return process;
}

// A dump is complete when its file grew and then stayed still this long: faulthandler
// writes it from the signal handler in one burst.
constexpr std::chrono::milliseconds kQuietAfterDump{100};

bool DumpSettled(ArmedProcess& process, Clock::time_point now) {
  const off_t size = FileSize(process.dump_path);
  if (size != process.last_size) {
    process.last_size = size;
    process.last_growth = now;
    return false;
  }
  return size > process.dump_offset && now - process.last_growth >= kQuietAfterDump;
}

}  // namespace

int StackSignal() { return SIGRTMIN + 6; }

std::map<std::string, std::string> InstallPythonStackHook(const fs::path& hook_dir, const fs::path& dumps_dir,
                                                          const std::string& user_pythonpath) {
  std::error_code error;
  for (const fs::path& dir : {hook_dir, dumps_dir}) {
    fs::create_directories(dir, error);
    if (error) throw std::runtime_error("cannot create " + dir.string() + ": " + error.message());
  }
  // A job that drops to an unprivileged user still arms: anyone may add a file, as in /tmp
  // (sticky: no one removes another's).
  fs::permissions(dumps_dir, fs::perms::all | fs::perms::sticky_bit, error);
  // Written once per volume: a durable write on every start would cost `run` milliseconds.
  const fs::path hook = hook_dir / "sitecustomize.py";
  if (!HoldsExactly(hook, kSiteCustomize)) storage::WriteFileAtomically(hook.string(), kSiteCustomize);
  return {{"PYTHONPATH", user_pythonpath.empty() ? hook_dir.string() : hook_dir.string() + ":" + user_pythonpath},
          {"BT_STACK_DIR", dumps_dir.string()},
          {"BT_STACK_SIGNAL", std::to_string(StackSignal())}};
}

void PruneStaleMarkers(const fs::path& dumps_dir) {
  std::error_code error;
  std::vector<fs::path> stale;
  for (const auto& entry : fs::directory_iterator(dumps_dir, error)) {
    if (entry.path().extension() != ".armed") continue;
    std::ifstream in(entry.path());
    const nlohmann::json json = nlohmann::json::parse(in, nullptr, false);
    const bool alive = json.is_object() && json.contains("pid") && json["pid"].is_number_integer() &&
                       StartTime(json["pid"].get<pid_t>()) == storage::FieldOr(json, "start_time", std::string());
    if (!alive) stale.push_back(entry.path());
  }
  for (const fs::path& marker : stale) {
    fs::remove(marker, error);
    fs::remove(fs::path(marker).replace_extension(".stack"), error);
  }
}

namespace {

// How long a fork gets to answer before the next fork of the same file is asked: its dump
// comes from a signal handler in milliseconds.
constexpr std::chrono::milliseconds kForkRound{2000};

// Signals every process of `round` at once (each writes its own file, or the round holds
// one process per file) and waits until each dump settled, `deadline` passed or `stop`.
// Each one's dump is then the bytes its file gained meanwhile.
void AskRound(const std::vector<ArmedProcess*>& round, Clock::time_point deadline, size_t max_bytes,
              const std::function<bool()>& stop) {
  const auto start = Clock::now();
  for (ArmedProcess* process : round) {
    process->dump_offset = process->last_size = FileSize(process->dump_path);
    process->last_growth = start;
    kill(process->stack.pid, StackSignal());
  }
  size_t settled = 0;
  while (settled < round.size() && Clock::now() < deadline && !(stop && stop())) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const auto now = Clock::now();
    for (ArmedProcess* process : round) {
      if (process->stack.answered || !DumpSettled(*process, now)) continue;
      process->stack.answered = true;
      ++settled;
    }
  }
  for (ArmedProcess* process : round) {
    const off_t end = FileSize(process->dump_path);
    const size_t length = end > process->dump_offset ? std::min(max_bytes, size_t(end - process->dump_offset)) : 0;
    process->stack.dump = ReadFrom(process->dump_path, process->dump_offset, length);
    process->stack.answered = process->stack.answered || !process->stack.dump.empty();
  }
}

// Forks of armed processes that armed nothing themselves (the hook does nothing at a fork):
// they still catch the stack signal, with the handler and the dump file inherited from
// the nearest armed ancestor, whose labels they share, marked as forked from their parent.
std::vector<ArmedProcess> ForksOf(const std::vector<ArmedProcess>& armed, const std::set<pid_t>& ours) {
  std::map<pid_t, const ArmedProcess*> armed_by_pid;
  for (const ArmedProcess& process : armed) armed_by_pid[process.stack.pid] = &process;
  std::map<pid_t, pid_t> parent_of;
  for (const ProcessEntry& process : AllProcesses()) parent_of[process.pid] = process.parent;
  std::vector<ArmedProcess> forks;
  for (const pid_t pid : ours) {
    if (armed_by_pid.contains(pid) || !parent_of.contains(pid)) continue;
    const ArmedProcess* ancestor = nullptr;
    size_t steps = 0;  // pids read at different moments may loop
    for (pid_t up = parent_of[pid]; ancestor == nullptr && ours.contains(up) && ++steps <= ours.size(); up = parent_of[up]) {
      if (auto found = armed_by_pid.find(up); found != armed_by_pid.end()) ancestor = found->second;
    }
    // A process that exec'd another program no longer catches the signal: never asked.
    if (ancestor == nullptr || !HandlesSignal(pid, StackSignal())) continue;
    ArmedProcess fork;
    fork.stack.pid = pid;
    fork.stack.labels = ancestor->stack.labels;
    fork.stack.labels["PPID"] = std::to_string(parent_of[pid]);
    fork.stack.labels["forked_from"] = std::to_string(parent_of[pid]);
    fork.stack.command = CommandLine(pid);
    fork.dump_path = ancestor->dump_path;
    forks.push_back(std::move(fork));
  }
  return forks;
}

}  // namespace

std::vector<ProcessStack> CollectPythonStacks(const fs::path& dumps_dir, std::chrono::milliseconds timeout,
                                              size_t max_bytes, const std::function<bool()>& stop) {
  const auto deadline = Clock::now() + timeout;
  std::vector<ArmedProcess> armed;
  std::error_code error;
  // Only the launcher's descendants are the job's and may be signalled: a marker could name
  // another launcher's process (a folder shared by mistake) or a pid reused by anything.
  const std::set<pid_t> ours = DescendantsOf(getpid());
  for (const auto& entry : fs::directory_iterator(dumps_dir, error)) {
    if (entry.path().extension() != ".armed") continue;
    auto process = ReadMarker(entry.path());
    if (process && ours.contains(process->stack.pid)) armed.push_back(std::move(*process));
  }
  std::vector<ArmedProcess> forks = ForksOf(armed, ours);
  // First every armed process, each into its own file, at once.
  std::vector<ArmedProcess*> round;
  for (ArmedProcess& process : armed) round.push_back(&process);
  AskRound(round, deadline, max_bytes, stop);
  // Then the forks, one per file at a time: two dumps into one file would interleave.
  std::map<fs::path, std::vector<ArmedProcess*>> forks_by_file;
  for (ArmedProcess& fork : forks) forks_by_file[fork.dump_path].push_back(&fork);
  for (size_t index = 0; Clock::now() < deadline && !(stop && stop()); ++index) {
    round.clear();
    for (auto& [file, waiting] : forks_by_file) {
      if (index < waiting.size()) round.push_back(waiting[index]);
    }
    if (round.empty()) break;
    AskRound(round, std::min(deadline, Clock::now() + kForkRound), max_bytes, stop);
  }
  std::vector<ProcessStack> stacks;
  for (auto& process : armed) stacks.push_back(std::move(process.stack));
  for (auto& fork : forks) stacks.push_back(std::move(fork.stack));
  std::sort(stacks.begin(), stacks.end(), [](const ProcessStack& a, const ProcessStack& b) { return a.pid < b.pid; });
  return stacks;
}

}  // namespace bt::launcher::watchdog
