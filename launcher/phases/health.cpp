#include "launcher/phases/health.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <set>

#include <spdlog/spdlog.h>

#include "launcher/exit_codes.h"
#include "launcher/health/gpu_checks.h"
#include "rendezvous/cycles.h"
#include "rendezvous/node_info.h"

namespace bt::launcher {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using health::Finding;
using health::Severity;

constexpr const char* kPublishedKey = "bt/health/published";
constexpr const char* kReadKey = "bt/health/read";
constexpr auto kExchangeTimeout = 120s;
constexpr auto kArrivalSlice = 1s;
constexpr auto kLeaveAfterReadWait = 5s;  // an unhealthy node waits this long for node 0's table
constexpr unsigned kXidWaitMs = 500;      // the watch thread's longest sleep: its stop latency

std::string FindingsKey(int rank) { return "bt/health/node/" + std::to_string(rank); }

// A device list's length: "0,1,2,3" or "GPU-…,GPU-…". "all", "none", "void" and "" count nothing.
std::optional<unsigned> ListedDevices(const std::string& list) {
  if (list.empty() || list == "all" || list == "none" || list == "void" || list == "NoDevFiles") return std::nullopt;
  unsigned count = 1;
  for (char c : list) count += c == ',';
  return count;
}

std::optional<std::string> Variable(const env::JobEnvironment& environment, const std::string& name) {
  auto found = environment.variables.find(name);
  if (found != environment.variables.end()) return found->second;
  if (const char* value = getenv(name.c_str())) return std::string(value);
  return std::nullopt;
}

std::string GpuLabel(const Finding& finding) {
  if (finding.gpu < 0) return finding.pci_bus_id.empty() ? "node" : "NIC " + finding.pci_bus_id;
  std::string label = "GPU " + std::to_string(finding.gpu);
  std::string ids = finding.uuid;
  if (!finding.pci_bus_id.empty()) ids += (ids.empty() ? "" : ", ") + finding.pci_bus_id;
  return ids.empty() ? label : label + " (" + ids + ")";
}

std::string DescribeOne(const Finding& finding) {
  std::string line = GpuLabel(finding) + ": " + finding.what;
  if (!finding.value.empty()) line += " = " + finding.value;
  if (!finding.fix.empty()) line += "; fix: " + finding.fix;
  return line;
}

// The same finding read again (each sample finds a lasting fault anew): logged once.
std::string Identity(const Finding& finding) {
  return std::to_string(finding.gpu) + "|" + finding.pci_bus_id + "|" + finding.what + "|" + finding.value;
}

void LogFinding(const Finding& finding) {
  switch (finding.severity) {
    case Severity::kFatal: return spdlog::error("health: fatal: {}", DescribeOne(finding));
    case Severity::kWarning: return spdlog::warn("health: warning: {}", DescribeOne(finding));
    case Severity::kSkipped: return spdlog::info("health: SKIPPED: {}", DescribeOne(finding));
  }
}

// Node 0: every node's findings (its own as it publishes them), waiting up to
// kExchangeTimeout for the others; a node that never published is named in the table.
std::vector<health::NodeFindings> CollectFindings(rendezvous::Store& store, int count,
                                                  const health::NodeFindings& own) {
  const auto deadline = Clock::now() + kExchangeTimeout;
  while (Clock::now() < deadline && !store.WaitCounter(kPublishedKey, count, kArrivalSlice)) {
  }
  std::vector<std::string> keys;
  for (int rank = 0; rank < count; ++rank) keys.push_back(FindingsKey(rank));
  const auto texts = store.Peek(keys);
  std::vector<health::NodeFindings> nodes;
  for (int rank = 0; rank < count; ++rank) {
    if (rank == own.node) {
      nodes.push_back(own);
      continue;
    }
    const auto& text = texts[size_t(rank)];
    try {
      if (text) {
        nodes.push_back(health::NodeFindings::FromJson(nlohmann::json::parse(*text)));
        continue;
      }
      spdlog::warn("health: node {} published no findings within {} s", rank, kExchangeTimeout.count());
    } catch (const std::exception& error) {
      spdlog::warn("health: node {}'s findings are malformed ({}); not shown", rank, error.what());
    }
  }
  return nodes;
}

// The findings a table shows: SKIPPED checks are said in each node's own log only.
health::NodeFindings Shown(int rank, const std::vector<Finding>& findings) {
  health::NodeFindings node{rank, rendezvous::HostName(), {}};
  for (const Finding& finding : findings) {
    if (finding.severity != Severity::kSkipped) node.findings.push_back(finding);
  }
  return node;
}

void PrintTable(const std::vector<health::NodeFindings>& nodes) {
  const std::string table = health::FormatFindingsTable(nodes);
  if (table.empty()) return spdlog::info("health: no finding on any node");
  bool fatal = false;
  for (const auto& node : nodes) fatal = fatal || health::HasFatal(node.findings);
  if (fatal) return spdlog::error("health: a node cannot train (launcher.health):\n{}", table);
  spdlog::warn("health: findings (warnings only; the job starts):\n{}", table);
}

// An unhealthy node leaves once node 0 has shown its findings (or after a short wait): the
// table names it before the abort its failure causes.
void AwaitTableRead(rendezvous::Store& store) {
  try {
    store.WaitCounter(kReadKey, 1, kLeaveAfterReadWait);
  } catch (const std::exception&) {
  }
}

}  // namespace

