#include "launcher/watchdog/watchdog.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <ctime>
#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "launcher/exit_codes.h"
#include "launcher/supervision/proc_table.h"
#include "launcher/timeline.h"
#include "launcher/watchdog/native_stacks.h"
#include "launcher/watchdog/python_stacks.h"
#include "launcher/watchdog/stack_report.h"
#include "storage/durable_file.h"

namespace bt::launcher::watchdog {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

// How often a node looks at its job's progress: a stall is seen at most this late.
constexpr std::chrono::seconds kTick{1};
// Node 0 waits this long past stack_timeout_s for the other nodes' answers.
constexpr std::chrono::seconds kGatherSlack{10};
// A node's answer: faulthandler's text per process, and how many processes, are capped so
// that node 0 gathers a bounded report (64 KiB x 64 processes, 4 MiB a node at most).
constexpr size_t kMaxDumpBytes = 64 << 10;
constexpr size_t kMaxProcesses = 64;
constexpr const char* kHeartbeatVariable = "BT_HEARTBEAT_FILE";

double Seconds(Clock::duration duration) { return std::chrono::duration<double>(duration).count(); }

std::string FormatSeconds(double seconds) {
  return FormatDuration(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds)));
}

std::string HangKey(int64_t cycle, const std::string& rest) { return "bt/hang/" + std::to_string(cycle) + "/" + rest; }

void Offer(env::JobEnvironment& environment, const std::string& name, const std::string& value) {
  environment.variables.emplace(name, value);
}

std::optional<int64_t> ModificationTimeNs(const fs::path& path) {
  struct stat info {};
  if (stat(path.c_str(), &info) != 0) return std::nullopt;
  return int64_t(info.st_mtim.tv_sec) * 1'000'000'000 + info.st_mtim.tv_nsec;
}

// The heartbeat file exists from the start, so that os.utime() on it works; its creation is
// not progress (the time is taken after it). It is created only when missing: after the
// first start on a volume this is one stat.
std::optional<int64_t> CreatedModificationTimeNs(const fs::path& path) {
  if (std::optional<int64_t> mtime = ModificationTimeNs(path)) return mtime;
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NOCTTY, 0644);
  if (fd >= 0) close(fd);
  return ModificationTimeNs(path);
}

std::string ReadSmallFile(const fs::path& path, size_t max_bytes = 4096) {
  std::ifstream file(path, std::ios::binary);
  std::string text(max_bytes, '\0');
  file.read(text.data(), std::streamsize(max_bytes));
  text.resize(size_t(file.gcount()));
  return text;
}

// "state T (stopped), waiting in do_signal_stop": why a process may give no stack.
std::string ProcessState(pid_t pid) {
  char state = '?';
  for (const ProcessEntry& process : AllProcesses()) {
    if (process.pid == pid) state = process.state;
  }
  const char* meaning = state == 'T' || state == 't' ? " (stopped)" : state == 'D' ? " (in the kernel, uninterruptible)" : "";
  std::string wchan = ReadSmallFile("/proc/" + std::to_string(pid) + "/wchan", 128);
  if (wchan.empty() || wchan == "0") wchan = "-";
  return fmt::format("state {}{}, waiting in {}", state, meaning, wchan);
}

struct OtherProcess {
  pid_t pid = 0;
  std::string line;  // pid, state, wait channel, command line
};

std::vector<OtherProcess> OtherJobProcesses(const std::set<pid_t>& with_python_stack) {
  const std::vector<ProcessEntry> processes = AllProcesses();
  std::error_code error;
  const fs::path self_exe = fs::read_symlink("/proc/self/exe", error);
  std::set<pid_t> job{getpid()};
  std::set<pid_t> launcher_helpers;
  // Parents come before children only by chance in /proc: repeat until nothing is added.
  for (bool added = true; added;) {
    added = false;
    for (const ProcessEntry& process : processes) {
      if (job.contains(process.pid) || launcher_helpers.contains(process.pid)) continue;
      if (launcher_helpers.contains(process.parent)) {
        launcher_helpers.insert(process.pid);
        added = true;
      } else if (job.contains(process.parent)) {
        const bool helper = fs::read_symlink("/proc/" + std::to_string(process.pid) + "/exe", error) == self_exe;
        (helper ? launcher_helpers : job).insert(process.pid);
        added = true;
      }
    }
  }
  std::vector<OtherProcess> others;
  for (const ProcessEntry& process : processes) {
    if (process.pid == getpid() || !job.contains(process.pid) || with_python_stack.contains(process.pid)) continue;
    std::string wchan = ReadSmallFile("/proc/" + std::to_string(process.pid) + "/wchan", 128);
    if (wchan.empty() || wchan == "0") wchan = "-";
    others.push_back({process.pid, fmt::format("pid {} state {} waiting in {}: {}", process.pid, process.state, wchan,
                                               CommandLine(process.pid))});
    if (others.size() >= kMaxProcesses) break;
  }
  return others;
}

// Processes with a RANK of their own (torchrun's workers, an mpirun rank), not forked from
// one (a DataLoader worker inherits its rank's variables): the ones a collective waits on.
// A job without RANK anywhere (one Python process a node, or torch.multiprocessing.spawn)
// has its unforked processes. Never multiprocessing's helpers, nor a parent that only
// waits for its spawned ranks (MarkMultiprocessing).
bool IsRank(const ProcessStack& stack, bool job_has_ranks) {
  return (stack.labels.contains("RANK") || !job_has_ranks) && !stack.labels.contains("forked_from") &&
         !stack.labels.contains("not_a_rank");
}

