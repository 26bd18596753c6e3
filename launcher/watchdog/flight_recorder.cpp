#include "launcher/watchdog/flight_recorder.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <thread>

#include "storage/subprocess.h"

namespace bt::launcher::watchdog {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr const char* kPipeSuffix = ".pipe";
constexpr auto kPollEvery = 100ms;
// How long python3 may take to read the dumps (each holds at most the ring: 2,000 entries,
// read in well under a second): within the slack node 0 gives a node's answer.
constexpr auto kReadTimeout = 5s;
// What the report keeps of python3's lines.
constexpr size_t kMaxSummaryBytes = 32 << 10;

// Reads each dump with nothing but plain data allowed to load (a pickle that names any
// class or function is refused, never run), pickle or JSON, and prints its last entries.
constexpr const char* kReadDumps = R"PY(
import json, os, pickle, sys, time
sys.stdout.reconfigure(errors="backslashreplace")

class PlainData(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError("it names " + module + "." + name)

def load(path):
    with open(path, "rb") as dump:
        first = dump.read(1)
        dump.seek(0)
        return json.load(dump) if first in (b"{", b"[") else PlainData(dump).load()

def sizes(value):
    return "x".join(str(n) for n in value) if isinstance(value, (list, tuple)) else str(value)

for path in sys.argv[1:]:
    try:
        dump = load(path)
    except Exception as error:
        print(f"{path}: not a readable dump ({type(error).__name__}: {error})")
        continue
    entries = [e for e in (dump.get("entries") or []) if isinstance(e, dict)] if isinstance(dump, dict) else []
    age = time.time() - os.path.getmtime(path)
    print(f"{path} (written {age:.0f} s ago): {len(entries)} collectives recorded" + ("; the last:" if entries else ""))
    for entry in entries[-4:]:
        group = entry.get("process_group")
        group = group[0] if isinstance(group, (list, tuple)) and group else group
        inputs = ", ".join(sizes(s) for s in entry.get("input_sizes") or [])
        print(f"  #{entry.get('collective_seq_id')} {entry.get('profiling_name')} {entry.get('state')}"
              f" (group {group}, inputs [{inputs}] {','.join(map(str, entry.get('input_dtypes') or []))})")
)PY";

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
    const bool pipe_name = name.size() > std::string_view(kPipeSuffix).size() + stem.size() &&
                           name.compare(name.size() - 5, 5, kPipeSuffix) == 0;
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
  const std::string rank = name.substr(stem.size(), name.size() - stem.size() - 5);
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
  std::error_code error;
  fs::create_directories(directory / "pipes", error);
  if (error) throw std::runtime_error("cannot create " + (directory / "pipes").string() + ": " + error.message());
  auto& variables = environment.variables;
  variables.emplace("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000");
  variables.emplace("TORCH_NCCL_DUMP_ON_TIMEOUT", "1");
  variables.emplace("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", (directory / "rank_").string());
  variables.emplace("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", (directory / "pipes" / "rank_").string());
  return {variables.at("TORCH_NCCL_DEBUG_INFO_TEMP_FILE"), variables.at("TORCH_NCCL_DEBUG_INFO_PIPE_FILE")};
}

std::vector<AskedDump> RequestDumps(const FlightRecorderFiles& files) {
  std::vector<AskedDump> asked;
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
        });
    std::string lines = result.output.substr(0, kMaxSummaryBytes);
    if (lines.size() < result.output.size()) lines += "... (cut)\n";
    for (size_t start = 0; start < lines.size();) {
      const size_t end = std::min(lines.find('\n', start), lines.size());
      note += "\n  " + lines.substr(start, end - start);
      start = end + 1;
    }
    if (result.exit_code != 0) note += "\n  python3 exited with " + std::to_string(result.exit_code) + ": " + errors.substr(0, 2000);
  } catch (const std::exception& error) {
    note += "\n  the dumps could not be read: " + std::string(error.what());
  }
  return note;
}

}  // namespace bt::launcher::watchdog