std::optional<unsigned> ExpectedGpus(const env::HealthSettings& settings, const env::JobEnvironment& environment) {
  if (settings.expect_gpus) return unsigned(*settings.expect_gpus);
  for (const char* name : {"NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"}) {
    if (auto list = Variable(environment, name)) {
      if (auto count = ListedDevices(*list)) return count;
    }
  }
  if (auto nproc = Variable(environment, "NPROC_PER_NODE")) {
    try {
      const int count = std::stoi(*nproc);
      if (count > 0) return unsigned(count);
    } catch (const std::exception&) {
    }
  }
  return std::nullopt;
}

std::unique_ptr<NodeHealth> NodeHealth::Open(const env::HealthSettings& settings, const env::JobEnvironment& environment,
                                             const std::string& sysfs_root) {
  if (settings.mode == env::HealthMode::kOff) return nullptr;
  std::string error;
  std::unique_ptr<health::Nvml> nvml = health::Nvml::Open(health::Nvml::DefaultLibrary(), error);
  if (!nvml && settings.mode == env::HealthMode::kOn) {
    throw LaunchFailure(kExitUnhealthy, "health: launcher.health.enabled is true, but " + error +
                                            " (BT_NVML_LIBRARY names another library)");
  }
  if (!nvml) spdlog::info("health: {}: GPU checks SKIPPED (launcher.health.enabled \"auto\")", error);
  const std::optional<unsigned> expected = ExpectedGpus(settings, environment);
  return std::unique_ptr<NodeHealth>(new NodeHealth(settings, expected, sysfs_root, std::move(nvml)));
}

NodeHealth::NodeHealth(env::HealthSettings settings, std::optional<unsigned> expected, std::string sysfs_root,
                       std::unique_ptr<health::Nvml> nvml)
    : settings_(std::move(settings)), expected_gpus_(expected), sysfs_root_(std::move(sysfs_root)), nvml_(std::move(nvml)) {}

NodeHealth::~NodeHealth() = default;

void NodeHealth::WatchPorts(std::vector<health::UsedPort> ports) {
  std::lock_guard lock(ports_mutex_);
  port_baseline_ = health::ReadPortCounters(sysfs_root_, ports);
}

std::vector<Finding> NodeHealth::Sample() {
  std::vector<Finding> findings;
  if (nvml_) findings = health::SampleGpus(*nvml_, expected_gpus_).findings;
  std::lock_guard lock(ports_mutex_);
  if (port_baseline_.empty()) return findings;
  health::PortCheck ports = health::CheckPorts(sysfs_root_, port_baseline_);
  port_baseline_ = std::move(ports.counters);
  findings.insert(findings.end(), ports.findings.begin(), ports.findings.end());
  return findings;
}

bool NodeHealth::checks_anything() {
  std::lock_guard lock(ports_mutex_);
  return nvml_ != nullptr || !port_baseline_.empty();
}

health::XidReader* NodeHealth::Xids() {
  if (xids_opened_ || !nvml_) return xids_.get();
  xids_opened_ = true;
  std::vector<Finding> why;
  xids_ = health::XidReader::Open(*nvml_, why);
  for (const Finding& finding : why) LogFinding(finding);
  return xids_.get();
}

