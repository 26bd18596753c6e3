// The hang watchdog (launcher.watchdog, docs/RUNNING.md "Hangs"): each node watches its
// job's progress (output, BT_HEARTBEAT_FILE, new checkpoints); a node whose job made none
// within the limit tells node 0, every node then sends the stacks of its job's processes,
// and node 0 writes the report, names the odd rank and fails the cycle as a hang, which
// restarts or ends the job like any failure. A single node does all of it alone.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "env/environment.h"
#include "env/job_config.h"
#include "launcher/supervision/peers.h"
#include "launcher/watchdog/flight_recorder.h"
#include "launcher/watchdog/output_files.h"
#include "launcher/watchdog/progress.h"

namespace bt::launcher::watchdog {

// Where a node keeps what the watchdog needs: report_dir (launcher.watchdog.report_dir,
// else <BT_SCRATCH_DIR>/bt-launch) holds node 0's hang reports, and
// <job id>/node-<rank>/ this launcher's heartbeat file, Python stack dumps and NCCL
// flight-recorder dumps. Jobs and launchers may share report_dir (a shared volume, local
// runs of one config): each launcher claims a node folder of its own (ArmJobEnvironment),
// so no job sees another's heartbeat, stacks or processes.
struct WatchdogPaths {
  std::filesystem::path report_dir;
  std::filesystem::path node_dir;  // <report_dir>/<job id>/node-<rank>[.<n>], claimed by this launcher
  std::filesystem::path heartbeat_file;
  std::filesystem::path python_hook_dir;
  std::filesystem::path stack_dir;
  std::filesystem::path nccl_trace_dir;
  FlightRecorderFiles flight_recorder;  // under nccl_trace_dir, unless the job chose its own
  std::filesystem::path checkpoint_dir;  // BT_CHECKPOINT_DIR when checkpointing is on: a new checkpoint is progress
};
WatchdogPaths PathsFor(const env::WatchdogSettings& settings, const env::JobEnvironment& environment, int rank);
// launcher.watchdog.report_dir, else <BT_SCRATCH_DIR>/bt-launch: node 0's hang reports and the
// job's goodput report (launcher/phases/job_report.h).
std::filesystem::path ReportDir(const env::WatchdogSettings& settings, const env::JobEnvironment& environment);

// The job's side of the watch: BT_HEARTBEAT_FILE, the Python stack hook (PYTHONPATH,
// BT_STACK_DIR, BT_STACK_SIGNAL) and PyTorch's NCCL flight recorder, each unless the user
// set it. First it claims the node folder for this launcher (a lock held until it exits):
// when another live launcher holds node-<rank>, the next free node-<rank>.<n> is used.
// Creates the directories; throws std::runtime_error naming a path it cannot write.
// `paths` then names what the job will use: a BT_HEARTBEAT_FILE or flight-recorder files
// the user set are the ones watched, asked for and reported.
void ArmJobEnvironment(WatchdogPaths& paths, env::JobEnvironment& environment);

// The limit in force once the startup window is over (Watchdog::StartupOver: the first
// heartbeat or checkpoint, else startup_timeout_s after the start): without any progress,
// startup_timeout_s; after it, the configured stall_timeout_s, or with "auto" the larger of
// auto_min_s and 5x the longest gap between progress seen so far. 0: no limit now.
double StallLimitSeconds(const env::WatchdogSettings& settings, bool progress_seen, double longest_gap_s);

struct WatchdogNode {
  int rank = 0;
  int node_count = 1;
  std::string host;
};

class Watchdog final : public StopRequests {
 public:
  using Clock = std::chrono::steady_clock;

  // `peers`: null for a single node, or a backend that does not share hangs (each node then
  // judges its own job). `progress` is fed by the output relay and the checkpoint watcher.
  Watchdog(const env::WatchdogSettings& settings, WatchdogPaths paths, WatchdogNode node, Peers* peers,
           Progress& progress);
  ~Watchdog() override;
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // The watch of one cycle's job: from its start to its end (then, with peers, only the
  // answer to a stack request of that cycle, until the next cycle or the end).
  void BeginCycle(int64_t cycle);
  void EndCycle();
  // Node 0 running no rank (it moved to a spare) in `cycle`: it has no job to watch or stacks
  // to send (its answer would count as a rank's), but it gathers the others' and calls the hang.
  void GatherOnly(int64_t cycle);
  // Whether this node's watchdog stopped the job of the cycle that just ended as hung (a
  // node alone; with peers the hang reaches every node as the cycle's failure).
  bool StoppedAsHung() const;

