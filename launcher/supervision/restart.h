// Restart in place (launcher.restart, DESIGN.md §1.9): node 0's budget decides whether a
// failed cycle is run again, and every node runs the cycles the leader pushes: stop the
// job, load what the cycle resumes from, meet the others at the cycle's barrier, start
// the commands again.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "env/environment.h"
#include "env/job_config.h"
#include "launcher/supervision/peers.h"
#include "launcher/supervision/signals.h"
#include "launcher/supervision/supervisor.h"
#include "rendezvous/cycles.h"
#include "storage/commit_record.h"

namespace bt::launcher {

// Node 0's knowledge of the job's newest commit: the record `latest` named when the job
// started, then each commit its own agent wrote and pointed `latest` at. Node 0 is the only
// writer of `latest`, so this is what the destination says, known without reading it: the
// restart decision runs on the rendezvous server's thread, where a slow or failing read
// would stop every heartbeat (and a failed one used to restart every node from scratch).
// Written by the launcher's and the agent's threads, read by the server's.
class CommittedCheckpoints {
 public:
  // What the job started from (nullopt: nothing committed yet).
  void Started(std::optional<storage::CommitRecord> record);
  // The agent made `record` the job's `latest`.
  void Committed(const storage::CommitRecord& record);
  std::optional<storage::CommitRecord> AtStart() const;
  std::optional<storage::CommitRecord> Latest() const;
  // Run before each decision reads Latest(): node 0 stops the failed cycle's saves from
  // committing (checkpoint::CommitGate), so nothing older commits after the decision; it
  // returns the commit still on its way, which `latest` is about to name (nullopt: none).
  void SealBeforeDecision(std::function<std::optional<storage::CommitRecord>()> seal) { seal_ = std::move(seal); }
  // `remote`: what a checkpoint leader on a spare (rank 0 moved) committed, read by the
  // server as it sealed the failed cycle; it is newer than anything node 0's own agent
  // committed, which stopped committing when rank 0 left node 0.
  std::optional<storage::CommitRecord> LatestForDecision(const rendezvous::RemoteCommits& remote = {}) const;

