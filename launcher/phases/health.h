// The health phase (docs/HEALTH.md): this node's GPUs (NVML, loaded at run time) and the
// InfiniBand/RoCE ports the fabric plan uses, read before the first command (every node's
// findings in one table on node 0) and while the job runs (Xid events as they arrive, a
// sample every launcher.health.interval_s). A fatal finding keeps the node from training:
// before the start it fails the launch, during the run it stops the job, and the node leaves
// the job (exit 75) instead of restarting on the same bad hardware.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "env/environment.h"
#include "env/identity.h"
#include "env/job_config.h"
#include "launcher/health/findings.h"
#include "launcher/health/nvml.h"
#include "launcher/health/ports.h"
#include "launcher/health/xid.h"
#include "launcher/supervision/peers.h"
#include "launcher/supervision/supervisor.h"

namespace bt::launcher {

// launcher.health.expect_gpus: the number given, or "auto": the devices named by
// NVIDIA_VISIBLE_DEVICES or CUDA_VISIBLE_DEVICES (a list; "all", "none", "void" or UUIDs say
// nothing countable but the list length), else NPROC_PER_NODE; nullopt when none says.
std::optional<unsigned> ExpectedGpus(const env::HealthSettings& settings, const env::JobEnvironment& environment);

// This node's sources of findings. NVML is optional under "auto" (the GPU checks are then
// SKIPPED, said once); the ports are those the fabric plan gave NCCL.
class NodeHealth {
 public:
  // nullptr when launcher.health.enabled is false. Throws LaunchFailure(75) when it is true
  // and NVML cannot be loaded: the user asked for GPU health and the node cannot give it.
  static std::unique_ptr<NodeHealth> Open(const env::HealthSettings& settings, const env::JobEnvironment& environment,
                                          const std::string& sysfs_root);
  ~NodeHealth();

  // The ports to read from now on (after the fabric phase); their counters now are the baseline.
  void WatchPorts(std::vector<health::UsedPort> ports);
  // One reading of every GPU and watched port: a port counter warns once per growth.
  std::vector<health::Finding> Sample();
  // Registers for Xid events (once); null without NVML or its event functions.
  health::XidReader* Xids();
  const env::HealthSettings& settings() const { return settings_; }
  bool gpus_checked() const { return nvml_ != nullptr; }
  // Whether any check can run here (NVML loaded, or ports to read).
  bool checks_anything();

 private:
  NodeHealth(env::HealthSettings settings, std::optional<unsigned> expected, std::string sysfs_root,
             std::unique_ptr<health::Nvml> nvml);

  env::HealthSettings settings_;
  std::optional<unsigned> expected_gpus_;
  std::string sysfs_root_;
  std::unique_ptr<health::Nvml> nvml_;
  std::unique_ptr<health::XidReader> xids_;
  bool xids_opened_ = false;
  std::mutex ports_mutex_;
  std::vector<health::PortCounters> port_baseline_;
};

// The fatal findings, one per line ("GPU 3 (GPU-…, 0000:3b:00.0): Xid 79: … = …; fix: …").
std::string DescribeFatal(const std::vector<health::Finding>& findings);

// Before the first command: this node's findings are logged and published; node 0 prints
// every node's in one table (as it does the fabric's mismatches). Throws LaunchFailure(75)
// naming this node's fatal findings when launcher.health.on_unhealthy is "leave" (after node
// 0 read them, or 5 s). With hot spares (launcher.spares), returns who runs which rank from
// the first cycle (the slot of each rank): node 0 gives an unhealthy node's rank to a
// healthy spare, and that node then runs nothing and leaves once every node is ready.
struct StartHealth {
  std::optional<std::vector<int>> ranks;  // the slot of each rank (nullopt: no spares)
  bool cannot_train = false;              // this node's rank moved away (or it is a spare): it leaves
};
StartHealth CheckHealthBeforeStart(const env::JobConfig& config, const env::NodeIdentity& identity, Peers* peers,
                                   NodeHealth& health);

// While the job runs: Xid events and a sample every interval_s on a thread of its own. A
// fatal finding (with on_unhealthy "leave") makes fd() readable: the supervisor stops the
// job with TakeStop()'s reason, naming the GPU, and the node leaves (Unhealthy()).
class HealthWatch final : public StopRequests {
 public:
  HealthWatch(NodeHealth& health, int rank);
  ~HealthWatch() override;
  HealthWatch(const HealthWatch&) = delete;
  HealthWatch& operator=(const HealthWatch&) = delete;

  int fd() const override { return wake_fd_; }
  std::optional<std::string> TakeStop() override;
  // Reads the node's health again now (after a failed cycle, before the restart): a fatal
  // finding counts as one the thread found.
  void Recheck();
  // The fatal findings seen so far; empty while the node is healthy (or on_unhealthy "warn").
  std::vector<health::Finding> Fatal() const;
  // Distinct findings seen so far, by severity (live metrics).
  struct Counts {
    size_t fatal = 0;
    size_t warning = 0;
  };
  Counts Seen() const;

 private:
  void Run();
  void Take(const std::vector<health::Finding>& findings);

  NodeHealth& health_;
  int rank_;
  int wake_fd_ = -1;
  std::atomic<bool> stopping_{false};
  mutable std::mutex mutex_;
  std::vector<health::Finding> fatal_;
  std::vector<std::string> warned_;  // warnings logged once each
  Counts seen_;
  bool stop_taken_ = false;
  std::thread thread_;
};

}  // namespace bt::launcher