bool Contains(const std::string& text, const char* part) { return text.find(part) != std::string::npos; }

// multiprocessing's resource tracker and forkserver serve the job's processes: never ranks.
bool IsMultiprocessingHelper(const std::string& command) {
  return Contains(command, "multiprocessing.resource_tracker") || Contains(command, "multiprocessing.semaphore_tracker") ||
         Contains(command, "multiprocessing.forkserver");
}

// What multiprocessing started (spawn or forkserver: `--multiprocessing-fork` in its command
// line): a DataLoader worker (its stack in _worker_loop) is its rank's worker; any other
// process started so in a job without RANK is a rank (torch.multiprocessing.spawn, a Pool),
// and its parent, which only waits for them, is not.
void MarkMultiprocessing(std::vector<ProcessStack>& stacks) {
  std::set<std::string> parents_of_ranks;
  for (ProcessStack& stack : stacks) {
    if (IsMultiprocessingHelper(stack.command)) {
      stack.labels["not_a_rank"] = "multiprocessing's helper";
      continue;
    }
    auto parent = stack.labels.find("PPID");
    if (!Contains(stack.command, "--multiprocessing-fork") || parent == stack.labels.end()) continue;
    if (Contains(stack.dump, "_worker_loop")) {
      stack.labels["forked_from"] = parent->second;
    } else if (!stack.labels.contains("RANK")) {
      parents_of_ranks.insert(parent->second);
    }
  }
  for (ProcessStack& stack : stacks) {
    if (!stack.labels.contains("RANK") && parents_of_ranks.contains(std::to_string(stack.pid))) {
      stack.labels["not_a_rank"] = "the parent of its spawned ranks";
    }
  }
}

struct NodeStacks {
  int rank = -1;
  std::string host;
  std::optional<double> quiet_s;  // since the job's last progress, when the stacks were asked for
  bool answered = false;
  bool finished = false;  // its job had ended when the stacks were asked for
  std::vector<ProcessStack> stacks;
  std::vector<std::string> others;
  std::map<pid_t, std::string> native;  // gdb's frames by pid
  std::string native_note;
  std::string nccl;
};

// `object[name]` when it is an array (or an object, for `want_object`), else an empty one.
const json& Member(const json& object, const char* name, bool want_object = false) {
  static const json kEmptyArray = json::array();
  static const json kEmptyObject = json::object();
  auto found = object.find(name);
  if (found == object.end() || (want_object ? !found->is_object() : !found->is_array())) {
    return want_object ? kEmptyObject : kEmptyArray;
  }
  return *found;
}

// A process started by a rank with the same RANK (a spawn or forkserver DataLoader worker,
// multiprocessing's resource tracker) inherits its variables but is no rank: it is marked
// as forked from its parent, as a forked one is by the hook.
void MarkChildrenOfRanks(std::vector<ProcessStack>& stacks) {
  std::map<std::string, std::string> rank_of_pid;
  for (const ProcessStack& stack : stacks) {
    if (stack.labels.contains("RANK")) rank_of_pid[std::to_string(stack.pid)] = stack.labels.at("RANK");
  }
  for (ProcessStack& stack : stacks) {
    auto parent = stack.labels.find("PPID");
    auto rank = stack.labels.find("RANK");
    if (parent == stack.labels.end() || rank == stack.labels.end() || stack.labels.contains("forked_from")) continue;
    auto parent_rank = rank_of_pid.find(parent->second);
    if (parent_rank != rank_of_pid.end() && parent_rank->second == rank->second) stack.labels["forked_from"] = parent->second;
  }
}

NodeStacks ParseAnswer(int rank, const std::optional<std::string>& value) {
  NodeStacks node;
  node.rank = rank;
  if (!value) return node;
  const json answer = json::parse(*value, nullptr, false);
  if (!answer.is_object()) return node;
  node.answered = true;
  node.finished = answer.value("finished", false);
  node.host = answer.value("host", std::string());
  if (answer.contains("quiet_s") && answer["quiet_s"].is_number()) node.quiet_s = answer["quiet_s"].get<double>();
  node.nccl = answer.value("nccl", std::string());
  for (const json& other : Member(answer, "others")) {
    if (other.is_string()) node.others.push_back(other.get<std::string>());
  }
  for (const auto& [pid, frames] : Member(answer, "native", true).items()) {
    if (frames.is_string()) node.native[std::atoi(pid.c_str())] = frames.get<std::string>();
  }
  node.native_note = answer.value("native_note", std::string());
  for (const json& process : Member(answer, "processes")) {
    if (!process.is_object()) continue;
    ProcessStack stack;
    stack.pid = process.value("pid", 0);
    stack.command = process.value("command", std::string());
    stack.dump = process.value("dump", std::string());
    stack.answered = process.value("answered", false);
    for (const auto& [name, label] : Member(process, "labels", true).items()) {
      if (label.is_string()) stack.labels[name] = label.get<std::string>();
    }
    stack.labels["host"] = node.host;
    stack.labels["BT_NODE_RANK"] = std::to_string(rank);
    node.stacks.push_back(std::move(stack));
  }
  MarkChildrenOfRanks(node.stacks);
  MarkMultiprocessing(node.stacks);
  return node;
}