 private:
  mutable std::mutex mutex_;
  std::optional<storage::CommitRecord> at_start_;
  std::optional<storage::CommitRecord> latest_;
  std::function<std::optional<storage::CommitRecord>()> seal_;
};

// One commit, whatever its name: two saves under one name (a job that writes `state.pt`
// every cycle) are two commits, told apart by their parts' versions.
bool SameCommit(const std::optional<storage::CommitRecord>& a, const std::optional<storage::CommitRecord>& b);

// What node 0 answers a failure with. `committed` is null when checkpointing is off: then no
// cycle resumes from a checkpoint or is judged by its progress. Runs on the leader's server
// thread: no storage I/O.
rendezvous::RestartPolicy MakeRestartPolicy(const env::RestartSettings& settings,
                                            std::shared_ptr<const CommittedCheckpoints> committed);

// The commit record a restart's decision names (its "commit" field): what every node loads
// for the cycle, exactly, whatever commits after the decision. nullopt when it names none
// (nothing committed yet). Throws LaunchFailure(70) when the field is not a record.
std::optional<storage::CommitRecord> ResumeCommitOf(const rendezvous::Message& decision);

// One restart as this node lived it, for the end-of-job timeline.
struct CycleRecord {
  int64_t cycle = 0;
  std::string cause;  // the leader's line naming the failed node, its host and how it failed
  std::string resume;  // the checkpoint the cycle starts from ("" for none)
  std::optional<storage::CommitRecord> resume_commit;  // exactly which versions of it
  double decided_in_s = -1;  // how long the leader took to decide (negative: not said)
  int restarts_used = 0;
  int max_restarts = 0;
  std::chrono::steady_clock::time_point stopped;    // this node's job of the failed cycle was gone
  std::chrono::steady_clock::time_point all_ready;  // the leader's go: every node stopped and ready
  // The leader's figures from its decision (the fault, as it learnt of it): every node's job
  // gone, and every node ready to start again; negative when the cycle never started.
  double every_job_stopped_s = -1;
  double every_node_restarted_s = -1;
  std::string lost_ranks;  // ranks whose launcher was lost: not in every_job_stopped_s
  // The failure that ended the cycle before it: the failed node (its slot), its host, its
  // exit code (0: its launcher was lost), and when this node learnt of it.
  int failed_node = -1;
  std::string failed_host;
  int failed_exit_code = 0;
  std::chrono::steady_clock::time_point fault{};
};

// "cycle 1 (node 2 (host, addr) failed: exit code 1): fault → decided 0.1 ms → every job
// stopped 40.1 ms → every node restarted 52.0 ms (this node: stopped → all ready 12.0 ms),
// resumed from ckpt-4, restarts 1/3" for each restart, "" when none.
std::string RenderCycles(const std::vector<CycleRecord>& cycles);

using env::kMasterPortCycles;

// The cycle's environment: BT_RESTART_COUNT and TORCHELASTIC_RESTART_COUNT, the checkpoint
// it resumes from, and (where the launcher chose it) a MASTER_PORT of its own, so that a
// store torchrun left in TIME_WAIT never holds the next cycle's port. `training_rank`
// (BT_NODE_RANK, and NODE_RANK where the launcher set it) is the launcher's slot unless a
// spare took another node's rank; `master_addr` (MASTER_ADDR where the launcher set it) the
// node running training rank 0 when that is not node 0 (Peers::MasterAddress).
std::vector<std::string> CycleEnviron(const env::JobEnvironment& environment, const env::JobConfig& config, int64_t cycle,
                                      const std::string& resume, std::optional<int> training_rank = std::nullopt,
                                      const std::optional<std::string>& master_addr = std::nullopt);

struct CycleHooks {
  // Runs one cycle's start commands (a fresh supervisor each time).
  std::function<JobOutcome(int64_t cycle, const std::string& resume)> run;
  // Loads `commit` (this job's, as the leader's decision names it) for the next cycle;
  // throws LaunchFailure. `check_stop` runs at least once a second and throws to end it.
  std::function<void(const storage::CommitRecord& commit, const std::function<void()>& check_stop)> load_resume;
  // What the job's first cycle loaded when nothing of its own was committed yet
  // (runtime.load_checkpoint_config): a launcher that replaced a lost one loads it before
  // its first cycle, as the others did before theirs. Throws LaunchFailure.
  std::function<void(const std::function<void()>& check_stop)> load_start;
  // Before this node meets the others at a restart's barrier: why it leaves the job instead
  // (its hardware cannot train, launcher.health), or nullopt. May be empty.
  std::function<std::optional<std::string>()> leave;
  // Node 0 decided a restart into `cycle` (before this node meets the others): the saves of
  // the cycles before it are sealed, whether or not `cycle` ever begins. May be empty.
  std::function<void(int64_t cycle)> restart_decided;
  // A spare was given training rank `rank` from `cycle` on (launcher.spares): what it loads,
  // saves and runs from now on is that rank's. Throws LaunchFailure. May be empty.
  std::function<void(int rank, int64_t cycle)> promote;
  // A restart's decision reached this node (its record as the timeline shows it): the cycle,
  // the restarts used. May be empty.
  std::function<void(const CycleRecord& record)> restart_known;
  // Node 0, whose rank the restart into `cycle` moved to a spare: it stays (it serves the
  // store and decides restarts) and hands the commit of checkpoints over to the node running
  // rank 0 now; from then on its cycles run no command. May be empty.
  std::function<void(int64_t cycle)> hand_over;
};

// Runs cycle after cycle until one ends the job, and returns that cycle's outcome (already
// reported to the leader when restarts are on). Without peers or restarts: one cycle, as
// before. `first_resume` is what cycle 0 resumes from; `rejoin` (Peers::TakeRejoin), when
// this launcher replaced a lost one, the cycle it starts in instead.
JobOutcome RunCycles(const env::JobConfig& config, Peers* peers, SignalRouter& signals, const CycleHooks& hooks,
                     const std::string& first_resume, std::optional<rendezvous::PeerEvent> rejoin,
                     std::vector<CycleRecord>& cycles);

}  // namespace bt::launcher
