#include "launcher/watchdog/python_stacks.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <thread>

#include <nlohmann/json.hpp>

#include "launcher/supervision/proc_table.h"
#include "storage/durable_file.h"

namespace bt::launcher::watchdog {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;

// What the hook does, in the job's interpreters. Kept short and defensive: nothing here
// may stop the user's program, so a failure to arm is one line on stderr.
constexpr const char* kSiteCustomize = R"PY(# Written by bt-launch (launcher/watchdog/python_stacks.cpp): arms faulthandler so that
# bt-launch can read every thread's stack of this process when the job stops making
# progress, then runs the sitecustomize this file shadows (the image's or the user's).
import os
import sys


def _bt_launch_arm(forked_from=None):
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
    if forked_from:
        labels["forked_from"] = str(forked_from)  # a DataLoader worker: its rank's variables, not a rank
    marker = os.path.join(directory, "%d.armed" % pid)
    with open(marker + ".tmp", "w") as out:
        json.dump({"pid": pid, "start_time": start_time, "labels": labels, "command": command}, out)
    os.replace(marker + ".tmp", marker)


def _bt_launch_arm_quietly(forked_from=None):
    try:
        _bt_launch_arm(forked_from)
    except Exception as error:  # a stack we cannot take must never stop the training
        sys.stderr.write("bt-launch: Python stacks of pid %d will not be collected: %s\n" % (os.getpid(), error))


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
os.register_at_fork(after_in_child=lambda: _bt_launch_arm_quietly(os.getppid()))  # a forked DataLoader worker dumps to its own file
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
  if (StartTime(process.stack.pid) != json.value("start_time", std::string())) return std::nullopt;  // gone, or reused
  // The same process may have exec'd another program since it armed (os.execvp, pty.spawn):
  // the signal would kill it. Only a process that still catches the signal is one to ask.
  if (!HandlesSignal(process.stack.pid, StackSignal())) return std::nullopt;
  const nlohmann::json labels = json.value("labels", nlohmann::json::object());
  for (const auto& [name, value] : labels.items()) {
    if (value.is_string()) process.stack.labels[name] = value.get<std::string>();
  }
  const nlohmann::json command = json.value("command", nlohmann::json::array());
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
                       StartTime(json["pid"].get<pid_t>()) == json.value("start_time", std::string());
    if (!alive) stale.push_back(entry.path());
  }
  for (const fs::path& marker : stale) {
    fs::remove(marker, error);
    fs::remove(fs::path(marker).replace_extension(".stack"), error);
  }
}

std::vector<ProcessStack> CollectPythonStacks(const fs::path& dumps_dir, std::chrono::milliseconds timeout,
                                              size_t max_bytes, const std::function<bool()>& stop) {
  std::vector<ArmedProcess> armed;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dumps_dir, error)) {
    if (entry.path().extension() != ".armed") continue;
    if (auto process = ReadMarker(entry.path())) armed.push_back(std::move(*process));
  }
  const auto start = Clock::now();
  for (auto& process : armed) {
    process.last_growth = start;
    kill(process.stack.pid, StackSignal());
  }
  const auto deadline = start + timeout;
  size_t settled = 0;
  while (settled < armed.size() && Clock::now() < deadline && !(stop && stop())) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const auto now = Clock::now();
    for (auto& process : armed) {
      if (process.stack.answered || !DumpSettled(process, now)) continue;
      process.stack.answered = true;
      ++settled;
    }
  }
  std::vector<ProcessStack> stacks;
  for (auto& process : armed) {
    process.stack.dump = ReadFrom(process.dump_path, process.dump_offset, max_bytes);
    process.stack.answered = process.stack.answered || !process.stack.dump.empty();
    stacks.push_back(std::move(process.stack));
  }
  std::sort(stacks.begin(), stacks.end(), [](const ProcessStack& a, const ProcessStack& b) { return a.pid < b.pid; });
  return stacks;
}

}  // namespace bt::launcher::watchdog