bool JobHasRanks(const std::vector<NodeStacks>& nodes) {
  for (const NodeStacks& node : nodes) {
    for (const ProcessStack& stack : node.stacks) {
      if (stack.labels.contains("RANK")) return true;
    }
  }
  return false;
}

std::string NodeLabel(const NodeStacks& node) {
  return "node " + std::to_string(node.rank) + (node.host.empty() ? "" : " (" + node.host + ")");
}

// The ranks that gave no stack (stopped, or in the kernel with signals held): a group of
// their own, which can be the odd one (the others wait for it in a collective).
constexpr const char* kNoStack = "no stack";

// The ranks grouped by where they are, those without a stack as one more group; largest first.
std::vector<StackGroup> GroupsForTheHeadline(const std::vector<ProcessStack>& ranks) {
  std::vector<StackGroup> groups = GroupByInnermostFrames(ranks);
  StackGroup silent;
  silent.frames = kNoStack;
  for (const ProcessStack& rank : ranks) {
    if (!rank.answered) silent.members.push_back(&rank);
  }
  if (silent.members.empty()) return groups;
  groups.push_back(std::move(silent));
  std::stable_sort(groups.begin(), groups.end(),
                   [](const StackGroup& a, const StackGroup& b) { return a.members.size() > b.members.size(); });
  return groups;
}

// "in all_reduce (...)", or for ranks without a stack what /proc said of the first.
std::string Whereabouts(const StackGroup& group) {
  if (group.frames != kNoStack) return "in " + (group.frames.empty() ? std::string("no Python frame") : group.frames);
  const ProcessStack& first = *group.members.front();
  auto state = first.labels.find("state");
  return std::string("gave no stack") + (state == first.labels.end() ? "" : " (" + state->second + ")");
}

// "rank 0 (node 0, ...), rank 1 (node 1, ...)": where each member is.
std::string DescribeMembers(const StackGroup& group) {
  std::string text;
  for (const ProcessStack* member : group.members) text += (text.empty() ? "" : ", ") + DescribeProcess(*member);
  return text;
}

// Whether the group's innermost frames are in torch.distributed's collectives (all_reduce,
// barrier, broadcast...): ranks that wait there wait for the others.
bool InACollective(const StackGroup& group) {
  return Contains(group.frames, "(distributed_c10d.py:") || Contains(group.frames, "(c10d_logger.py:");
}

// The one group not in a collective while the others are, or null.
const StackGroup* OnlyGroupOutsideACollective(const std::vector<StackGroup>& groups) {
  const StackGroup* outside = nullptr;
  for (const StackGroup& group : groups) {
    if (InACollective(group)) continue;
    if (outside != nullptr) return nullptr;
    outside = &group;
  }
  return outside != nullptr && groups.size() > 1 ? outside : nullptr;
}

// What node 0 concludes from every node's answer.
struct HangFindings {
  std::vector<std::string> summary;  // the grouped ranks, for the log and the report
  std::string place;                 // where the odd ranks (or all) are: "same hang" is judged on it
  int blamed_rank = 0;               // the node named as the cycle's failure
  std::string cause;
  std::optional<double> job_quiet_s;  // since any node's last progress, when the stacks were asked for
};

