#include "launcher/watchdog/flight_recorder.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string_view>
#include <thread>

#include <spdlog/spdlog.h>

#include "storage/subprocess.h"

namespace bt::launcher::watchdog {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr std::string_view kPipeSuffix = ".pipe";
constexpr auto kPollEvery = 100ms;
// How long python3 may take to read the dumps (each holds at most the ring: 2,000 entries,
// read in well under a second): within the slack node 0 gives a node's answer.
constexpr auto kReadTimeout = 5s;
// What the report keeps of python3's lines (the script prints no more than this either, so
// that a crafted dump cannot fill the launcher's memory through its output).
constexpr size_t kMaxSummaryBytes = 33 << 10;

// Reads each dump with nothing but plain data allowed to load (a pickle that names any
// class or function is refused, never run), pickle or JSON, and prints its last entries.
constexpr const char* kReadDumps = R"PY(
import json, os, pickle, sys, time
sys.stdout.reconfigure(errors="backslashreplace")
MAX_DUMP_BYTES = 256 << 20  # PyTorch's ring of 2,000 entries is far smaller
MAX_FIELD = 200             # what is printed of any one field
budget = 32 << 10           # what is printed in all

class PlainData(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError("it names " + module + "." + name)

def load(path):
    with open(path, "rb") as dump:
        first = dump.read(1)
        dump.seek(0)
        return json.load(dump) if first in (b"{", b"[") else PlainData(dump).load()

def short(value):
    text = value if isinstance(value, str) else str(value)
    return text if len(text) <= MAX_FIELD else text[:MAX_FIELD] + "..."

def sizes(value):
    return "x".join(short(n) for n in value) if isinstance(value, (list, tuple)) else short(value)

def describe(path):
    if os.path.getsize(path) > MAX_DUMP_BYTES:
        return [f"{path}: {os.path.getsize(path)} bytes, too large to read here"]
    dump = load(path)
    entries = [e for e in (dump.get("entries") or []) if isinstance(e, dict)] if isinstance(dump, dict) else []
    age = time.time() - os.path.getmtime(path)
    lines = [f"{path} (written {age:.0f} s ago): {len(entries)} collectives recorded" + ("; the last:" if entries else "")]
    for entry in entries[-4:]:
        group = entry.get("process_group")
        group = group[0] if isinstance(group, (list, tuple)) and group else group
        inputs = entry.get("input_sizes") or []
        inputs = ", ".join(sizes(s) for s in inputs[:8]) if isinstance(inputs, (list, tuple)) else short(inputs)
        dtypes = entry.get("input_dtypes") or []
        dtypes = ",".join(short(d) for d in dtypes[:8]) if isinstance(dtypes, (list, tuple)) else short(dtypes)
        lines.append(f"  #{short(entry.get('collective_seq_id'))} {short(entry.get('profiling_name'))} "
                     f"{short(entry.get('state'))} (group {short(group)}, inputs [{short(inputs)}] {short(dtypes)})")
    return lines

for path in sys.argv[1:]:
    try:
        lines = describe(path)
    except Exception as error:
        lines = [f"{path}: not a readable dump ({type(error).__name__}: {short(error)})"]
    for line in lines:
        if budget <= 0:
            print("... (the rest is cut)")
            sys.exit(0)
        budget -= len(line) + 1
        print(line)
)PY";

// Whether a FIFO can be made in `directory` (errno says why not).
bool CanMakeFifos(const fs::path& directory) {
  const fs::path probe = directory / (".probe-" + std::to_string(getpid()));
  if (mkfifo(probe.c_str(), 0600) != 0) return false;
  unlink(probe.c_str());
  return true;
}

std::optional<fs::file_time_type> WrittenAt(const fs::path& path) {
  std::error_code error;
  const fs::file_time_type time = fs::last_write_time(path, error);
  if (error) return std::nullopt;
  return time;
}

// The files beside `prefix` whose names start with its name: <prefix><rank> dumps, or
// <prefix><rank>.pipe FIFOs.
std::vector<fs::path> WithPrefix(const fs::path& prefix, bool fifos) {
  const std::string stem = prefix.filename().string();
  std::vector<fs::path> found;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(prefix.parent_path(), error)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(stem, 0) != 0 || name.size() == stem.size()) continue;
    const bool pipe_name = name.size() > kPipeSuffix.size() + stem.size() &&
                           std::string_view(name).substr(name.size() - kPipeSuffix.size()) == kPipeSuffix;
    const bool wanted = fifos ? pipe_name && entry.is_fifo(error) : !pipe_name && entry.is_regular_file(error);
    if (wanted) found.push_back(entry.path());
  }
  std::sort(found.begin(), found.end());
  return found;
}

