#include "launcher/tools/doctor.h"

#include <netdb.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <regex>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "env/environment.h"
#include "env/identity.h"
#include "env/job_config.h"
#include "launcher/exit_codes.h"
#include "launcher/phases/checkpoints.h"
#include "launcher/health/gpu_checks.h"
#include "launcher/phases/fabric.h"
#include "launcher/phases/health.h"
#include "launcher/supervision/peers.h"
#include "rendezvous/client.h"
#include "rendezvous/fabric/inventory.h"
#include "rendezvous/node_info.h"
#include "rendezvous/server.h"
#include "storage/destination.h"
#include "storage/paths.h"

namespace bt::launcher {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr auto kConnectTimeout = 3s;
constexpr uint64_t kGiB = uint64_t(1) << 30;
constexpr uint64_t kMinFreeBytes = kGiB;
constexpr uint64_t kMinSharedMemoryBytes = kGiB;  // Docker's default is 64 MiB
constexpr rlim_t kMinOpenFiles = 65536;
constexpr auto kSkewWarn = 1s;
constexpr auto kSkewFail = 300s;  // S3 refuses requests signed 5 minutes off (RequestTimeTooSkewed)

const char* VerdictName(Verdict verdict) {
  switch (verdict) {
    case Verdict::kOk: return "ok";
    case Verdict::kWarn: return "WARN";
    case Verdict::kFail: return "FAIL";
    case Verdict::kSkip: return "skip";
  }
  return "?";
}

std::string Join(const std::vector<std::string>& items, const std::string& separator = ", ") {
  std::string text;
  for (const auto& item : items) text += (text.empty() ? "" : separator) + item;
  return text;
}

// The directory, or the nearest folder above it that exists (where it would be created).
fs::path ExistingAncestor(fs::path path) {
  std::error_code error;
  while (!path.empty() && !fs::exists(path, error) && path != path.root_path()) path = path.parent_path();
  return path;
}

// Writes and removes a file in `directory`: the only test that a read-only mount, a full
// disk, a squashed root or an ACL cannot fool.
std::optional<std::string> CannotWriteIn(const fs::path& directory) {
  std::string probe = (directory / ".bt-doctor-XXXXXX").string();
  int fd = mkstemp(probe.data());
  if (fd < 0) return std::string(std::strerror(errno));
  const bool wrote = write(fd, "x", 1) == 1;
  const int error = errno;
  close(fd);
  unlink(probe.c_str());
  if (!wrote) return std::string(std::strerror(error));
  return std::nullopt;
}

class Doctor {
 public:
  explicit Doctor(const CliOptions& cli) : cli_(cli) {}

  std::vector<Finding> Run() {
    if (!CheckConfig() || !CheckIdentity() || !CheckEnvironment()) return findings_;
    CheckLeader();
    CheckToken();
    CheckFabric();
    CheckSharedMemory();
    CheckLimits();
    CheckGpus();
    CheckGpuHealth();
    CheckDirectories();
    CheckDestination();
    return findings_;
  }

 private:
  void Add(std::string check, Verdict verdict, std::string detail, std::string fix = "") {
    findings_.push_back({std::move(check), verdict, std::move(detail), std::move(fix)});
  }

  bool CheckConfig() {
    try {
      config_ = env::LoadJobConfig(cli_.config_path, std::getenv("BT_JOB_CONFIG"), false);
    } catch (const env::ConfigError& error) {
      Add("config", Verdict::kFail, error.what(), "correct the field the message names");
      return false;
    }
    const std::string source = cli_.config_path ? *cli_.config_path
                               : std::getenv("BT_JOB_CONFIG") != nullptr ? std::string("BT_JOB_CONFIG")
                                                                          : std::string("the embedded default");
    Add("config", Verdict::kOk, source + ": " + std::to_string(config_.runtime.start_commands.size()) + " start command(s)");
    return true;
  }

  bool CheckIdentity() {
    try {
      std::optional<int> node_count;
      if (config_.compute.node_count_given) node_count = config_.compute.node_count;
      identity_ = env::ResolveIdentity(cli_.identity, env::ProcessEnvLookup(), node_count, config_.launcher.spares);
    } catch (const env::IdentityError& error) {
      Add("identity", Verdict::kFail, error.what(),
          "give --node-rank/--node-count/--leader-addr or BT_NODE_RANK/BT_GROUP_SIZE/BT_LEADER_ADDR, or start under "
          "mpirun, Slurm (srun) or a Kubernetes Indexed Job/LeaderWorkerSet");
      return false;
    }
    Add("identity", Verdict::kOk, identity_.Describe());
    return true;
  }