// `limit`: the limit the stall crossed, for the cause ("limit 10 s").
HangFindings Judge(const std::vector<NodeStacks>& nodes, int stalled_rank, const std::string& limit) {
  HangFindings findings;
  std::vector<ProcessStack> ranks;
  size_t other_processes = 0;
  const bool job_has_ranks = JobHasRanks(nodes);
  for (const NodeStacks& node : nodes) {
    for (const ProcessStack& stack : node.stacks) {
      if (IsRank(stack, job_has_ranks)) {
        ranks.push_back(stack);
      } else {
        ++other_processes;
      }
    }
  }
  findings.summary = SummarizeStacks(ranks);
  if (other_processes > 0) {
    findings.summary.push_back(std::to_string(other_processes) +
                               " other Python processes (launchers like torchrun, DataLoader workers, multiprocessing's helpers): stacks in "
                               "the report");
  }
  std::vector<std::string> missing;
  const NodeStacks* first_stopped = nullptr;
  for (const NodeStacks& node : nodes) {
    if (!node.answered) missing.push_back(std::to_string(node.rank));
    if (node.finished) findings.summary.push_back(NodeLabel(node) + ": its job had ended; it waits for the others");
    if (node.quiet_s && (first_stopped == nullptr || *node.quiet_s > *first_stopped->quiet_s)) first_stopped = &node;
  }
  if (!missing.empty()) findings.summary.push_back("no stacks from node(s) " + fmt::format("{}", fmt::join(missing, ", ")));
  findings.blamed_rank = stalled_rank;
  std::string first;
  if (first_stopped != nullptr) {
    findings.blamed_rank = first_stopped->rank;
    first = NodeLabel(*first_stopped) + " stopped making progress first, " + FormatSeconds(*first_stopped->quiet_s) +
            " before the stacks were asked for";
    if (nodes.size() > 1) findings.summary.push_back(first);
  }
  const std::vector<StackGroup> groups = GroupsForTheHeadline(ranks);
  std::string odd;
  if (groups.size() >= 2 && groups[0].members.size() == groups[1].members.size()) {
    // No majority (1+1, 2+2): where every group is; the odd one is the only group not waiting
    // in a collective, when there is one, else the first node to stop keeps the blame.
    std::string listing;
    for (const StackGroup& group : groups) {
      listing += (listing.empty() ? "" : "; ") + std::to_string(group.members.size()) + " " + Whereabouts(group) + ": " +
                 DescribeMembers(group);
      findings.place += (findings.place.empty() ? "" : " | ") + group.frames;
    }
    if (const StackGroup* outside = OnlyGroupOutsideACollective(groups)) {
      const ProcessStack& member = *outside->members.front();
      findings.blamed_rank = std::atoi(member.labels.at("BT_NODE_RANK").c_str());
      odd = "the odd one: " + DescribeProcess(member) + " " + Whereabouts(*outside) +
            ", the only group not in a collective; no majority: " + listing;
    } else {
      odd = "no majority: " + listing;
    }
  } else if (groups.size() == 2 && groups.back().members.size() < groups.front().members.size()) {
    // One group apart from the majority: the straggler the others wait for.
    const StackGroup& smallest = groups.back();
    const ProcessStack& member = *smallest.members.front();
    findings.blamed_rank = std::atoi(member.labels.at("BT_NODE_RANK").c_str());
    odd = "the odd one: " + DescribeProcess(member) + " " + Whereabouts(smallest) + ", while " +
          std::to_string(groups.front().members.size()) + " ranks are in " + groups.front().frames;
    findings.place = smallest.frames + " | " + groups.front().frames;
  } else if (groups.size() > 2) {
    // Several groups apart: the report lists them; the blame stays with the first node to stop.
    odd = std::to_string(groups.size() - 1) + " groups of ranks differ from the " + std::to_string(groups.front().members.size()) +
          " in " + groups.front().frames + " (the summary lists them)";
    findings.place = groups.front().frames;
  } else if (!groups.empty()) {
    findings.place = groups.front().frames;
    odd = groups.front().members.size() == 1 ? "its one rank " + Whereabouts(groups.front())
                                             : "no odd one: all " + std::to_string(groups.front().members.size()) + " " +
                                                   Whereabouts(groups.front());
  }
  // How long the whole job has been silent: since the last progress of any node.
  std::optional<double> job_quiet_s;
  for (const NodeStacks& node : nodes) {
    if (node.quiet_s && (!job_quiet_s || *node.quiet_s < *job_quiet_s)) job_quiet_s = node.quiet_s;
  }
  findings.job_quiet_s = job_quiet_s;
  findings.cause = (job_quiet_s ? "no progress on any node for " + FormatSeconds(*job_quiet_s) : "no progress since the start") +
                   " (" + limit + ")" + (odd.empty() ? "" : "; " + odd) + (first.empty() || nodes.size() < 2 ? "" : "; " + first);
  return findings;
}

std::string UtcStamp() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y%m%dT%H%M%SZ", &utc);
  return text;
}

std::string RenderReport(int64_t cycle, const std::string& headline, const HangFindings& findings,
                         const std::vector<NodeStacks>& nodes) {
  std::string text = "bt-launch hang report, cycle " + std::to_string(cycle) + ", written " + UtcStamp() + "\n" +
                     headline + "\n\nSummary:\n";
  for (const std::string& line : findings.summary) text += "  " + line + "\n";
  const bool job_has_ranks = JobHasRanks(nodes);
  for (const NodeStacks& node : nodes) {
    text += "\n== " + NodeLabel(node);
    if (!node.answered) {
      text += ": no answer in time (its launcher is stuck or gone)\n";
      continue;
    }
    if (node.finished) {
      text += ": its job had ended (it waits for the others)\n";
      continue;
    }
    text += node.quiet_s ? ": last progress " + FormatSeconds(*node.quiet_s) + " before the stacks were asked for\n"
                         : ": no progress yet in this cycle\n";
    for (const ProcessStack& stack : node.stacks) {
      text += "\n-- " + (IsRank(stack, job_has_ranks) ? DescribeProcess(stack) : "pid " + std::to_string(stack.pid)) + ": " +
              stack.command + "\n";
      text += stack.answered ? stack.dump : "(armed, but wrote no stack in time: stopped, or in the kernel with signals held)\n";
      if (auto native = node.native.find(stack.pid); native != node.native.end()) text += "native:\n" + native->second;
    }
    if (!node.others.empty()) text += "\n-- processes without a Python stack:\n";
    for (const std::string& other : node.others) {
      text += "  " + other + "\n";
      const pid_t pid = std::atoi(other.c_str() + 4);  // "pid N ..."
      if (auto native = node.native.find(pid); native != node.native.end()) text += native->second;
    }
    if (!node.native_note.empty()) text += "\n-- " + node.native_note + "\n";
    if (!node.nccl.empty()) text += "\n-- " + node.nccl + "\n";
  }
  return text;
}

}  // namespace

