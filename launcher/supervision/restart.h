// Restart in place (launcher.restart, DESIGN.md §1.9): node 0's budget decides whether a
// failed cycle is run again, and every node runs the cycles the leader pushes: stop the
// job, load what the cycle resumes from, meet the others at the cycle's barrier, start
// the commands again.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "env/environment.h"
#include "env/job_config.h"
#include "launcher/supervision/peers.h"
#include "launcher/supervision/signals.h"
#include "launcher/supervision/supervisor.h"
#include "rendezvous/cycles.h"

namespace bt::launcher {

// What node 0 answers a failure with. `latest_committed` reads the job's `latest` pointer
// (nullopt when checkpointing is off: then no cycle is judged by its progress). Runs on
// the leader's server thread.
rendezvous::RestartPolicy MakeRestartPolicy(const env::RestartSettings& settings,
                                            std::function<std::optional<std::string>()> latest_committed);

// One restart as this node lived it, for the end-of-job timeline.
struct CycleRecord {
  int64_t cycle = 0;
  std::string cause;  // the leader's line naming the failed node, its host and how it failed
  std::string resume;  // the checkpoint the cycle starts from ("" for none)
  int restarts_used = 0;
  int max_restarts = 0;
  std::chrono::steady_clock::time_point stopped;    // this node's job of the failed cycle was gone
  std::chrono::steady_clock::time_point all_ready;  // the leader's go: every node stopped and ready
  // The leader's figures from its decision (the fault, as it learnt of it): every node's job
  // gone, and every node ready to start again; negative when the cycle never started.
  double every_job_stopped_s = -1;
  double every_node_restarted_s = -1;
  std::string lost_ranks;  // ranks whose launcher was lost: not in every_job_stopped_s
};

// "cycle 1 (node 2 (host, addr) failed: exit code 1): fault → every job stopped 40.1 ms →
// every node restarted 52.0 ms (this node: stopped → all ready 12.0 ms), resumed from ckpt-4,
// restarts 1/3" for each restart, "" when none.
std::string RenderCycles(const std::vector<CycleRecord>& cycles);

// How many ports after launcher.master_port the cycles' MASTER_PORT walks through.
inline constexpr int kMasterPortCycles = 16;

// The cycle's environment: BT_RESTART_COUNT and TORCHELASTIC_RESTART_COUNT, the checkpoint
// it resumes from, and (where the launcher chose it) a MASTER_PORT of its own, so that a
// store torchrun left in TIME_WAIT never holds the next cycle's port.
std::vector<std::string> CycleEnviron(const env::JobEnvironment& environment, const env::JobConfig& config, int64_t cycle,
                                      const std::string& resume);

struct CycleHooks {
  // Runs one cycle's start commands (a fresh supervisor each time).
  std::function<JobOutcome(int64_t cycle, const std::string& resume)> run;
  // Loads `name` (this job's committed checkpoint) for the next cycle; throws LaunchFailure.
  std::function<void(const std::string& name)> load_resume;
};

// Runs cycle after cycle until one ends the job, and returns that cycle's outcome (already
// reported to the leader when restarts are on). Without peers or restarts: one cycle, as
// before. `first_resume` is what cycle 0 resumes from; `rejoin` (Peers::TakeRejoin), when
// this launcher replaced a lost one, the cycle it starts in instead.
JobOutcome RunCycles(const env::JobConfig& config, Peers* peers, SignalRouter& signals, const CycleHooks& hooks,
                     const std::string& first_resume, std::optional<rendezvous::PeerEvent> rejoin,
                     std::vector<CycleRecord>& cycles);

}  // namespace bt::launcher