  // Told when this node calls a cycle hung (node 0, or a node alone): when the job's last
  // progress was, and now. For the job's report; set before the first cycle.
  using HangCalled = std::function<void(int64_t cycle, Clock::time_point stall_start, Clock::time_point detected)>;
  void OnHangCalled(HangCalled on_hang_called) { on_hang_called_ = std::move(on_hang_called); }
  // Told what the heartbeat file holds each time the watch sees it change (once a second,
  // the watch's thread), with its modification time on this host's clock: the job's step
  // numbers for the report. Set before the first cycle.
  using HeartbeatSeen = std::function<void(const std::string& contents, int64_t modified_ns)>;
  void OnHeartbeat(HeartbeatSeen on_heartbeat) { on_heartbeat_ = std::move(on_heartbeat); }

  // The job's own descriptions of the files that are its stdout and stderr (the
  // supervisor spawns the job with them); what it writes there is progress.
  const OutputFiles& output_files() const { return output_files_; }

  // StopRequests: readable once a node alone has found its job hung, and when the cycle's
  // first stall check falls due: the watch's thread starts then (in TakeStop, on the
  // supervisor's thread), so that a job that ends sooner (`run -- /bin/true`) costs no
  // thread, no join and no stale-marker pass.
  int fd() const override { return wake_fd_; }
  std::optional<std::string> TakeStop() override;

 private:
  // What the watch does between the cycles' calls (only the supervisor's thread changes it).
  enum class Phase { kIdle, kWatching, kAnswering };

  // The watch of a running job (`watching`, quiet since `since`), or, after it ended, only
  // the answer to a stack request of its cycle (and node 0's gathering).
  void Watch(int64_t cycle, bool watching, Clock::time_point since);
  void StartThreadIfNeeded();
  void StartThread(int64_t cycle, bool watching);
  void StopThread();
  void WakeSupervisorIn(Clock::duration delay);
  bool HasStackRequest();
  void OnStall(int64_t cycle, double quiet_s, double limit_s);
  void AnswerStackRequest(int64_t cycle, bool finished);
  void GatherAndDeclare(int64_t cycle, int stalled_rank, Clock::time_point asked);
  void TellHangCalled(int64_t cycle, Clock::time_point asked, double quiet_s);
  std::string NodeAnswer(double quiet_s);
  bool LookForProgress();
  bool StartupOver(bool job_says_it_runs, double elapsed_s) const;
  bool Stopping();

  env::WatchdogSettings settings_;
  WatchdogPaths paths_;
  WatchdogNode node_;
  Peers* peers_;
  Progress& progress_;
  int wake_fd_ = -1;  // a timerfd: the first check's time, or at once for a stop (fd())
  Phase phase_ = Phase::kIdle;
  std::atomic<bool> answers_{true};  // GatherOnly: false for the cycle
  Clock::time_point cycle_start_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::optional<rendezvous::PeerEvent> stack_request_;
  std::optional<std::string> stop_;
  bool stop_taken_ = false;
  bool hung_ = false;
  std::thread thread_;
  int64_t cycle_ = 0;
  // The heartbeat file and the checkpoint directory, with the modification time last seen:
  // a change is progress.
  std::vector<std::pair<std::filesystem::path, std::optional<int64_t>>> touched_paths_;
  // The job's stdout and stderr where they are files, not relayed: what it appends is progress.
  OutputFiles output_files_;
  // The previous hang's place (node 0): a hang at the same place in a later cycle is named.
  std::optional<std::pair<int64_t, std::string>> last_hang_;
  HangCalled on_hang_called_;
  HeartbeatSeen on_heartbeat_;
};

}  // namespace bt::launcher::watchdog