namespace {

// The node folder's contents, wherever it is.
void PlaceInNodeDir(WatchdogPaths& paths, const fs::path& node_dir) {
  paths.node_dir = node_dir;
  paths.heartbeat_file = node_dir / "heartbeat";
  paths.python_hook_dir = node_dir / "python-hook";
  paths.stack_dir = node_dir / "stacks";
  paths.nccl_trace_dir = node_dir / "nccl-trace";
}

// How many launchers of one job and node may share report_dir at once.
constexpr int kMaxNodeDirClaims = 64;

// Claims `node_dir`, or the first of node_dir.2, .3... that no live launcher holds: an
// exclusive flock on its `.owner`, held (the descriptor left open, close-on-exec) for as long
// as this launcher runs, so that two launchers never share a heartbeat or stack folder. A
// launcher that died released its claim: the next one reuses the folder.
fs::path ClaimNodeDir(const fs::path& node_dir) {
  std::string last_error;
  for (int claim = 1; claim <= kMaxNodeDirClaims; ++claim) {
    const fs::path candidate = claim == 1 ? node_dir : fs::path(node_dir.string() + "." + std::to_string(claim));
    std::error_code error;
    fs::create_directories(candidate, error);
    if (error) throw std::runtime_error("cannot create " + candidate.string() + ": " + error.message());
    const fs::path owner = candidate / ".owner";
    const int fd = open(owner.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOCTTY, 0644);
    if (fd < 0) throw std::runtime_error("cannot open " + owner.string() + ": " + std::strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) return candidate;  // held until this launcher exits
    last_error = std::strerror(errno);
    close(fd);
  }
  throw std::runtime_error("every node folder " + node_dir.string() + "[.2-" + std::to_string(kMaxNodeDirClaims) +
                           "] is held by another running launcher (" + last_error + ")");
}

}  // namespace

fs::path ReportDir(const env::WatchdogSettings& settings, const env::JobEnvironment& environment) {
  if (!settings.report_dir.empty()) return settings.report_dir;
  auto scratch = environment.variables.find("BT_SCRATCH_DIR");
  return fs::path(scratch != environment.variables.end() ? scratch->second : "/tmp") / "bt-launch";
}

WatchdogPaths PathsFor(const env::WatchdogSettings& settings, const env::JobEnvironment& environment, int rank) {
  const fs::path report_dir = ReportDir(settings, environment);
  auto job_id = environment.variables.find("BT_TRAINING_JOB_ID");
  const std::string job = job_id != environment.variables.end() && !job_id->second.empty() ? job_id->second : "job";
  WatchdogPaths paths;
  paths.report_dir = report_dir;
  PlaceInNodeDir(paths, report_dir / job / ("node-" + std::to_string(rank)));
  return paths;
}

void ArmJobEnvironment(WatchdogPaths& paths, env::JobEnvironment& environment) {
  PlaceInNodeDir(paths, ClaimNodeDir(paths.node_dir));
  // Then: the flight recorder makes the node's trace folders, the heartbeat goes beside them.
  paths.flight_recorder = ArmFlightRecorder(paths.nccl_trace_dir, environment);
  Offer(environment, kHeartbeatVariable, paths.heartbeat_file.string());
  auto pythonpath = environment.variables.find("PYTHONPATH");
  const std::string user_pythonpath = pythonpath == environment.variables.end() ? "" : pythonpath->second;
  for (const auto& [name, value] : InstallPythonStackHook(paths.python_hook_dir, paths.stack_dir, user_pythonpath)) {
    environment.variables[name] = value;
  }
  // What the job will use, where the user chose: the watch and the report follow it.
  paths.heartbeat_file = environment.variables.at(kHeartbeatVariable);
}

double StallLimitSeconds(const env::WatchdogSettings& settings, bool progress_seen, double longest_gap_s) {
  if (!progress_seen) return settings.startup_timeout_s;
  if (settings.stall_timeout_s) return *settings.stall_timeout_s;
  return std::max(settings.auto_min_s, 5 * longest_gap_s);
}

Watchdog::Watchdog(const env::WatchdogSettings& settings, WatchdogPaths paths, WatchdogNode node, Peers* peers,
                   Progress& progress)
    : settings_(settings), paths_(std::move(paths)), node_(std::move(node)), peers_(peers), progress_(progress) {
  wake_fd_ = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
  if (wake_fd_ < 0) throw std::runtime_error(std::string("timerfd_create: ") + std::strerror(errno));
  if (peers_ != nullptr && !peers_->SharesHangs()) peers_ = nullptr;
  if (peers_ == nullptr) return;
  // The request arrives on the supervisor's thread: it is handed to the watch, whose thread
  // starts for it if the cycle's first check has not yet started it.
  peers_->OnStackRequest([this](const rendezvous::PeerEvent& request) {
    {
      std::lock_guard lock(mutex_);
      stack_request_ = request;
      wake_.notify_all();
    }
    StartThreadIfNeeded();
  });
}

Watchdog::~Watchdog() {
  StopThread();
  if (peers_ != nullptr) peers_->OnStackRequest({});
  close(wake_fd_);
}

void Watchdog::BeginCycle(int64_t cycle) {
  StopThread();
  progress_.Reset();
  touched_paths_.clear();
  output_files_.Rebase();
  if (!paths_.heartbeat_file.empty()) {
    touched_paths_.emplace_back(paths_.heartbeat_file, CreatedModificationTimeNs(paths_.heartbeat_file));
  }
  if (!paths_.checkpoint_dir.empty()) {
    touched_paths_.emplace_back(paths_.checkpoint_dir, ModificationTimeNs(paths_.checkpoint_dir));
  }
  {
    std::lock_guard lock(mutex_);
    stack_request_.reset();
    stop_.reset();
    stop_taken_ = false;
    hung_ = false;
    cycle_ = cycle;
  }
  answers_ = true;
  // Before the job starts, not on the watch thread: pids repeat (a new pod's namespace), and
  // a pass running while the job's processes arm deleted a new process's marker and dump
  // together with the stale marker of the same pid it had judged a moment before.
  PruneStaleMarkers(paths_.stack_dir);
  phase_ = Phase::kWatching;
  cycle_start_ = Clock::now();
  WakeSupervisorIn(kTick);  // the first check: TakeStop starts the thread then
}