// rank_3.pipe (pipe prefix rank_) -> <dump prefix>3.
fs::path DumpFor(const FlightRecorderFiles& files, const fs::path& pipe) {
  const std::string name = pipe.filename().string();
  const std::string stem = files.pipe_prefix.filename().string();
  const std::string rank = name.substr(stem.size(), name.size() - stem.size() - kPipeSuffix.size());
  return fs::path(files.dump_prefix.string() + rank);
}

// Every dump asked for is there, written since it was asked for, and no longer growing
// (PyTorch writes it in place, not by a rename): `sizes` holds each one's size at the last look.
bool AllWritten(const std::vector<AskedDump>& asked, std::vector<uintmax_t>& sizes) {
  bool done = true;
  for (size_t i = 0; i < asked.size(); ++i) {
    const std::optional<fs::file_time_type> written = WrittenAt(asked[i].path);
    std::error_code error;
    const uintmax_t size = fs::file_size(asked[i].path, error);
    const bool settled = written && written != asked[i].before && !error && size > 0 && size == sizes[i];
    sizes[i] = error ? 0 : size;
    done = done && settled;
  }
  return done;
}

}  // namespace

bool HasGpu() {
  std::error_code error;
  if (fs::exists("/dev/nvidia0", error)) return true;
  return fs::is_directory("/proc/driver/nvidia/gpus", error) && !fs::is_empty("/proc/driver/nvidia/gpus", error);
}

FlightRecorderFiles ArmFlightRecorder(const fs::path& directory, env::JobEnvironment& environment) {
  // The FIFOs in a folder of their own: fr_trace, given the dumps' folder, would open a FIFO
  // left by a killed rank and wait on it forever.
  const fs::path pipes = directory / "pipes";
  std::error_code error;
  const bool made = fs::create_directories(pipes, error);
  if (error) throw std::runtime_error("cannot create " + pipes.string() + ": " + error.message());
  auto& variables = environment.variables;
  variables.emplace("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000");
  variables.emplace("TORCH_NCCL_DUMP_ON_TIMEOUT", "1");
  variables.emplace("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", (directory / "rank_").string());
  if (!variables.contains("TORCH_NCCL_DEBUG_INFO_PIPE_FILE")) {
    // PyTorch fails the process group outright when it cannot make its FIFO: where this
    // filesystem makes none, the dumps are not asked for rather than every rank lost. Tried
    // once per volume, as the folder is made: a folder that fails is removed again, so a
    // folder that is there has held a FIFO (no mkfifo on every start).
    if (!made || CanMakeFifos(pipes)) {
      variables.emplace("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", (pipes / "rank_").string());
    } else {
      spdlog::warn("watchdog: {} holds no FIFO ({}): at a hang the NCCL flight recorder is not asked for dumps",
                   pipes.string(), std::strerror(errno));
      fs::remove(pipes, error);
    }
  }
  const auto pipe = variables.find("TORCH_NCCL_DEBUG_INFO_PIPE_FILE");
  return {variables.at("TORCH_NCCL_DEBUG_INFO_TEMP_FILE"), pipe != variables.end() ? pipe->second : ""};
}