std::string DescribeFatal(const std::vector<Finding>& findings) {
  std::string text;
  for (const Finding& finding : findings) {
    if (finding.severity != Severity::kFatal) continue;
    text += (text.empty() ? "" : "\n") + DescribeOne(finding);
  }
  return text;
}

// Node 0, with hot spares: who runs which rank from the first cycle. A node with a fatal
// finding gives its rank to a spare whose findings are clean (node 0 too: it keeps serving
// the store and runs no command); without such a spare it keeps it, and its own failure ends
// the start.
std::vector<int> StartRanks(const env::JobConfig& config, const env::NodeIdentity& identity,
                            const std::vector<health::NodeFindings>& nodes) {
  rendezvous::RankAssignment assignment(identity.count, identity.training_count());
  if (config.launcher.health.on_unhealthy == env::OnUnhealthy::kWarn) return assignment.Slots();
  std::vector<bool> published(size_t(identity.count), false), fatal(size_t(identity.count), false);
  for (const health::NodeFindings& node : nodes) {
    if (node.node < 0 || node.node >= identity.count) continue;
    published[size_t(node.node)] = true;
    fatal[size_t(node.node)] = health::HasFatal(node.findings);
  }
  for (int slot = 0; slot < identity.training_count(); ++slot) {
    if (!fatal[size_t(slot)]) continue;
    for (int spare = identity.training_count(); spare < identity.count; ++spare) {
      if (!assignment.IsSpare(spare) || !published[size_t(spare)] || fatal[size_t(spare)]) continue;
      spdlog::warn("health: node {} cannot train: its rank {} starts on the spare node {}", slot, slot, spare);
      assignment.Move(slot, spare);
      break;
    }
  }
  return assignment.Slots();
}

// Every node, with hot spares: the start's ranks as node 0 decided them (rendezvous::kStartRanksKey).
std::vector<int> ReadStartRanks(rendezvous::Store& store, const env::NodeIdentity& identity) {
  const std::string text = store.Get(rendezvous::kStartRanksKey, kExchangeTimeout + kExchangeTimeout);
  try {
    return rendezvous::ParseStartRanks(text, identity.count, identity.training_count());
  } catch (const std::exception& error) {
    throw LaunchFailure(kExitInternal, std::string("health: node 0's start ranks: ") + error.what());
  }
}

StartHealth CheckHealthBeforeStart(const env::JobConfig& config, const env::NodeIdentity& identity, Peers* peers,
                                   NodeHealth& health) {
  rendezvous::Store* store = peers ? peers->store() : nullptr;
  if (store == nullptr && !health.checks_anything()) return {};  // said at Open: nothing to read here
  const auto started = Clock::now();
  const std::vector<Finding> findings = health.Sample();
  for (const Finding& finding : findings) LogFinding(finding);
  spdlog::info("health: {} finding(s) on this node in {:.1f} ms{}", findings.size(),
               std::chrono::duration<double, std::milli>(Clock::now() - started).count(),
               health.gpus_checked() ? "" : " (no NVML: NIC ports only)");
  const health::NodeFindings own = Shown(identity.rank, findings);
  const bool spares = store != nullptr && identity.spares > 0;
  std::optional<std::vector<int>> start_ranks;
  if (store == nullptr) {
    PrintTable({own});
  } else if (identity.rank == 0) {
    store->Set(FindingsKey(0), own.ToJson().dump());
    store->Add(kPublishedKey, 1);
    const std::vector<health::NodeFindings> nodes = CollectFindings(*store, identity.count, own);
    PrintTable(nodes);
    if (spares) {
      start_ranks = StartRanks(config, identity, nodes);
      store->Set(rendezvous::kStartRanksKey, nlohmann::json(*start_ranks).dump());
    }
    store->Add(kReadKey, 1);
  } else {
    store->Set(FindingsKey(identity.rank), own.ToJson().dump());
    store->Add(kPublishedKey, 1);
    if (spares) start_ranks = ReadStartRanks(*store, identity);
  }
  if (!health::HasFatal(findings)) return {start_ranks};
  if (config.launcher.health.on_unhealthy == env::OnUnhealthy::kWarn) {
    spdlog::warn("health: this node has a fatal finding, and launcher.health.on_unhealthy is \"warn\": it trains anyway");
    return {start_ranks};
  }
  // Its rank starts on a spare (or it is a spare): it passes the ready barrier with the
  // others, runs nothing, and leaves (75) once they start (RunCycles).
  if (start_ranks && std::find(start_ranks->begin(), start_ranks->end(), identity.rank) == start_ranks->end()) {
    if (identity.rank == 0) {
      spdlog::error("health: this node cannot train; rank 0 starts on a spare, and this node keeps serving the rendezvous "
                    "without running a command (replace it once the job ends):\n{}",
                    DescribeFatal(findings));
      return {start_ranks, true};
    }
    spdlog::error("health: this node cannot train; it runs no rank and leaves once every node is ready:\n{}",
                  DescribeFatal(findings));
    return {start_ranks, true};
  }
  if (store != nullptr && identity.rank != 0) AwaitTableRead(*store);
  throw LaunchFailure(kExitUnhealthy, "health: this node cannot train; replace it:\n" + DescribeFatal(findings));
}