void Watchdog::GatherOnly(int64_t cycle) {
  BeginCycle(cycle);
  answers_ = false;
  EndCycle();
}

void Watchdog::EndCycle() {
  StopThread();
  // This node's job has ended, but the others' may hang (a rank stuck in a final save while
  // this node waits at the exit barrier): it still answers a stack request of the cycle,
  // with no stacks, and node 0 still gathers. The thread starts when a request comes.
  phase_ = peers_ != nullptr ? Phase::kAnswering : Phase::kIdle;
  if (HasStackRequest()) StartThreadIfNeeded();
}

bool Watchdog::HasStackRequest() {
  std::lock_guard lock(mutex_);
  return stack_request_.has_value();
}

void Watchdog::StartThreadIfNeeded() {
  if (phase_ == Phase::kIdle || thread_.joinable()) return;
  StartThread(cycle_, phase_ == Phase::kWatching);
}

// A timerfd is readable once its time has come: the supervisor, which polls fd(), calls
// TakeStop then. A delay of 0 would disarm it, so "at once" is one nanosecond.
void Watchdog::WakeSupervisorIn(Clock::duration delay) {
  const int64_t ns = std::max<int64_t>(1, std::chrono::duration_cast<std::chrono::nanoseconds>(delay).count());
  itimerspec when{};
  when.it_value = {time_t(ns / 1'000'000'000), long(ns % 1'000'000'000)};
  timerfd_settime(wake_fd_, 0, &when, nullptr);
}

void Watchdog::StartThread(int64_t cycle, bool watching) {
  {
    std::lock_guard lock(mutex_);
    stopping_ = false;
  }
  thread_ = std::thread([this, cycle, watching, since = cycle_start_] {
    try {
      Watch(cycle, watching, since);
    } catch (const std::exception& error) {
      // The watch is an aid: its failure must never end the job it watches.
      spdlog::error("watchdog: stopped watching cycle {}: {}", cycle, error.what());
    }
  });
}

void Watchdog::StopThread() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    wake_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

// Only when the supervisor took the stop: a job that exited on its own before that (0 in
// the middle of the stack collection) ended as it ended.
bool Watchdog::StoppedAsHung() const {
  std::lock_guard lock(mutex_);
  return hung_ && stop_taken_;
}

std::optional<std::string> Watchdog::TakeStop() {
  uint64_t expirations = 0;
  [[maybe_unused]] ssize_t ignored = read(wake_fd_, &expirations, sizeof expirations);
  // The supervisor also asks before each command: the thread waits for the first check's time.
  if (phase_ == Phase::kWatching && Clock::now() - cycle_start_ >= kTick) StartThreadIfNeeded();
  std::lock_guard lock(mutex_);
  if (!stop_ || stop_taken_) return std::nullopt;
  stop_taken_ = true;
  return stop_;
}

bool Watchdog::Stopping() {
  std::lock_guard lock(mutex_);
  return stopping_;
}

// Notes what the job did since the last look. Returns whether it touched its heartbeat file
// or saved a checkpoint: signs that it is past its startup.
namespace {

// The first bytes of the heartbeat file: a step number or a small JSON object, never more.
std::string ReadHeartbeat(const fs::path& path) {
  constexpr size_t kMaxHeartbeatBytes = 4096;
  std::string contents(kMaxHeartbeatBytes, '\0');
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return "";
  const ssize_t got = read(fd, contents.data(), contents.size());
  close(fd);
  contents.resize(got > 0 ? size_t(got) : 0);
  return contents;
}

}  // namespace

bool Watchdog::LookForProgress() {
  bool job_says_it_runs = false;
  for (auto& [path, seen] : touched_paths_) {
    const std::optional<int64_t> mtime = ModificationTimeNs(path);
    if (mtime == seen) continue;
    seen = mtime;
    if (!mtime) continue;
    progress_.Note();
    job_says_it_runs = true;
    if (on_heartbeat_ && path == paths_.heartbeat_file) on_heartbeat_(ReadHeartbeat(path), *mtime);
  }
  if (output_files_.JobWrote()) progress_.Note();
  return job_says_it_runs;
}