  bool CheckEnvironment() {
    try {
      environment_ = env::BuildJobEnvironment(config_, identity_, env::PathLayout(cli_.root, identity_.rank),
                                              env::CurrentEnviron());
    } catch (const std::exception& error) {
      Add("secrets", Verdict::kFail, error.what(), "create the secret file the message names (BT_SECRETS_DIR)");
      return false;
    }
    return true;
  }

  // The leader's name, its port, the token it expects and its clock, in that order: each
  // needs the one before.
  void CheckLeader() {
    if (identity_.count == 1) {
      Add("leader", Verdict::kSkip, "single node: no leader to reach");
      return;
    }
    try {
      endpoint_ = ResolveEndpoint(config_, environment_.variables.at("BT_TRAINING_JOB_ID"));
    } catch (const LaunchFailure& failure) {
      Add("leader port", Verdict::kFail, failure.what(), "BT_RENDEZVOUS_PORT must be a port number");
      return;
    }
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* addresses = nullptr;
    const std::string port = std::to_string(endpoint_->port);
    if (int status = getaddrinfo(identity_.leader_addr.c_str(), port.c_str(), &hints, &addresses); status != 0) {
      Add("leader name", Verdict::kFail, identity_.leader_addr + " (from " + identity_.leader_source + ") does not resolve: " + gai_strerror(status),
          "check the name: Kubernetes needs a headless Service named as the pods' subdomain (publishNotReadyAddresses), "
          "Slurm the first host of SLURM_STEP_NODELIST in DNS or /etc/hosts");
      return;
    }
    std::vector<std::string> resolved;
    for (addrinfo* address = addresses; address != nullptr; address = address->ai_next) resolved.push_back(rendezvous::AddressText(address->ai_addr));
    if (CheckLeaderName(resolved)) ReachLeader(addresses);
    freeaddrinfo(addresses);
  }

  // False when the port check would only mislead: node 0 serves the store on its own host,
  // so a leader address of another host fails `run` whatever answers there.
  bool CheckLeaderName(const std::vector<std::string>& resolved) {
    std::string detail = identity_.leader_addr + " -> " + Join(resolved);
    if (IsLoopback(resolved.front())) {
      Add("leader name", Verdict::kWarn, detail + " (loopback)",
          "loopback works only when all " + std::to_string(identity_.count) + " nodes run on this host; give node 0's address");
      return true;
    }
    if (identity_.rank == 0 && !ResolvesToThisHost(resolved)) {
      Add("leader name", Verdict::kFail, detail + ": none of these is an address of this host, yet this node is rank 0 and serves the rendezvous",
          "BT_LEADER_ADDR (or --leader-addr) must name node 0 itself, the same on every node; or this node's rank is wrong");
      Add("leader port", Verdict::kSkip, "the leader address is another host: node 0 cannot serve there");
      Add("clock skew", Verdict::kSkip, "the leader address is another host");
      token_checked_ = true;
      return false;
    }
    if (identity_.rank != 0 && ResolvesToThisHost(resolved)) {
      Add("leader name", Verdict::kWarn, detail + ": that is this host, but this node is rank " + std::to_string(identity_.rank),
          "unless every node runs on this host, BT_LEADER_ADDR must name node 0 (e.g. <job>-0.<service>), not this pod");
      return true;
    }
    Add("leader name", Verdict::kOk, detail);
    return true;
  }

  bool ResolvesToThisHost(const std::vector<std::string>& resolved) {
    return std::any_of(resolved.begin(), resolved.end(), [&](const std::string& address) {
      return !rendezvous::fabric::InterfaceWithAddress(Fabric().inventory.interfaces, address).empty();
    });
  }