std::vector<AskedDump> RequestDumps(const FlightRecorderFiles& files) {
  std::vector<AskedDump> asked;
  if (files.pipe_prefix.empty()) return asked;
  for (const fs::path& pipe : WithPrefix(files.pipe_prefix, true)) {
    const fs::path dump = DumpFor(files, pipe);
    const std::optional<fs::file_time_type> before = WrittenAt(dump);
    // Non-blocking: with no reader (its rank is gone) the open fails (ENXIO) instead of waiting.
    const int fd = open(pipe.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) continue;
    const bool written = write(fd, "1\n", 2) == 2;
    close(fd);
    if (written) asked.push_back({dump, before});
  }
  return asked;
}

std::string DescribeDumps(const FlightRecorderFiles& files, const std::vector<AskedDump>& asked, Clock::time_point deadline,
                          const std::function<bool()>& stop) {
  std::vector<uintmax_t> sizes(asked.size(), 0);
  while (!asked.empty() && !AllWritten(asked, sizes) && Clock::now() < deadline && !(stop && stop())) {
    std::this_thread::sleep_for(kPollEvery);
  }
  const std::vector<fs::path> dumps = WithPrefix(files.dump_prefix, false);
  if (dumps.empty()) {
    if (!HasGpu() && asked.empty()) return "NCCL flight recorder: SKIPPED (no GPU on this node)";
    return "NCCL flight recorder: no dump in " + files.dump_prefix.parent_path().string() + " (" +
           (asked.empty() ? "no process group of the job armed it: NCCL not used, or TORCH_NCCL_TRACE_BUFFER_SIZE is 0"
                          : std::to_string(asked.size()) + " asked for, none written in time") + ")";
  }
  std::string note = "NCCL flight recorder: " + std::to_string(asked.size()) + " rank(s) asked for a dump; " +
                     std::to_string(dumps.size()) + " dump(s) (all of them: python3 -m torch.distributed.flight_recorder.fr_trace " +
                     files.dump_prefix.parent_path().string() + " -p " + files.dump_prefix.filename().string() + ")";
  const std::string python = storage::FindOnPath("python3");
  if (python.empty()) {
    for (const fs::path& dump : dumps) note += "\n  " + dump.string();
    return note + "\n  (python3 is not installed: the dumps are not read here)";
  }
  std::vector<std::string> argv = {python, "-I", "-S", "-c", kReadDumps};
  for (const fs::path& dump : dumps) argv.push_back(dump.string());
  const auto read_deadline = Clock::now() + kReadTimeout;
  std::string errors;
  try {
    const storage::ProcessResult result = storage::RunProcess(
        argv, {"LC_ALL=C.UTF-8"}, [&](const std::string& line) { errors += line + "\n"; },
        [&] {
          if (Clock::now() > read_deadline) throw std::runtime_error("python3 took longer than 5 s to read them");
          if (stop && stop()) throw std::runtime_error("the launcher is stopping");
        });
    if (!result.spawn_error.empty()) throw std::runtime_error(python + " cannot be started: " + result.spawn_error);
    std::string lines = result.output.substr(0, kMaxSummaryBytes);
    if (lines.size() < result.output.size()) lines += "... (cut)\n";
    for (size_t start = 0; start < lines.size();) {
      const size_t end = std::min(lines.find('\n', start), lines.size());
      note += "\n  " + lines.substr(start, end - start);
      start = end + 1;
    }
    if (result.exit_code != 0) note += "\n  python3 exited with " + std::to_string(result.exit_code) + ": " + errors.substr(0, 2000);
  } catch (const std::exception& error) {
    note += "\n  the dumps could not be read (" + std::string(error.what()) + "):";
    for (const fs::path& dump : dumps) note += "\n  " + dump.string();
  }
  return note;
}

}  // namespace bt::launcher::watchdog