void Watchdog::Watch(int64_t cycle, bool watching, Clock::time_point since) {
  Clock::time_point previous{};
  double longest_gap_s = 0;
  bool reported = false;
  bool startup_over = false;
  Clock::time_point last_at_report{};
  // A thread that watches starts when the first check is due: that check comes first.
  for (bool due = watching;; due = false) {
    std::optional<rendezvous::PeerEvent> request;
    {
      std::unique_lock lock(mutex_);
      if (!due) wake_.wait_for(lock, kTick, [this] { return stopping_ || stack_request_.has_value(); });
      if (stopping_) return;
      request.swap(stack_request_);
    }
    if (request) {
      if (request->cycle != cycle) continue;
      spdlog::warn("watchdog: {}", request->message);
      const auto asked = Clock::now();  // about when every node measures how long its job was quiet
      if (answers_) AnswerStackRequest(cycle, !watching);
      if (node_.rank == 0) GatherAndDeclare(cycle, request->rank, asked);
      continue;
    }
    if (!watching) continue;
    const bool job_says_it_runs = LookForProgress();
    if (!startup_over) startup_over = StartupOver(job_says_it_runs, Seconds(Clock::now() - since));
    const Clock::time_point last = progress_.last();
    if (progress_.seen() && last != previous) {
      if (previous != Clock::time_point{}) longest_gap_s = std::max(longest_gap_s, Seconds(last - previous));
      previous = last;
    }
    if (reported) {
      // A stalled node whose job shows progress again takes its report back: a hang is
      // every node stalled at once.
      if (peers_ == nullptr || !progress_.seen() || last == last_at_report) continue;
      reported = false;
      spdlog::info("watchdog: this node's job makes progress again");
      try {
        peers_->ReportStall(cycle, "", false);
      } catch (const std::exception& error) {
        spdlog::error("watchdog: cannot tell node 0 that this node's job makes progress again: {}", error.what());
      }
    }
    // Within the startup window nothing is a hang, whatever the job printed (a banner, then a
    // long load).
    if (!startup_over) continue;
    const double limit_s = StallLimitSeconds(settings_, progress_.seen(), longest_gap_s);
    const double quiet_s = Seconds(Clock::now() - (progress_.seen() ? last : since));
    if (limit_s <= 0 || quiet_s < limit_s) continue;
    reported = true;
    last_at_report = last;
    OnStall(cycle, quiet_s, limit_s);
  }
}

// The startup window (model loading, compilation) ends at the job's first heartbeat or new
// checkpoint (it is in its loop), else startup_timeout_s after the cycle's start; output
// alone does not end it, since a banner or torchrun's OMP warning comes before a long load.
// With startup_timeout_s 0 (no startup limit) it ends at the first progress of any kind.
bool Watchdog::StartupOver(bool job_says_it_runs, double elapsed_s) const {
  if (job_says_it_runs) return true;
  if (settings_.startup_timeout_s <= 0) return progress_.seen();
  return elapsed_s >= settings_.startup_timeout_s;
}

void Watchdog::OnStall(int64_t cycle, double quiet_s, double limit_s) {
  const std::string quiet = FormatSeconds(quiet_s);
  const std::string limit = progress_.seen() ? (settings_.stall_timeout_s ? "launcher.watchdog.stall_timeout_s"
                                                                           : "auto: the larger of launcher.watchdog.auto_min_s "
                                                                             "and 5x the longest gap between progress so far")
                                             : "launcher.watchdog.startup_timeout_s, before the job's first progress";
  spdlog::warn("watchdog: this node's job made no progress for {} (limit {}: {}): no output, no heartbeat, no checkpoint",
               quiet, FormatSeconds(limit_s), limit);
  if (peers_ != nullptr) {
    spdlog::info("watchdog: node 0 calls the job hung once every node's job has stopped making progress");
    try {
      peers_->ReportStall(cycle, quiet + " (limit " + FormatSeconds(limit_s) + ")", true);
    } catch (const std::exception& error) {
      spdlog::error("watchdog: cannot tell node 0 about the stall: {}", error.what());
    }
    return;
  }
  // A node alone: its own stacks make the whole report.
  const auto asked = Clock::now();
  const std::vector<NodeStacks> nodes{ParseAnswer(node_.rank, NodeAnswer(quiet_s))};
  // The job ended while its stacks were taken (a final save that was slow, not stuck): its
  // own exit is the cycle's outcome, not a hang.
  if (Stopping()) {
    spdlog::info("watchdog: the job ended while its stacks were being taken: not a hang");
    return;
  }
  const HangFindings findings = Judge(nodes, node_.rank, "limit " + FormatSeconds(limit_s));
  TellHangCalled(cycle, asked, findings.job_quiet_s.value_or(quiet_s));
  std::string cause = findings.cause;
  const fs::path report = paths_.report_dir / ("hang-" + UtcStamp() + "-cycle-" + std::to_string(cycle) + ".txt");
  try {
    storage::WriteFileAtomically(report.string(), RenderReport(cycle, "this node's job hung: " + cause, findings, nodes));
    cause += "; report: " + report.string();
  } catch (const std::exception& error) {
    spdlog::error("watchdog: cannot write the hang report {}: {}", report.string(), error.what());
  }
  for (const std::string& line : findings.summary) spdlog::error("watchdog: {}", line);
  std::lock_guard lock(mutex_);
  if (stopping_) return;  // the job ended meanwhile: the supervisor will not take this stop
  stop_ = "the job hung: " + cause;
  hung_ = true;
  WakeSupervisorIn(Clock::duration::zero());
}