  void ReachLeader(const addrinfo* addresses) {
    const std::string where = identity_.leader_addr + ":" + std::to_string(endpoint_->port);
    int fd = -1;
    int error = 0;
    for (const addrinfo* address = addresses; address != nullptr && fd < 0; address = address->ai_next) {
      fd = rendezvous::ConnectWithin(*address, kConnectTimeout, error);
    }
    if (fd < 0) {
      ReportUnreachable(where, error);
      return;
    }
    Add("leader port", Verdict::kOk, where + " accepts connections");
    try {
      const rendezvous::LeaderHandshake handshake = rendezvous::AuthenticateToLeader(fd, endpoint_->token);
      close(fd);
      Add("token", Verdict::kOk, "the leader accepted this node's token and proved it holds the same one");
      token_checked_ = true;
      ReportClock(handshake);
    } catch (const std::exception& failure) {
      close(fd);
      token_checked_ = true;
      Add("token", Verdict::kFail, std::string("handshake with ") + where + " failed: " + failure.what(),
          "every node needs the same BT_RENDEZVOUS_TOKEN (or BT_RENDEZVOUS_TOKEN_FILE); if the port belongs to another "
          "program, set BT_RENDEZVOUS_PORT the same on every node");
    }
  }

  void ReportUnreachable(const std::string& where, int error) {
    if (identity_.rank == 0 && error == ECONNREFUSED) {
      // Before the job starts nobody serves yet: what matters is that node 0 will be able to.
      if (auto taken = rendezvous::PortUnavailable(endpoint_->port)) {
        Add("leader port", Verdict::kFail, *taken + " here, where node 0 serves",
            "another program holds it: stop it, or set BT_RENDEZVOUS_PORT to a free port on every node");
      } else {
        Add("leader port", Verdict::kOk, "nothing serves " + where + " yet; node 0 can listen on port " + std::to_string(endpoint_->port));
      }
      Add("clock skew", Verdict::kSkip, "measured against a running leader (node 0's bt-launch)");
      return;
    }
    if (error == ECONNREFUSED) {
      // The leader's host answered: node 0's bt-launch serves only while the job runs, so
      // before it (`srun -N2 bt-launch doctor` on a fresh allocation) this is no fault.
      Add("leader port", Verdict::kWarn, where + ": " + std::strerror(error) + ": nothing serves yet, as before the job starts",
          "if the job is running, node 0's bt-launch exited or listens on another port: "
          "BT_RENDEZVOUS_PORT / launcher.rendezvous.port must agree on every node");
    } else if (error == ETIMEDOUT) {
      Add("leader port", Verdict::kFail, "no answer from " + where + " within 3 s (packets dropped)",
          "a firewall, security group or NetworkPolicy drops TCP port " + std::to_string(endpoint_->port) +
              ": allow it between the nodes");
    } else {
      Add("leader port", Verdict::kFail, where + ": " + std::strerror(error),
          "node 0's bt-launch is not running (not started yet, or exited), or listens on another port: "
          "BT_RENDEZVOUS_PORT / launcher.rendezvous.port must agree on every node");
    }
    Add("clock skew", Verdict::kSkip, "the leader is not reachable");
  }

  void ReportClock(const rendezvous::LeaderHandshake& handshake) {
    if (!handshake.clock_offset) {
      Add("clock skew", Verdict::kSkip, "the leader does not send its clock (an older bt-launch)");
      return;
    }
    const auto offset = *handshake.clock_offset;
    const auto magnitude = offset < 0ns ? -offset : offset;
    char detail[160];
    std::snprintf(detail, sizeof detail, "this node is %.3f s %s the leader (+/- %.3f s)",
                  std::chrono::duration<double>(magnitude).count(), offset > 0ns ? "behind" : "ahead of",
                  std::chrono::duration<double>(handshake.round_trip).count() / 2);
    const std::string fix = "run chrony or systemd-timesyncd on the hosts: timestamps across nodes disagree, and object "
                            "stores refuse requests signed 5 minutes off";
    if (magnitude >= kSkewFail) return Add("clock skew", Verdict::kFail, detail, fix);
    if (magnitude >= kSkewWarn) return Add("clock skew", Verdict::kWarn, detail, fix);
    Add("clock skew", Verdict::kOk, detail);
  }