HealthWatch::HealthWatch(NodeHealth& health, int rank) : health_(health), rank_(rank) {
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) throw std::runtime_error(std::string("eventfd: ") + std::strerror(errno));
  thread_ = std::thread([this] { Run(); });
}

HealthWatch::~HealthWatch() {
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
  if (wake_fd_ >= 0) close(wake_fd_);
}

// Xid events wake the thread as the driver posts them; the sample comes every interval_s.
// An exception (an NVML surprise) stops the watch, never the launcher (PID 1).
void HealthWatch::Run() {
  try {
    const auto interval = std::chrono::milliseconds(int64_t(health_.settings().interval_s * 1000));
    auto next_sample = Clock::now() + interval;
    while (!stopping_) {
      const auto now = Clock::now();
      if (now >= next_sample) {
        Take(health_.Sample());
        next_sample = Clock::now() + interval;
        continue;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(next_sample - now);
      const unsigned wait_ms = unsigned(std::min<int64_t>(left.count(), kXidWaitMs));
      const auto waited_from = Clock::now();
      health::XidReader* xids = health_.Xids();
      const std::vector<Finding> found = xids ? xids->Wait(wait_ms) : std::vector<Finding>{};
      Take(found);
      // A wait that fails at once (a GPU lost, events unsupported) must not become a busy
      // loop beside the training: without an Xid it takes its whole slice.
      const bool xid = std::any_of(found.begin(), found.end(), [](const Finding& f) { return f.xid != 0; });
      if (!xid) std::this_thread::sleep_until(waited_from + std::chrono::milliseconds(std::min<unsigned>(wait_ms, 200)));
    }
  } catch (const std::exception& error) {
    spdlog::error("health: the health watch stopped on an error ({}); the job goes on unwatched", error.what());
  }
}

void HealthWatch::Take(const std::vector<Finding>& findings) {
  const bool leave = health_.settings().on_unhealthy == env::OnUnhealthy::kLeave;
  bool newly_fatal = false;
  std::lock_guard lock(mutex_);
  for (const Finding& finding : findings) {
    if (finding.severity == Severity::kSkipped) continue;
    const std::string identity = Identity(finding);
    const bool seen = std::find(warned_.begin(), warned_.end(), identity) != warned_.end();
    if (!seen) {
      warned_.push_back(identity);
      LogFinding(finding);
      ++(finding.severity == Severity::kFatal ? seen_.fatal : seen_.warning);
    }
    if (finding.severity != Severity::kFatal || !leave || seen) continue;
    fatal_.push_back(finding);
    newly_fatal = true;
  }
  if (!newly_fatal) return;
  uint64_t one = 1;
  [[maybe_unused]] ssize_t ignored = write(wake_fd_, &one, sizeof one);
}

HealthWatch::Counts HealthWatch::Seen() const {
  std::lock_guard lock(mutex_);
  return seen_;
}

std::optional<std::string> HealthWatch::TakeStop() {
  uint64_t count;
  [[maybe_unused]] ssize_t ignored = read(wake_fd_, &count, sizeof count);
  std::lock_guard lock(mutex_);
  if (fatal_.empty() || stop_taken_) return std::nullopt;
  stop_taken_ = true;
  return "health: node " + std::to_string(rank_) + " cannot train: " + DescribeFatal(fatal_);
}

void HealthWatch::Recheck() { Take(health_.Sample()); }

std::vector<Finding> HealthWatch::Fatal() const {
  std::lock_guard lock(mutex_);
  return fatal_;
}

}  // namespace bt::launcher