std::string Watchdog::NodeAnswer(double quiet_s) {
  const auto timeout = std::chrono::milliseconds(int64_t(settings_.stack_timeout_s * 1000));
  const auto stopping = [this] { return Stopping(); };
  // First: PyTorch's threads write the dumps while the stacks are taken.
  const std::vector<AskedDump> dumps = RequestDumps(paths_.flight_recorder);
  const auto dumps_deadline = Clock::now() + timeout;
  std::vector<ProcessStack> stacks = CollectPythonStacks(paths_.stack_dir, timeout, kMaxDumpBytes, stopping);
  if (stacks.size() > kMaxProcesses) stacks.resize(kMaxProcesses);
  std::set<pid_t> with_stack;
  std::vector<pid_t> pids;
  json processes = json::array();
  for (ProcessStack& stack : stacks) {
    with_stack.insert(stack.pid);
    pids.push_back(stack.pid);
    if (!stack.answered) stack.labels["state"] = ProcessState(stack.pid);
    processes.push_back({{"pid", stack.pid}, {"labels", stack.labels}, {"command", stack.command},
                         {"dump", stack.dump}, {"answered", stack.answered}});
  }
  json others = json::array();
  for (const OtherProcess& other : OtherJobProcesses(with_stack)) {
    others.push_back(other.line);
    pids.push_back(other.pid);
  }
  // After the Python stacks: gdb stops each process while it reads it.
  const NativeStacks native = CollectNativeStacks(pids, timeout, kMaxDumpBytes, stopping);
  json native_frames = json::object();
  for (const auto& [pid, frames] : native.by_pid) native_frames[std::to_string(pid)] = frames;
  json answer{{"host", node_.host},
              {"processes", std::move(processes)},
              {"others", std::move(others)},
              {"native", std::move(native_frames)},
              {"native_note", native.note},
              {"nccl", DescribeDumps(paths_.flight_recorder, dumps, dumps_deadline, stopping)}};
  if (progress_.seen()) answer["quiet_s"] = quiet_s;
  // Stacks hold paths, which are bytes: what is not UTF-8 is replaced, never thrown on.
  return answer.dump(-1, ' ', false, json::error_handler_t::replace);
}

void Watchdog::AnswerStackRequest(int64_t cycle, bool finished) {
  const double quiet_s = Seconds(Clock::now() - progress_.last());
  try {
    rendezvous::Store* store = peers_->store();
    if (store == nullptr) throw std::runtime_error("no rendezvous store");
    const std::string answer = finished ? json{{"host", node_.host}, {"finished", true}}.dump(-1, ' ', false, json::error_handler_t::replace)
                                        : NodeAnswer(quiet_s);
    store->Set(HangKey(cycle, "stacks/" + std::to_string(node_.rank)), answer);
    store->Add(HangKey(cycle, "answered"), 1);
    spdlog::info("watchdog: sent this node's stacks to node 0");
  } catch (const std::exception& error) {
    spdlog::error("watchdog: cannot send this node's stacks to node 0: {}", error.what());
  }
}

void Watchdog::TellHangCalled(int64_t cycle, Clock::time_point asked, double quiet_s) {
  if (!on_hang_called_) return;
  const auto stall_start = asked - std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(quiet_s));
  on_hang_called_(cycle, stall_start, Clock::now());
}

void Watchdog::GatherAndDeclare(int64_t cycle, int stalled_rank, Clock::time_point asked) {
  rendezvous::Store* store = peers_->store();
  if (store == nullptr) return;
  // Each node takes up to stack_timeout_s for the Python stacks, then as long for gdb's.
  const auto deadline = Clock::now() + 2 * std::chrono::milliseconds(int64_t(settings_.stack_timeout_s * 1000)) + kGatherSlack;
  // Only the nodes running a rank answer: a hot spare runs no job (launcher.spares).
  const std::vector<int> training = peers_->NodesRunningRanks(node_.node_count);
  while (!Stopping() && Clock::now() < deadline) {
    if (store->WaitCounter(HangKey(cycle, "answered"), int64_t(training.size()), std::chrono::milliseconds(250))) break;
  }
  if (Stopping()) return;  // the cycle ended some other way meanwhile
  std::vector<std::string> keys;
  for (int node : training) keys.push_back(HangKey(cycle, "stacks/" + std::to_string(node)));
  const std::vector<std::optional<std::string>> values = store->Peek(keys);
  std::vector<NodeStacks> nodes;
  for (size_t i = 0; i < training.size(); ++i) nodes.push_back(ParseAnswer(training[i], values[i]));
  HangFindings findings = Judge(nodes, stalled_rank, "launcher.watchdog");
  std::string cause = findings.cause;
  if (last_hang_ && last_hang_->second == findings.place && !findings.place.empty()) {
    cause = "the same hang as in cycle " + std::to_string(last_hang_->first) + ": " + cause;
    findings.summary.insert(findings.summary.begin(), "the same hang as in cycle " + std::to_string(last_hang_->first) +
                                                          ", at the same place");
  }
  last_hang_ = {cycle, findings.place};
  const fs::path report = paths_.report_dir / ("hang-" + UtcStamp() + "-cycle-" + std::to_string(cycle) + ".txt");
  try {
    storage::WriteFileAtomically(report.string(), RenderReport(cycle, "the job hung: " + cause, findings, nodes));
    cause += "; report: " + report.string() + " on node 0";
  } catch (const std::exception& error) {
    spdlog::error("watchdog: cannot write the hang report {}: {}", report.string(), error.what());
  }
  for (const std::string& line : findings.summary) spdlog::error("watchdog: {}", line);
  if (findings.job_quiet_s) TellHangCalled(cycle, asked, *findings.job_quiet_s);
  try {
    peers_->DeclareHang(cycle, findings.blamed_rank, cause, kExitHung);
  } catch (const std::exception& error) {
    spdlog::error("watchdog: cannot declare the hang: {}", error.what());
  }
}

}  // namespace bt::launcher::watchdog