  void CheckToken() {
    if (identity_.count == 1 || token_checked_ || !endpoint_) return;
    if (endpoint_->token_derived) {
      Add("token", Verdict::kWarn, "no BT_RENDEZVOUS_TOKEN or BT_RENDEZVOUS_TOKEN_FILE: derived from the job id",
          "anyone who knows the job id can join: set BT_RENDEZVOUS_TOKEN_FILE from a secret, the same on every node");
      return;
    }
    Add("token", Verdict::kOk, "set (" + std::to_string(endpoint_->token.size()) +
                                   " bytes); whether it matches the leader's is checked once a leader runs");
  }

  // This node's devices and interfaces, read once: the leader check needs the interfaces.
  // A malformed NCCL_IB_ADDR_* (which stops `run` with 65) is the fabric check's failure,
  // not the end of the report: the rest goes on with no devices.
  const FabricResult& Fabric() {
    if (fabric_) return *fabric_;
    try {
      fabric_ = InspectFabric(config_, identity_, rendezvous::fabric::SysfsRoot(cli_.sysfs_root), environment_);
    } catch (const LaunchFailure& failure) {
      fabric_failure_ = failure.what();
      fabric_ = FabricResult{};
    }
    return *fabric_;
  }

  // The ports `run` would leave out for a fault (not the Ethernet NICs beside InfiniBand,
  // which are left out by design), as "mlx5_3:1 (state DOWN/Polling)".
  static std::vector<std::string> FaultyPorts(const FabricResult& fabric) {
    std::vector<std::string> faulty;
    if (fabric.plan.nodes.empty()) return faulty;
    for (const std::string& excluded : fabric.plan.nodes.front().selection.excluded) {
      if (excluded.find(" beside ") == std::string::npos) faulty.push_back(excluded);
    }
    return faulty;
  }

  void CheckFabric() {
    const FabricResult& fabric = Fabric();
    if (fabric_failure_) {
      Add("fabric", Verdict::kFail, *fabric_failure_, "correct or unset the variable the message names (docs/FABRIC.md)");
      return;
    }
    rdma_ = !fabric.inventory.devices.empty();
    const std::string summary = fabric.plan.nodes.empty() ? "no RDMA" : fabric.plan.nodes.front().summary;
    const std::vector<std::string> faulty = FaultyPorts(fabric);
    // What `run` decides for a multi-node job: RDMA ports present and none usable stop it (69).
    if (!fabric.plan.ok && identity_.count > 1) {
      Add("fabric", Verdict::kFail, summary + ": " + fabric.plan.failure + "; " + Join(faulty, "; "),
          "repair the named ports (ibstat; a port in INIT has no subnet manager), or set launcher.fabric.require to \"any\"");
      return;
    }
    if (!faulty.empty() || !fabric.inventory.warnings.empty()) {
      std::vector<std::string> problems;
      if (!faulty.empty()) problems.push_back("ports not usable: " + Join(faulty, "; "));
      problems.insert(problems.end(), fabric.inventory.warnings.begin(), fabric.inventory.warnings.end());
      Add("fabric", Verdict::kWarn, summary + "; " + Join(problems, "; "),
          "see docs/FABRIC.md: a port must be ACTIVE/LinkUp (ibstat), and the device nodes (/dev/infiniband) and "
          "memlock must reach the container");
      return;
    }
    if (!rdma_ && identity_.count > 1 && Gpus() > 0) {
      Add("fabric", Verdict::kWarn, summary + ": NCCL will use TCP sockets between nodes",
          "expected on Ethernet-only clusters; otherwise pass the RDMA devices into the container");
      return;
    }
    Add("fabric", Verdict::kOk, summary + (fabric.inventory.bootstrap_interface.empty() ? "" : ", bootstrap over " + fabric.inventory.bootstrap_interface));
  }

  int Gpus() const { return config_.compute.accelerator ? config_.compute.accelerator->count : 0; }

  void CheckSharedMemory() {
    struct statvfs shm {};
    if (statvfs("/dev/shm", &shm) != 0) {
      Add("/dev/shm", Verdict::kWarn, std::string("cannot read /dev/shm: ") + std::strerror(errno),
          "mount a tmpfs at /dev/shm: NCCL and DataLoader workers need it");
      return;
    }
    const uint64_t size = uint64_t(shm.f_blocks) * shm.f_frsize;
    const std::string detail = storage::FormatBytes(size) + " (" + storage::FormatBytes(uint64_t(shm.f_bavail) * shm.f_frsize) + " free)";
    if (size < kMinSharedMemoryBytes) {
      Add("/dev/shm", Gpus() > 1 ? Verdict::kFail : Verdict::kWarn, detail + ": too small (Docker's default is 64 MiB)",
          "NCCL between local GPUs and DataLoader workers fail with 'No space left' or bus errors: docker run "
          "--shm-size=16g (or --ipc=host); Kubernetes: an emptyDir with medium: Memory at /dev/shm");
      return;
    }
    Add("/dev/shm", Verdict::kOk, detail);
  }

