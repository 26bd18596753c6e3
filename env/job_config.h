// The job config: a JSON document shaped like the platform's TrainingJob, plus a
// top-level "launcher" object for settings only bt-launch reads. Parsing is strict,
// as the platform's own schema is: every error names the JSON path it is about.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace bt::env {

// A config that cannot be used. `path` is the JSON path ("runtime.start_commands[2]"),
// `what()` is "path: expectation".
class ConfigError : public std::runtime_error {
 public:
  ConfigError(std::string path, const std::string& expectation);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A value of runtime.environment_variables: a literal, or the name of a secret.
struct EnvValue {
  std::string literal;
  std::optional<std::string> secret_name;
};

struct Accelerator {
  std::string type;  // "H100", or empty for a bare count
  int count = 0;
};

struct Compute {
  int node_count = 1;
  bool node_count_given = false;  // written in the config: then the identity must agree with it
  int cpu_count = 1;
  std::string memory = "2Gi";
  std::optional<Accelerator> accelerator;
  std::string availability_model = "dedicated";
};

struct CacheConfig {
  bool enabled = false;
  bool enable_legacy_hf_mount = false;
  bool require_cache_affinity = true;
  std::optional<std::string> mount_base_path;  // default /root/.cache
};

struct CheckpointingConfig {
  bool enabled = false;
  std::optional<std::string> checkpoint_path;  // default /mnt/ckpts
  std::optional<int> volume_size_gib;
};

// One entry of load_checkpoint_config.checkpoints: which job's checkpoint to load.
struct CheckpointReference {
  enum class Kind { kLatest, kNamed } kind = Kind::kLatest;
  std::string job_id;
  std::optional<std::string> checkpoint_name;  // kNamed only
  std::string config_path;                     // "runtime.load_checkpoint_config.checkpoints[0]"
};

struct LoadCheckpointConfig {
  bool enabled = false;
  std::optional<std::string> download_folder;  // default /tmp/loaded_checkpoints
  std::vector<CheckpointReference> checkpoints;
};

struct WeightsSource {
  std::string source;
  std::string mount_location;
  std::optional<std::string> auth_secret_name;
  std::vector<std::string> allow_patterns;
  std::vector<std::string> ignore_patterns;
};

struct Runtime {
  std::vector<std::string> start_commands;
  std::map<std::string, EnvValue> environment_variables;
  CacheConfig cache_config;
  CheckpointingConfig checkpointing_config;
  LoadCheckpointConfig load_checkpoint_config;
};

enum class RendezvousBackend { kTcp, kMpi };

struct RendezvousSettings {
  static constexpr uint16_t kDefaultPort = 29300;
  uint16_t port = kDefaultPort;
  int join_timeout_s = 900;
  double heartbeat_interval_s = 1.0;
  double heartbeat_timeout_s = 10.0;
  int exit_barrier_timeout_s = 300;
  RendezvousBackend backend = RendezvousBackend::kTcp;
};

enum class WatchMode { kAuto, kInotify, kPoll };

// launcher.checkpoint: where complete checkpoints go and how they are recognised.
struct CheckpointSettings {
  std::optional<std::string> destination;       // URI; BT_CHECKPOINT_DESTINATION wins
  std::optional<std::string> auth_secret_name;  // JSON credentials for s3/gs/r2/azure
  double drain_timeout_s = 600;
  std::string marker = ".complete";  // the generic rule's marker file
  double quiet_period_s = 30;        // generic rule without a marker
  double scan_interval_s = 5;        // reconciliation scan, whatever inotify says
  double poll_interval_s = 2;        // the polling fallback's scan interval
  WatchMode watch = WatchMode::kAuto;
};

enum class WeightsMode { kAuto, kStage, kWait };

// launcher.weights: how weights[] mounts are made complete before the first command.
struct WeightsSettings {
  double timeout_s = 1800;
  // auto: stage file:// and object-store sources when the mount is absent or empty, wait for
  // anything else (a platform delivering it); stage / wait force one or the other.
  WeightsMode mode = WeightsMode::kAuto;
};

// launcher.cache: commands that fill the project cache once, on node 0.
struct CacheSeedSettings {
  std::vector<std::string> seed_commands;
  std::optional<std::string> seed_key;  // changes the key: forces a re-seed
  double lease_s = 60;
};

enum class FabricRequirement { kAuto, kIb, kAny, kNone };
enum class FabricProbe { kOff, kRing, kAllPairs };

// launcher.fabric: what the rendezvous demands of the RDMA fabric, and the opt-in checks.
struct FabricSettings {
  // auto: ib when any node has an ACTIVE InfiniBand port, else any.
  FabricRequirement require = FabricRequirement::kAuto;
  FabricProbe probe = FabricProbe::kOff;
  double probe_timeout_s = 10;
  bool nccl_preflight = false;
  double min_busbw_gbps = 0;      // the preflight's floor; 0 = report only
  int64_t preflight_bytes = 1 << 28;  // all-reduce size per GPU
  double preflight_timeout_s = 120;
};

// Restart in place (launcher.restart): a failed cycle is run again on every node instead
// of ending the job, within a budget node 0 keeps for the whole job.
struct RestartSettings {
  int max_restarts = 0;                 // 0: a failure ends the job (no restart)
  double rejoin_timeout_s = 600;        // how long the nodes wait for each other between cycles
  int max_cycles_without_progress = 3;  // cycles in a row without a new committed checkpoint
  // Cycle failures blamed on one node after which its rank moves to a hot spare (when one is
  // ready): a node that fails every cycle though its health reads fine.
  int max_failures_per_node = 2;
};

// launcher.watchdog: when a job that neither exits nor makes progress is called hung.
struct WatchdogSettings {
  // nullopt: "auto", the larger of auto_min_s and 5x the longest gap between progress seen
  // in the cycle; 0: no stall check.
  std::optional<double> stall_timeout_s;
  double auto_min_s = 900;
  double startup_timeout_s = 3600;  // before the cycle's first progress; 0: none
  double stack_timeout_s = 20;      // how long the stacks of a hung job are waited for
  std::string report_dir;           // "": <BT_SCRATCH_DIR>/bt-launch
  bool enabled() const { return !stall_timeout_s || *stall_timeout_s > 0 || startup_timeout_s > 0; }
};

// launcher.health (docs/HEALTH.md): the node's GPUs (NVML, loaded at run time) and the NIC
// ports the fabric plan uses, read before the first command and while the job runs.
enum class HealthMode { kAuto, kOn, kOff };  // auto: on when NVML loads; on: a node without it fails
enum class OnUnhealthy { kLeave, kWarn };    // a fatal finding: the node leaves (exit 75), or it is only logged
struct HealthSettings {
  HealthMode mode = HealthMode::kAuto;
  double interval_s = 10;
  std::optional<int> expect_gpus;  // nullopt: "auto" (NVIDIA_VISIBLE_DEVICES, CUDA_VISIBLE_DEVICES, NPROC_PER_NODE)
  OnUnhealthy on_unhealthy = OnUnhealthy::kLeave;
};

// launcher.progress (docs/GOODPUT.md): where the job's step numbers come from for the goodput
// report's step figures (BT_HEARTBEAT_FILE always; the job's output when step_pattern is set),
// and when a node's steps make it a straggler.
struct ProgressSettings {
  std::string step_pattern;     // "": none; else an ECMAScript regex with exactly one group, the step
  double straggler_ratio = 1.2;  // a node whose median step time exceeds the others' by more
};

// How many ports after launcher.master_port the restart cycles' MASTER_PORT walks through
// (a port the launcher chose; one the job's environment sets stays).
inline constexpr int kMasterPortCycles = 16;

// launcher.metrics (docs/GOODPUT.md): Prometheus text on /metrics, off without a port.
struct MetricsSettings {
  uint16_t port = 0;  // 0: off; BT_METRICS_PORT overrides it
};

struct LauncherSettings {
  std::optional<std::string> job_id;
  std::optional<std::string> project_id;
  std::optional<std::string> project_name;
  double grace_period_s = 30;
  double peer_failure_grace_s = 5;  // instead of grace_period_s when another node failed
  uint16_t master_port = 29500;
  RendezvousSettings rendezvous;
  CheckpointSettings checkpoint;
  WeightsSettings weights;
  CacheSeedSettings cache;
  FabricSettings fabric;
  RestartSettings restart;
  WatchdogSettings watchdog;
  HealthSettings health;
  ProgressSettings progress;
  MetricsSettings metrics;
  // Hot spares (docs/SPARES.md): launchers beyond compute.node_count, slots node_count...,
  // prepared as the others are, that take a leaving node's training rank.
  int spares = 0;
};

struct JobConfig {
  std::optional<std::string> name;
  std::string base_image;
  Compute compute;
  Runtime runtime;
  std::vector<WeightsSource> weights;
  bool enable_baseten_workdir = true;
  LauncherSettings launcher;
  std::string source_digest;  // hex digest of the config text; names an unnamed local job
  bool is_embedded_default = false;  // no config given: the node count comes from the identity
};

// Parses and validates JSON text. `require_start_command` is false when the command
// comes from the command line (`run -- CMD`).
JobConfig ParseJobConfig(const std::string& json_text, bool require_start_command);

// A job id is joined into every checkpoint path (<destination>/<job_id>/..., the spool's
// record names): it must be one path component, not "..", "." or hidden, and carry no NUL;
// and UTF-8 text, as the JSON records that name it (manifest, journal, spool) must be.
// Throws ConfigError naming `origin` (the variable, flag or config field it came from).
void ValidateJobId(const std::string& job_id, const std::string& origin);

// The config the launcher uses when none is given: one node, no commands.
JobConfig DefaultJobConfig();

// Loads from `--config FILE`, else from BT_JOB_CONFIG (a path or inline JSON), else the
// embedded default. A file that cannot be read is a ConfigError naming the file.
JobConfig LoadJobConfig(const std::optional<std::string>& config_flag,
                        const char* bt_job_config_env, bool require_start_command);

}  // namespace bt::env