  void CheckLimits() {
    rlimit memlock{};
    getrlimit(RLIMIT_MEMLOCK, &memlock);
    if (memlock.rlim_cur == RLIM_INFINITY) {
      Add("memlock", Verdict::kOk, "unlimited");
    } else if (rdma_) {
      Add("memlock", Verdict::kFail, storage::FormatBytes(memlock.rlim_cur) + ": RDMA registration (ibv_reg_mr) will fail with ENOMEM",
          "docker run --ulimit memlock=-1; on Kubernetes raise the container runtime's LimitMEMLOCK to infinity");
    } else {
      Add("memlock", Verdict::kOk, storage::FormatBytes(memlock.rlim_cur) + " (enough without RDMA)");
    }

    rlimit files{};
    getrlimit(RLIMIT_NOFILE, &files);
    const std::string detail = "soft " + std::to_string(files.rlim_cur) + ", hard " +
                               (files.rlim_max == RLIM_INFINITY ? std::string("unlimited") : std::to_string(files.rlim_max));
    const rlim_t leader_needs = rlim_t(2 * identity_.count + 256);  // a connection per node, and then some
    const std::string fix = "ulimit -n 1048576, or docker run --ulimit nofile=1048576:1048576";
    if (identity_.rank == 0 && std::max(files.rlim_cur, files.rlim_max) < leader_needs) {
      Add("open files", Verdict::kFail, detail + ": node 0 needs " + std::to_string(leader_needs) + " for " +
                                            std::to_string(identity_.count) + " nodes", fix);
    } else if (files.rlim_cur < kMinOpenFiles) {
      Add("open files", Verdict::kWarn, detail + ": DataLoader workers and NCCL run out of descriptors below 65536", fix);
    } else {
      Add("open files", Verdict::kOk, detail);
    }
  }

  // GPU device nodes as the NVIDIA container runtime creates them, in /dev (or beside a
  // --sysfs-root tree, as the fabric check reads its device nodes).
  void CheckGpus() {
    const fs::path dev = cli_.sysfs_root || std::getenv("BT_SYSFS_ROOT") != nullptr
                             ? fs::path(rendezvous::fabric::SysfsRoot(cli_.sysfs_root)).parent_path() / "dev"
                             : fs::path("/dev");
    int present = 0;
    std::error_code error;
    static const std::regex kGpuNode("nvidia[0-9]+");
    for (const auto& entry : fs::directory_iterator(dev, error)) {
      if (std::regex_match(entry.path().filename().string(), kGpuNode)) ++present;
    }
    std::string detail = std::to_string(present) + " in " + dev.string();
    int visible = present;
    if (const char* mask = std::getenv("CUDA_VISIBLE_DEVICES"); mask != nullptr) {
      const std::string text = mask;
      visible = text.empty() || text.rfind("-1", 0) == 0 ? 0 : int(std::count(text.begin(), text.end(), ',')) + 1;
      detail += ", CUDA_VISIBLE_DEVICES=\"" + text + "\" shows " + std::to_string(visible);
    }
    const int expected = Gpus();
    detail += expected > 0 ? ", compute.accelerator expects " + std::to_string(expected) : ", no accelerator configured";
    if (expected > 0 && std::min(present, visible) < expected) {
      Add("gpus", Verdict::kFail, detail,
          present < expected ? "the GPUs do not reach the container: docker run --gpus all (NVIDIA Container Toolkit); "
                               "Kubernetes: resources.limits nvidia.com/gpu"
                             : "CUDA_VISIBLE_DEVICES hides GPUs the job expects: unset it or match compute.accelerator");
      return;
    }
    Add("gpus", Verdict::kOk, detail);
  }

  // What `run`'s health phase reads (launcher.health, docs/HEALTH.md): one line per GPU with
  // its readings, then one per finding, fatal ones failing the doctor.
  void CheckGpuHealth() {
    const env::HealthSettings& settings = config_.launcher.health;
    if (settings.mode == env::HealthMode::kOff) return Add("gpu health", Verdict::kSkip, "launcher.health.enabled is false");
    std::string error;
    std::unique_ptr<health::Nvml> nvml = health::Nvml::Open(health::Nvml::DefaultLibrary(), error);
    if (!nvml) {
      const bool required = settings.mode == env::HealthMode::kOn;
      return Add("gpu health", required ? Verdict::kFail : Verdict::kSkip, error,
                 required ? "mount the NVIDIA driver's libnvidia-ml.so.1 (NVIDIA Container Toolkit), set BT_NVML_LIBRARY, "
                            "or set launcher.health.enabled to \"auto\""
                          : "");
    }
    const health::NodeSample sample = health::SampleGpus(*nvml, ExpectedGpus(settings, environment_));
    for (const health::GpuReadings& gpu : sample.gpus) Add("gpu " + std::to_string(gpu.index), Verdict::kOk, Readings(gpu));
    for (const health::Finding& finding : sample.findings) {
      const Verdict verdict = finding.severity == health::Severity::kFatal     ? Verdict::kFail
                              : finding.severity == health::Severity::kWarning ? Verdict::kWarn
                                                                               : Verdict::kSkip;
      std::string where = finding.gpu >= 0 ? "GPU " + std::to_string(finding.gpu) + " " + finding.uuid + ": " : "";
      Add("gpu health", verdict, where + finding.what + (finding.value.empty() ? "" : " = " + finding.value), finding.fix);
    }
    if (sample.findings.empty()) {
      Add("gpu health", Verdict::kOk, std::to_string(sample.gpus.size()) + " GPU(s), driver " + sample.driver_version +
                                          ": no finding");
    }
  }

  static std::string Readings(const health::GpuReadings& gpu) {
    auto number = [](const auto& value) { return value ? std::to_string(*value) : std::string("n/a"); };
    std::string text = gpu.uuid + " " + gpu.pci_bus_id + (gpu.lost ? " LOST" : "");
    text += ", ECC uncorrected " + number(gpu.ecc_uncorrected_volatile);
    text += ", remap pending " + (gpu.remap_pending ? std::string(*gpu.remap_pending ? "yes" : "no") : "n/a");
    text += ", clocks reasons " + (gpu.clocks_event_reasons ? fmt::format("{:#x}", *gpu.clocks_event_reasons) : "n/a");
    text += ", PCIe Gen" + number(gpu.pcie_generation) + " x" + number(gpu.pcie_width) + " (max Gen" +
            number(gpu.pcie_max_generation) + " x" + number(gpu.pcie_max_width) + ")";
    text += ", NVLink " + std::to_string(gpu.nvlinks_up) + "/" + std::to_string(gpu.nvlinks) + " up";
    return text;
  }

  void CheckDirectories() {
    const std::pair<const char*, const char*> directories[] = {
        {"checkpoints", "BT_CHECKPOINT_DIR"}, {"loaded ckpts", "BT_LOAD_CHECKPOINT_DIR"}, {"project cache", "BT_PROJECT_CACHE_DIR"},
        {"team cache", "BT_TEAM_CACHE_DIR"},  {"scratch", "BT_SCRATCH_DIR"},               {"workspace", "BT_WORKING_DIR"}};
    for (const auto& [check, variable] : directories) {
      auto it = environment_.variables.find(variable);
      if (it == environment_.variables.end() || it->second.empty()) continue;
      CheckWritable(check, it->second, std::string(variable) + ": ");
    }
  }

  // Where `path` would be written: the directory itself, or the folder it would be created in.
  void CheckWritable(const std::string& check, const std::string& path, const std::string& fix_prefix) {
    const fs::path existing = ExistingAncestor(path);
    std::error_code error;
    const bool exists = existing == fs::path(path);
    const std::string where = path + (exists ? "" : " (to be created in " + existing.string() + ")");
    if (!fs::is_directory(existing, error)) {
      Add(check, Verdict::kFail, where + ": " + existing.string() + " is not a directory", fix_prefix + "point it at a directory");
      return;
    }
    if (auto failure = CannotWriteIn(existing)) {
      Add(check, Verdict::kFail, where + ": not writable: " + *failure,
          fix_prefix + "mount it read-write for this user, or point the variable elsewhere");
      return;
    }
    struct statvfs space {};
    statvfs(existing.c_str(), &space);
    const uint64_t free_bytes = uint64_t(space.f_bavail) * space.f_frsize;
    const std::string detail = where + ": writable, " + storage::FormatBytes(free_bytes) + " free";
    if (free_bytes < kMinFreeBytes) {
      Add(check, Verdict::kWarn, detail, fix_prefix + "free space or a bigger volume: writes will fail with ENOSPC");
      return;
    }
    Add(check, Verdict::kOk, detail);
  }

  // The destination is reached the way the uploader reaches it: the file system for file://
  // and spool://, rclone with the job's credentials for object stores (reading <job>/latest).
  void CheckDestination() {
    const auto& runtime = config_.runtime;
    if (!runtime.checkpointing_config.enabled && !runtime.load_checkpoint_config.enabled) {
      Add("destination", Verdict::kSkip, "checkpointing is off");
      return;
    }
    storage::DestinationSpec spec;
    try {
      spec = ResolveCheckpointDestination(config_, environment_, cli_.root);
    } catch (const LaunchFailure& failure) {
      Add("destination", Verdict::kFail, failure.what(), "correct the destination or its auth secret");
      return;
    }
    if (spec.scheme == "file" || spec.scheme == "spool") {
      CheckWritable("destination", spec.location, spec.uri + ": ");
      return;
    }
    const auto started = std::chrono::steady_clock::now();
    try {
      auto destination = storage::OpenDestination(spec);
      auto latest = destination->ReadText(environment_.variables.at("BT_TRAINING_JOB_ID") + "/latest");
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      char took[32];
      std::snprintf(took, sizeof took, " in %.1f s", seconds);
      Add("destination", Verdict::kOk, spec.uri + " reachable through rclone" + took +
                                           (latest ? ", this job's latest: " + *latest : ", no checkpoint of this job yet"));
    } catch (const std::exception& error) {
      Add("destination", Verdict::kFail, spec.uri + ": " + error.what(),
          "check the endpoint, the bucket and the credentials (launcher.checkpoint.auth_secret_name or AWS_* variables)");
    }
  }

  const CliOptions& cli_;
  std::vector<Finding> findings_;
  env::JobConfig config_;
  env::NodeIdentity identity_;
  env::JobEnvironment environment_;
  std::optional<RendezvousEndpoint> endpoint_;
  std::optional<FabricResult> fabric_;
  std::optional<std::string> fabric_failure_;
  bool token_checked_ = false;
  bool rdma_ = false;
};

}  // namespace

std::string FormatFindings(const std::vector<Finding>& findings, bool json) {
  int failed = 0;
  for (const auto& finding : findings) failed += finding.verdict == Verdict::kFail;
  if (json) {
    nlohmann::json out = {{"findings", nlohmann::json::array()}, {"failed", failed}};
    for (const auto& finding : findings) {
      out["findings"].push_back({{"check", finding.check}, {"verdict", VerdictName(finding.verdict)},
                                 {"detail", finding.detail}, {"fix", finding.fix}});
    }
    return out.dump(2) + "\n";
  }
  std::string text;
  char line[64];
  for (const auto& finding : findings) {
    std::snprintf(line, sizeof line, "%-13s %-5s ", finding.check.c_str(), VerdictName(finding.verdict));
    text += line + finding.detail + "\n";
    if (!finding.fix.empty()) text += std::string(20, ' ') + "fix: " + finding.fix + "\n";
  }
  text += failed == 0 ? "no check failed\n" : std::to_string(failed) + " check(s) failed\n";
  return text;
}

int DoctorSubcommand(const CliOptions& cli) {
  const std::vector<Finding> findings = Doctor(cli).Run();
  const std::string text = FormatFindings(findings, cli.output_format == "json");
  std::fwrite(text.data(), 1, text.size(), stdout);
  for (const auto& finding : findings) {
    if (finding.verdict == Verdict::kFail) return 1;
  }
  return 0;
}

}  // namespace bt::launcher
