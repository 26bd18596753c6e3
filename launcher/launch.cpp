#include "launcher/launch.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "launcher/exit_codes.h"
#include "launcher/job.h"
#include "launcher/log.h"
#include "launcher/phases/cache_seed.h"
#include "launcher/phases/checkpoints.h"
#include "launcher/phases/fabric.h"
#include "launcher/phases/health.h"
#include "launcher/phases/job_report.h"
#include "launcher/phases/metrics.h"
#include "launcher/phases/nccl_preflight.h"
#include "launcher/phases/ready.h"
#include "launcher/phases/weights.h"
#include "launcher/supervision/peers.h"
#include "launcher/supervision/restart.h"
#include "launcher/supervision/signals.h"
#include "launcher/supervision/stop_union.h"
#include "launcher/supervision/supervisor.h"
#include "launcher/timeline.h"
#include "launcher/watchdog/watchdog.h"
#include "rendezvous/commit_keys.h"
#include "rendezvous/node_info.h"

namespace bt::launcher {
namespace {

std::vector<Command> CommandsToRun(const CliOptions& cli, const env::JobConfig& config) {
  if (!cli.command.empty()) return {Command{cli.command, true}};
  std::vector<Command> commands;
  for (const auto& text : config.runtime.start_commands) commands.push_back(ShellCommand(text));
  return commands;
}

std::string DescribeOutcome(const JobOutcome& outcome) {
  if (outcome.stop_reason) return "stopped: " + *outcome.stop_reason;
  if (outcome.shutdown_signal) return std::string("stopped by ") + strsignal(*outcome.shutdown_signal);
  return "exit " + std::to_string(outcome.exit_code);
}

// After the rendezvous, before the first command: weights and loaded checkpoints, the
// ready barrier (its deadline is the weights deadline), then the cache seed. A launcher
// that replaced a lost one (`rejoining`) loads nothing here: its first cycle's barrier
// loads what the others run from (RunCycles). `training_rank` is the rank whose parts it
// loads (with hot spares, not always its slot's; none for a spare).
void PrepareNode(const PreparedJob& job, const std::optional<storage::DestinationSpec>& destination,
                 const std::optional<storage::CommitRecord>& resume, std::optional<int> training_rank, bool rejoining,
                 Peers* peers, SignalRouter& signals, Timeline& timeline) {
  const auto ready_deadline = std::chrono::steady_clock::now() +
                              std::chrono::milliseconds(int64_t(job.config.launcher.weights.timeout_s * 1000));
  NodePhase phase(peers, job.identity.rank);
  if (!job.config.weights.empty()) {
    timeline.Begin("weights");
    phase.Publish("preparing weights");
    PrepareWeights(job.config, job.environment,
                   {[&](const std::string& line) { phase.Publish(line); }, [&] { CheckStop(peers, signals); }});
  }
  if (resume && training_rank) {
    // The job's own checkpoint (a retried job) is where training stands: it wins over
    // load_checkpoint_config, which names another job's starting point.
    timeline.Begin("resume");
    phase.Publish("loading checkpoint " + resume->name);
    spdlog::info("resuming from checkpoint {}: this job's destination already holds it as committed (latest){}",
                 resume->name,
                 job.config.runtime.load_checkpoint_config.enabled ? "; runtime.load_checkpoint_config is not loaded" : "");
    LoadOwnCheckpoint(job.environment, *destination, *training_rank, *resume, [&] { CheckStop(peers, signals); });
  } else if (job.config.runtime.load_checkpoint_config.enabled && !rejoining && training_rank) {
    ClearEarlierLoads(job.environment, *training_rank);
    timeline.Begin("load checkpoints");
    phase.Publish("loading checkpoints");
    LoadCheckpoints(job.config, job.environment, *destination, *training_rank, [&] { CheckStop(peers, signals); });
  }
  if (peers) {
    timeline.Begin("ready");
    WaitUntilAllReady(*peers, job.identity, ready_deadline, signals);
  }
  if (job.config.runtime.cache_config.enabled && !job.config.launcher.cache.seed_commands.empty()) {
    timeline.Begin("cache seed");
    SeedCache(job.config, job.environment, job.identity, peers, signals);
  }
}

// The ports the fabric plan gave this node's NCCL: what the health checks read again.
std::vector<health::UsedPort> PortsInUse(const FabricResult& fabric, int rank) {
  const rendezvous::fabric::NodePlan* node = fabric.plan.ForRank(rank);
  if (node == nullptr || !fabric.plan.use_rdma) return {};
  return health::UsedPorts(node->selection, fabric.inventory);
}

// The phases between the rendezvous and the run go through PreRunPeers: a failed peer or a
// lost leader ends any of them at once, and a store failure names the phase it hit.
template <typename Phases>
void BeforeTheRun(Peers* peers, SignalRouter& signals, Timeline& timeline, Phases phases) {
  std::optional<PreRunPeers> pre_run;
  if (peers) pre_run.emplace(*peers, signals);
  Peers* phase_peers = pre_run ? &*pre_run : nullptr;
  NameStoreFailures(timeline, [&] { phases(phase_peers); });
}

// The fabric, then every node's health. Returns who runs which rank from the first cycle
// when hot spares are on (an unhealthy node's rank starts on a spare), and whether this node
// cannot train.
StartHealth CheckFabricAndHealth(PreparedJob& job, std::optional<rendezvous::fabric::Inventory> inventory,
                                 NodeHealth* health, Peers* peers, SignalRouter& signals, Timeline& timeline) {
  StartHealth start;
  BeforeTheRun(peers, signals, timeline, [&](Peers* phase_peers) {
    if (inventory) {
      timeline.Begin("fabric");
      FabricResult fabric = PlanFabricPhase(job.config, job.identity, phase_peers, std::move(*inventory), job.environment);
      if (health) health->WatchPorts(PortsInUse(fabric, job.identity.rank));
    }
    if (health) {
      timeline.Begin("health");
      start = CheckHealthBeforeStart(job.config, job.identity, phase_peers, *health);
    }
  });
  return start;
}

// The NCCL preflight, then what the node runs from (PrepareNode).
void PrepareToRun(PreparedJob& job, const std::optional<storage::DestinationSpec>& destination,
                  const std::optional<storage::CommitRecord>& resume, std::optional<int> training_rank, bool rejoining,
                  Peers* peers, SignalRouter& signals, Timeline& timeline) {
  BeforeTheRun(peers, signals, timeline, [&](Peers* phase_peers) {
    if (job.config.launcher.fabric.nccl_preflight) {
      timeline.Begin("nccl preflight");
      RunNcclPreflight(job.config, job.identity, phase_peers, job.environment, [&] { CheckStop(phase_peers, signals); });
    }
    PrepareNode(job, destination, resume, training_rank, rejoining, phase_peers, signals, timeline);
  });
}

// Node 0 tells its server the job's commands start: from now on a lost launcher is a failed
// cycle that restarts, not a failed start (rendezvous::kRunStartedKey).
void MarkRunStarted(const PreparedJob& job, Peers* peers) {
  if (peers == nullptr || peers->store() == nullptr || job.identity.rank != 0) return;
  if (job.config.launcher.restart.max_restarts == 0) return;
  try {
    peers->store()->Set(rendezvous::kRunStartedKey, "1");
  } catch (const std::runtime_error& error) {
    spdlog::warn("cannot tell the rendezvous server that the run started ({}): a lost node ends the job", error.what());
  }
}

bool UsesCheckpoints(const env::JobConfig& config) {
  return config.runtime.checkpointing_config.enabled || config.runtime.load_checkpoint_config.enabled;
}

// The commit this job resumes from at start: its own `latest` when it checkpoints (the
// platform retried it, Slurm requeued it); none when nothing is committed. Throws
// LaunchFailure(74) when `latest` cannot be read: never a silent start from scratch.
std::optional<storage::CommitRecord> ResumePoint(const PreparedJob& job,
                                                 const std::optional<storage::DestinationSpec>& destination, Peers* peers,
                                                 SignalRouter& signals) {
  if (!destination || !job.config.runtime.checkpointing_config.enabled) return std::nullopt;
  return ReadLatestCommitted(*destination, job.job_id(), [&] { CheckStop(peers, signals); });
}

// Node 0's knowledge of what it committed, for its restart decisions; null where no
// decision is made here, or the job does not checkpoint.
std::shared_ptr<CommittedCheckpoints> CommittedCheckpointsOf(const PreparedJob& job,
                                                             const std::optional<storage::DestinationSpec>& destination) {
  if (job.identity.rank != 0 || job.config.launcher.restart.max_restarts == 0) return nullptr;
  if (!destination || !job.config.runtime.checkpointing_config.enabled) return nullptr;
  return std::make_shared<CommittedCheckpoints>();
}

// How long node 0's restart decision waits, on the rendezvous server's thread, for a commit
// already on its way to be written before it names that commit as it is.
constexpr auto kCommitOnItsWayWait = std::chrono::milliseconds(500);

// How long an agent that stops committing while the job goes on (node 0 whose rank moved, or
// rank 0 leaving a spare's node) writes the commits it had begun: the restart's decision
// named the newest of them, so `latest` should name it too.
constexpr auto kHandOverBound = std::chrono::seconds(10);

// Node 0's answer to a failed cycle (launcher.restart); none when restarts are off.
// The failed cycle is sealed first (`commit_gate`): no save of it commits after the decision
// reads what node 0 committed last.
rendezvous::RestartPolicy RestartPolicyOf(const PreparedJob& job, std::shared_ptr<CommittedCheckpoints> committed,
                                          std::shared_ptr<checkpoint::CommitGate> commit_gate) {
  if (job.identity.rank != 0 || job.config.launcher.restart.max_restarts == 0) return {};
  if (committed) {
    committed->SealBeforeDecision([commit_gate] {
      std::optional<storage::CommitRecord> on_its_way = commit_gate->Seal(kCommitOnItsWayWait);
      if (on_its_way) {
        spdlog::warn("checkpoints: the commit of {} was begun before the restart's decision and is not written yet: "
                     "the decision names it, as `latest` will",
                     on_its_way->name);
      }
      return on_its_way;
    });
  }
  return MakeRestartPolicy(job.config.launcher.restart, std::move(committed));
}

// Whether the job failed because a peer or the rendezvous did (69: node 0 lost, nodes lost
// past rejoin_timeout_s): a part left uncommitted is then that failure's doing, not an I/O
// one, and every node exits with the one code (soak seed 6: node 0 exited 74, the others
// 69). A job's own command that exits 69 is no such failure (review 3, D4).
bool FailedWithItsPeers(Peers* peers, const JobOutcome& outcome, int exit_code) {
  if (peers == nullptr || exit_code != kExitUnavailable) return false;
  return outcome.stop_reason || outcome.launcher_failure || peers->LeaderLost();
}

// Node 0's view of which ranks have no launcher now: a save waiting on one is abandoned at
// once instead of holding every node's drain for drain_timeout_s.
std::function<std::vector<int>()> AbsentRanksOf(Peers* peers) {
  if (peers == nullptr) return nullptr;
  return [peers] { return peers->AbsentRanks(); };
}

// A follower cut off from node 0 can commit nothing: its drain waits only for its own uploads,
// briefly (at most a quarter of rejoin_timeout_s), so that it exits while node 0 still awaits
// its replacement.
checkpoint::LeaderLoss LeaderLossOf(Peers* peers, const env::JobConfig& config) {
  constexpr double kUploadBoundS = 30;
  if (peers == nullptr) return {};
  const double bound_s = std::min({kUploadBoundS, config.launcher.checkpoint.drain_timeout_s,
                                   config.launcher.restart.rejoin_timeout_s / 4});
  return {[peers] { return peers->LeaderLost(); }, std::chrono::milliseconds(int64_t(bound_s * 1000))};
}

// The hang watch of the run (launcher.watchdog): the job's side (heartbeat file, stack
// hook, NCCL flight recorder) goes into its environment; null when it is off.
std::unique_ptr<watchdog::Watchdog> ArmWatchdog(PreparedJob& job, Peers* peers, watchdog::Progress& progress) {
  const env::WatchdogSettings& settings = job.config.launcher.watchdog;
  if (!settings.enabled()) return nullptr;
  if (peers != nullptr && !peers->SharesHangs()) {
    spdlog::info("watchdog: off under the mpi backend with {} nodes: without node 0's store the nodes cannot tell a hang "
                 "from a node that prints nothing by design", job.identity.count);
    return nullptr;
  }
  watchdog::WatchdogPaths paths = watchdog::PathsFor(settings, job.environment, job.identity.rank);
  auto checkpoint_dir = job.environment.variables.find("BT_CHECKPOINT_DIR");
  if (job.config.runtime.checkpointing_config.enabled && checkpoint_dir != job.environment.variables.end()) {
    paths.checkpoint_dir = checkpoint_dir->second;
  }
  try {
    watchdog::ArmJobEnvironment(paths, job.environment);
  } catch (const std::runtime_error& error) {
    throw LaunchFailure(kExitIo, std::string("launcher.watchdog: ") + error.what());
  }
  return std::make_unique<watchdog::Watchdog>(settings, paths,
                                              watchdog::WatchdogNode{job.identity.rank, job.identity.count, rendezvous::HostName()},
                                              peers, progress);
}

// A job the health watch stopped failed by this node's hardware: exit 75, reported with its
// cause (node 0 names the GPU, not whichever rank's collective timed out first), restartable
// elsewhere. Any other failed cycle: the node's health is read again before the failure is
// reported (and the restart decided), so that a bad GPU makes the node leave rather than
// fail again.
void MarkUnhealthy(HealthWatch& health, JobOutcome& outcome) {
  if (outcome.stop_reason && outcome.stop_reason->starts_with("health:")) {
    outcome.cause = std::exchange(outcome.stop_reason, std::nullopt);
    outcome.exit_code = kExitUnhealthy;
    return;
  }
  if (outcome.shutdown_signal || (outcome.exit_code == 0 && !outcome.stop_reason)) return;
  // Stopped because another node failed, too: a GPU that fell off the bus makes this node
  // leave even when a peer's failure reached node 0 first.
  health.Recheck();
  const std::vector<health::Finding> fatal = health.Fatal();
  if (!fatal.empty() && !outcome.stop_reason) outcome.cause = "health: " + DescribeFatal(fatal);
}

// The identity the checkpoint phase works by: training rank `rank` of compute.node_count
// (with launcher.spares a launcher's slot and its rank differ).
env::NodeIdentity TrainingIdentity(const env::NodeIdentity& identity, int rank) {
  env::NodeIdentity training = identity;
  training.rank = rank;
  training.count = identity.training_count();
  training.spares = 0;
  return training;
}

// The training rank this launcher runs (launcher.spares): its slot's, none for a spare
// until the leader gives it one (CycleHooks::promote). Used on the run's thread only.
struct TrainingRole {
  std::optional<int> rank;
  // Node 0 running no rank (it moved to a spare): it keeps serving the store and runs nothing.
  bool keeps_store = false;
};

// What a launcher's checkpoint phase needs beyond the job, for a spare that starts its own
// when it takes a rank.
struct CheckpointStart {
  const std::optional<storage::DestinationSpec>& destination;
  CheckpointPhase& phase;
};

// Where a launcher's job says its step numbers (launcher/phases/job_report.h): its output when
// launcher.progress.step_pattern is set, else BT_HEARTBEAT_FILE (the watchdog's).
struct StepSources {
  std::shared_ptr<report::StepLog> log;
  std::function<void(std::string_view lines)> from_output;  // null: no step_pattern
};

// Node 0 whose rank runs on a spare: no command, but it still decides restarts (its server)
// and gathers the others' stacks for a hang (Watchdog::GatherOnly). Waits, however long, for
// its server's next restart or the job's verdict; `every_slice` reads what the node running
// rank 0 committed meanwhile.
JobOutcome KeepTheStore(int64_t cycle, Peers& peers, watchdog::Watchdog* watch, SignalRouter& signals,
                        report::JobRecorder* recorder, const std::string& resume, const std::function<void()>& every_slice) {
  spdlog::info("cycle {}: this node runs no rank (rank 0 runs on a spare); it keeps serving the rendezvous", cycle);
  if (watch) watch->GatherOnly(cycle);
  if (recorder) recorder->CycleRan(cycle, resume);
  JobOutcome outcome;
  int signal_number = 0;
  const bool restarted = peers.AwaitRestart(signals, signal_number, every_slice);
  if (every_slice) every_slice();  // what the decision ending the cycle resumes from, before its end
  if (recorder) recorder->CycleEnded(cycle);
  if (signal_number != 0) {
    outcome.shutdown_signal = signal_number;
    outcome.exit_code = 128 + signal_number;
  } else if (auto verdict = restarted ? std::nullopt : peers.Verdict()) {
    outcome.stop_reason = *verdict;
    outcome.exit_code = peers.StopExitCode();
  }
  return outcome;
}

// Node 0's agent has stopped: the node running rank 0 may commit from `cycle` on
// (rendezvous::kHandedOverKey). Unreachable, nothing can be committed anyway.
void TellHandedOver(Peers& peers, int64_t cycle) {
  try {
    peers.store()->Set(rendezvous::kHandedOverKey, std::to_string(cycle));
  } catch (const std::exception& error) {
    spdlog::warn("checkpoints: cannot tell the node running rank 0 that node 0 stopped committing: {}", error.what());
  }
}

// Each cycle's commands under a fresh supervisor (a stopped one stays stopped), watched
// for hangs, and the load of the checkpoint the next cycle resumes from.
CycleHooks CycleHooksOf(const CliOptions& cli, const PreparedJob& job, CheckpointStart checkpoint_start, Peers* peers,
                        watchdog::Watchdog* watch, HealthWatch* health, watchdog::Progress* progress, SignalRouter& signals,
                        TrainingRole& role, report::JobRecorder* recorder, StepSources step_sources,
                        std::function<void()> read_remote_commits) {
  const std::optional<storage::DestinationSpec>& destination = checkpoint_start.destination;
  CheckpointPhase& checkpoint_phase = checkpoint_start.phase;
  CycleHooks hooks;
  hooks.run = [&cli, &job, peers, watch, health, progress, &signals, &checkpoint_phase, &role, recorder, step_sources,
               read_remote_commits](int64_t cycle, const std::string& resume) {
    if (role.keeps_store) return KeepTheStore(cycle, *peers, watch, signals, recorder, resume, read_remote_commits);
    // What the last cycle left is that cycle's: judged before this cycle's training writes.
    if (checkpoint_phase.agent) checkpoint_phase.agent->BeginCycle(cycle);
    auto grace = std::chrono::milliseconds(int64_t(job.config.launcher.grace_period_s * 1000));
    auto peer_grace = std::chrono::milliseconds(int64_t(job.config.launcher.peer_failure_grace_s * 1000));
    // With the watchdog on, the job's output is progress: relayed, or written to its files.
    // Relayed too when its lines carry the step numbers (launcher.progress.step_pattern).
    const bool relayed = watch || step_sources.from_output;
    Supervisor supervisor(signals, grace, peer_grace, relayed ? progress : nullptr, watch ? &watch->output_files() : nullptr);
    if (step_sources.from_output) supervisor.ObserveLines(step_sources.from_output);
    step_sources.log->BeginCycle(cycle);
    StopUnion own(watch, health);
    StopUnion stops(peers, &own);
    if (watch) watch->BeginCycle(cycle);
    if (recorder) recorder->CycleRan(cycle, resume);
    JobOutcome outcome = supervisor.Run(CommandsToRun(cli, job.config),
                                        CycleEnviron(job.environment, job.config, cycle, resume, role.rank,
                                                     peers ? peers->MasterAddress() : std::nullopt),
                                        job.environment.working_dir, &stops);
    if (recorder) recorder->CycleEnded(cycle);
    if (watch) {
      watch->EndCycle();
      if (watch->StoppedAsHung() && !outcome.shutdown_signal) outcome.exit_code = kExitHung;
    }
    if (health) MarkUnhealthy(*health, outcome);
    return outcome;
  };
  hooks.restart_decided = [&checkpoint_phase](int64_t cycle) {
    if (checkpoint_phase.agent) checkpoint_phase.agent->RestartDecided(cycle);
  };
  if (health) {
    hooks.leave = [health, &role]() -> std::optional<std::string> {
      if (role.keeps_store) return std::nullopt;  // it serves the store: it stays to the end
      std::vector<health::Finding> fatal = health->Fatal();
      if (fatal.empty()) return std::nullopt;
      return DescribeFatal(fatal);
    };
  }
  hooks.load_resume = [&job, &destination, &role](const storage::CommitRecord& commit,
                                                  const std::function<void()>& check_stop) {
    if (!destination || !role.rank) return;
    LoadOwnCheckpoint(job.environment, *destination, *role.rank, commit, check_stop);
  };
  // A replacement's first cycle when nothing is committed: the job's load_checkpoint_config,
  // as every other node loaded it before cycle 0.
  hooks.load_start = [&job, &destination, &role](const std::function<void()>& check_stop) {
    if (!destination || !role.rank || !job.config.runtime.load_checkpoint_config.enabled) return;
    ClearEarlierLoads(job.environment, *role.rank);
    spdlog::info("loading runtime.load_checkpoint_config, as the other nodes did before their first cycle");
    LoadCheckpoints(job.config, job.environment, *destination, *role.rank, check_stop);
  };
  // A spare that takes a rank saves that rank's parts from its first cycle on, answering for
  // the saves its predecessor left open as a replacement does (incarnation: that cycle).
  hooks.promote = [&job, &destination, &checkpoint_phase, &role, peers, &signals](int rank, int64_t cycle) {
    role.rank = rank;
    log::SetNodeRank(job.identity.rank, rank);  // only a spare is promoted
    if (!destination) return;
    try {
      checkpoint_phase = StartCheckpoints(job.config, job.environment, *destination, TrainingIdentity(job.identity, rank),
                                          peers->store(), [&] { CheckStop(peers, signals); }, cycle, nullptr, nullptr,
                                          nullptr, peers->ServesTheStore());
    } catch (const rendezvous::StoreError& error) {
      // Node 0 cut it off meanwhile (it was frozen while chosen): a lost leader, not a bug.
      throw LaunchFailure(kExitUnavailable, std::string("this spare cannot reach node 0's store as it takes rank ") +
                                                std::to_string(rank) + ": " + error.what());
    }
  };
  // Node 0 whose rank moved: the commits its agent had begun are written, the rest (all of
  // sealed cycles) abandoned, and the node running rank 0 commits from now on.
  hooks.hand_over = [&job, &checkpoint_phase, &role, peers](int64_t cycle) {
    if (role.keeps_store) return;  // handed over at an earlier restart
    role.rank.reset();
    role.keeps_store = true;
    log::SetNodeRank(job.identity.rank, -1);
    spdlog::warn("this node's rank runs on a spare from cycle {}: it keeps serving the rendezvous and deciding restarts, "
                 "and runs no command",
                 cycle);
    if (checkpoint_phase.agent) {
      const checkpoint::DrainResult result =
          checkpoint_phase.agent->HandOver(std::chrono::steady_clock::now() + kHandOverBound);
      spdlog::info("checkpoints: handed over to the node running rank 0: {}", result.message);
      checkpoint_phase = {};  // its uploader is gone: nothing of node 0's is written after this
    }
    TellHandedOver(*peers, cycle);
  };
  return hooks;
}

// The live metrics follow the restarts, a spare's promotion (its rank, its checkpoints) and
// node 0 handing its rank over.
void CountCycles(CycleHooks& hooks, RunCounters& run, metrics::LiveMetrics& live, const CheckpointPhase& checkpoints,
                 std::shared_ptr<void>& checkpoint_metrics) {
  hooks.restart_known = [known = hooks.restart_known, &run](const CycleRecord& record) {
    if (known) known(record);
    run.cycle = record.cycle;
    run.restarts_used = record.restarts_used;
  };
  hooks.promote = [promote = hooks.promote, &live, &checkpoints, &checkpoint_metrics](int rank, int64_t cycle) {
    checkpoint_metrics.reset();  // the promotion replaces the agent it reads
    promote(rank, cycle);
    live.SetRank(rank);
    checkpoint_metrics = ReadCheckpoints(&live, checkpoints.agent.get());
  };
  hooks.hand_over = [hand_over = hooks.hand_over, &live, &checkpoint_metrics](int64_t cycle) {
    checkpoint_metrics.reset();  // the hand-over ends the agent it reads
    hand_over(cycle);
    live.SetRank(-1);
  };
}

// What node 0 does when `latest` moves: its restart decisions name that commit, and the job's
// report counts it. Null where neither is wanted.
// `own_saves`: the commits are of this node's own parts, saved in its BT_CHECKPOINT_DIR (else
// they are known when they are read: node 0 running no rank).
std::function<void(const storage::CommitRecord&)> OnLatestOf(std::shared_ptr<CommittedCheckpoints> commits,
                                                             report::JobRecorder* recorder, const report::JobClock& clock,
                                                             const PreparedJob& job, bool own_saves = true) {
  if (!commits && !recorder) return nullptr;
  auto dir = job.environment.variables.find("BT_CHECKPOINT_DIR");
  const std::string checkpoint_dir = dir != job.environment.variables.end() && own_saves ? dir->second : "";
  return [commits, recorder, &clock, checkpoint_dir](const storage::CommitRecord& commit) {
    if (commits) commits->Committed(commit);
    if (recorder) recorder->Committed(commit.name, SavedAt(checkpoint_dir, commit.name, clock), commit.cycle);
  };
}

// Node 0 running no rank: what the node running rank 0 committed, as it tells node 0's table
// (rendezvous::kCommitLatestKey), handed to `on_latest` once per new record. Null where no one
// would be told.
std::function<void()> RemoteCommitsReader(Peers* peers, std::function<void(const storage::CommitRecord&)> on_latest) {
  if (peers == nullptr || !peers->ServesTheStore() || !on_latest) return nullptr;
  auto last = std::make_shared<std::string>();
  return [peers, on_latest = std::move(on_latest), last] {
    try {
      const std::optional<std::string> text = peers->store()->Peek({rendezvous::kCommitLatestKey}).front();
      if (!text || *text == *last) return;
      *last = *text;
      const nlohmann::json value = nlohmann::json::parse(*text);
      on_latest(storage::CommitRecord::FromText(value.at("record").get<std::string>(), rendezvous::kCommitLatestKey));
    } catch (const std::exception& error) {
      spdlog::warn("checkpoints: cannot read what the node running rank 0 committed ({}): {}",
                   rendezvous::kCommitLatestKey, error.what());
    }
  };
}

// How the job's last cycle ended, in goodput's causes (launcher/report/goodput.h).
std::string LastCause(const JobOutcome& outcome) {
  if (outcome.shutdown_signal) return "stopped";
  if (outcome.exit_code == 0 && !outcome.stop_reason) return "success";
  return report::FaultKind(outcome.exit_code == 0 ? 1 : outcome.exit_code);
}

// The fault that a restart's decision names, on the cycle before it.
void RecordFault(report::JobRecorder& recorder, const report::JobClock& clock, const CycleRecord& record) {
  recorder.CycleFailed(record.cycle - 1, clock.At(record.fault), report::FaultKind(record.failed_exit_code),
                       record.failed_node, record.failed_host, record.cause);
}

// Node 0's cycles as its restarts' decisions named their faults (each ended the cycle before
// it), and how the last one ended.
void RecordCycles(report::JobRecorder& recorder, const report::JobClock& clock, const std::vector<CycleRecord>& cycles,
                  const JobOutcome& outcome) {
  for (const CycleRecord& record : cycles) RecordFault(recorder, clock, record);
  recorder.JobEnded(LastCause(outcome), DescribeOutcome(outcome));
}

// The node leaves a job that goes on: no exit barrier (the others wait for a launcher in its
// slot), its uploads not waited for (the restart's decision sealed its cycle's saves), its
// findings in the last lines, for whoever replaces the node.
int LeaveUnhealthy(const JobOutcome& outcome, const PreparedJob& job, CheckpointPhase& checkpoints, Timeline& timeline,
                   const report::LaneRecord& lane, Peers* peers, std::optional<int> training_rank) {
  // Rank 0 commits the job's checkpoints: it writes those it had begun (a decision named the
  // newest), and never closes the declarations the next node running rank 0 goes on with.
  if (checkpoints.agent && training_rank == 0) {
    checkpoints.agent->HandOver(std::chrono::steady_clock::now() + kHandOverBound);
  } else if (checkpoints.agent) {
    checkpoints.agent->Drain(false, std::chrono::steady_clock::now());
  }
  LogTimeline(timeline);
  SendLane(peers, lane);
  const char* others = job.identity.rank == 0 ? "node 0 serves the rendezvous and no spare took its rank: the job ends "
                                               "with it"
                       : job.identity.spares > 0
                           ? "a ready spare takes its rank, or the others wait for a launcher in its slot"
                           : "the others wait for a launcher in its slot (launcher.restart.rejoin_timeout_s)";
  spdlog::error("this node left the job (exit {}; {}): replace it:\n{}", int(kExitUnhealthy), others, *outcome.left_job);
  return kExitUnhealthy;
}

int RunPhases(const CliOptions& cli, SignalRouter& signals, Timeline& timeline, report::JobClock& clock) {
  PreparedJob job = PrepareJob(cli, cli.command.empty(), timeline);
  // First of the run's objects: the sources read below go before it (their handles are
  // declared after what they read).
  const std::shared_ptr<metrics::LiveMetrics> live = StartMetrics(job, timeline);
  try {
    env::CreateDirectories(job.environment);
  } catch (const std::runtime_error& error) {
    throw LaunchFailure(kExitIo, error.what());
  }
  std::optional<storage::DestinationSpec> destination;
  if (UsesCheckpoints(job.config)) destination = ResolveCheckpointDestination(job.config, job.environment, cli.root);

  const std::shared_ptr<CommittedCheckpoints> node0_commits = CommittedCheckpointsOf(job, destination);

  // The fabric is what nodes talk over: a single node has nothing to check or choose.
  std::optional<rendezvous::fabric::Inventory> inventory;
  std::unique_ptr<Peers> peers;
  auto commit_gate = std::make_shared<checkpoint::CommitGate>();  // node 0's restart decision and its commits
  if (job.identity.count > 1) {
    inventory = ReadFabricInventory(rendezvous::fabric::SysfsRoot(cli.sysfs_root));
    timeline.Begin("rendezvous");
    peers = JoinPeers(job.config, job.identity, job.job_id(), signals, RestartPolicyOf(job, node0_commits, commit_gate));
    clock.SetLeaderOffset(peers->LeaderClockOffset());
  }
  // Node 0's record of the job for its report at the end (launcher/phases/job_report.h).
  std::unique_ptr<report::JobRecorder> recorder;
  if (job.identity.rank == 0) recorder = std::make_unique<report::JobRecorder>(clock);
  const auto job_metrics = ReadJob(live.get(), peers.get(), recorder.get(), clock, clock.At(timeline.start()));
  // A launcher that replaced a lost one loads what its first cycle resumes from at that
  // cycle's barrier, not the job's `latest` now.
  // A launcher started again in a slot whose rank moved to a spare is a spare itself.
  const std::optional<rendezvous::PeerEvent> joined_late = peers ? peers->TakeRejoin() : std::nullopt;
  std::optional<rendezvous::PeerEvent> rejoin;
  if (joined_late && joined_late->training_rank >= 0) rejoin = joined_late;
  // A spare (launcher.spares) loads and saves nothing until it takes a rank.
  TrainingRole role;
  std::optional<storage::CommitRecord> resume;
  std::unique_ptr<NodeHealth> health;
  StartHealth start;
  try {
    health = NodeHealth::Open(job.config.launcher.health, job.environment, rendezvous::fabric::SysfsRoot(cli.sysfs_root));
    start = CheckFabricAndHealth(job, std::move(inventory), health.get(), peers.get(), signals, timeline);
    // The first cycle's rank: the slot's, or the one node 0 gave it from every node's health.
    int start_rank = job.identity.rank;
    if (start.ranks && !joined_late) start_rank = peers->StartWithRanks(*start.ranks);
    if (!peers || peers->RunsARank()) role.rank = rejoin ? rejoin->training_rank : start_rank;
    role.keeps_store = !role.rank && peers && peers->ServesTheStore();  // node 0 cannot train: rank 0 starts on a spare
    if (job.identity.spares > 0) log::SetNodeRank(job.identity.rank, role.rank.value_or(-1));
    // Node 0 running no rank reads it too: its restart decisions resume from it until the
    // spare running rank 0 commits a newer one.
    if (!rejoin && (role.rank || role.keeps_store)) resume = ResumePoint(job, destination, peers.get(), signals);
    if (node0_commits) node0_commits->Started(resume);
    PrepareToRun(job, destination, resume, role.rank, rejoin.has_value(), peers.get(), signals, timeline);
  } catch (const LaunchFailure& failure) {
    // The others are waiting in the ready barrier or for the seed: tell them now.
    if (peers) {
      JobOutcome outcome;
      outcome.exit_code = failure.code();
      outcome.launcher_failure = failure.what();
      peers->Report(outcome);
    }
    // A node that cannot train says so whatever ended the start meanwhile: 75 is what gets
    // it replaced (review 8, N1: it exited 69 when another node's failure ended the start).
    if (start.cannot_train && failure.code() != kExitUnhealthy) {
      throw LaunchFailure(kExitUnhealthy, std::string("health: this node cannot train; replace it (the start ended "
                                                      "meanwhile: ") + failure.what() + ")");
    }
    throw;
  }
  CheckpointPhase checkpoints;
  if (destination && role.rank) {
    std::function<void(const storage::CommitRecord&)> on_latest = OnLatestOf(node0_commits, recorder.get(), clock, job);
    checkpoints = StartCheckpoints(job.config, job.environment, *destination, TrainingIdentity(job.identity, *role.rank),
                                   peers ? peers->store() : nullptr, [&] { CheckStop(peers.get(), signals); },
                                   rejoin ? rejoin->cycle : 0, std::move(on_latest), commit_gate,
                                   AbsentRanksOf(peers.get()), !peers || peers->ServesTheStore());
  }
  std::shared_ptr<void> checkpoint_metrics = ReadCheckpoints(live.get(), checkpoints.agent.get());
  // Shared: the relay's matcher thread may outlive this function (launcher/phases/job_report.h).
  const auto steps = std::make_shared<report::StepLog>();
  StepSources step_sources{steps, StepsFromOutput(job.config.launcher.progress, steps, clock)};
  // Until the end: after its job ended, a node still answers a stack request of the others'.
  watchdog::Progress progress;
  std::unique_ptr<watchdog::Watchdog> watch = ArmWatchdog(job, peers.get(), progress);
  RunCounters run;
  run.restarts_allowed = job.config.launcher.restart.max_restarts;
  const auto run_metrics = ReadRun(live.get(), run, progress);
  // One source: two that disagree by one (a 1-based log line, a 0-based heartbeat) would look
  // like steps going back (review 10, F4).
  if (watch && !step_sources.from_output) {
    watch->OnHeartbeat([steps, &clock](const std::string& contents, int64_t modified_ns) {
      NoteHeartbeatStep(contents, modified_ns, *steps, clock);
    });
  }
  if (watch && recorder) {
    watch->OnHangCalled([&recorder, &clock](int64_t cycle, auto stall_start, auto detected) {
      recorder->HangCalled(cycle, clock.At(stall_start), clock.At(detected));
    });
  }
  std::unique_ptr<HealthWatch> health_watch;
  if (health && health->checks_anything()) health_watch = std::make_unique<HealthWatch>(*health, job.identity.rank);
  // A node that runs no rank asks whether it must leave before it waits as a spare: what the
  // health phase found must be known then, not at the watch's first sample.
  if (health_watch && !role.rank) health_watch->Recheck();
  const auto health_metrics = ReadHealth(live.get(), health_watch.get());
  if (live) live->SetRank(role.rank.value_or(-1));
  MarkRunStarted(job, peers.get());

  timeline.Begin("run");
  std::vector<CycleRecord> cycles;
  const std::function<void()> read_remote_commits =
      RemoteCommitsReader(peers.get(), OnLatestOf(node0_commits, recorder.get(), clock, job, false));
  const bool checkpointing = destination && job.config.runtime.checkpointing_config.enabled;
  CycleHooks hooks = CycleHooksOf(cli, job, {destination, checkpoints}, peers.get(), watch.get(), health_watch.get(),
                                  &progress, signals, role, recorder.get(), step_sources, read_remote_commits);
  // Node 0 records each fault as its restart is decided, not only at the end: the live goodput
  // charges a hang to its own bucket from then on (review 12), and the end repeats the same.
  if (recorder) {
    hooks.restart_known = [&recorder, &clock](const CycleRecord& record) { RecordFault(*recorder, clock, record); };
  }
  if (live) CountCycles(hooks, run, *live, checkpoints, checkpoint_metrics);
  JobOutcome outcome = RunCycles(job.config, peers.get(), signals, hooks, resume ? resume->name : "", std::move(rejoin), cycles);
  timeline.Annotate(DescribeOutcome(outcome) + (cycles.empty() ? "" : "; restarts: " + RenderCycles(cycles)));
  if (recorder) RecordCycles(*recorder, clock, cycles, outcome);
  if (outcome.left_job) {
    return LeaveUnhealthy(outcome, job, checkpoints, timeline, LaneOf(timeline, clock, *steps, job.identity.rank, role.rank),
                          peers.get(), role.rank);
  }
  // Its lane once it knows the job's verdict, before its drain (not drawn; node 0's is): node 0
  // reads the lanes after its exit barrier and waits for the connected ones, at most 3 s.
  if (peers && !recorder) SendLane(peers.get(), LaneOf(timeline, clock, *steps, job.identity.rank, role.rank));
  if (peers) peers->Report(outcome);  // the other nodes stop now, not after this node's drain
  bool committed = true;
  if (checkpoints.agent) {
    timeline.Begin("drain");
    committed = DrainCheckpoints(checkpoints, job.config, outcome, LeaderLossOf(peers.get(), job.config));
    timeline.Annotate(committed ? "committed" : "last checkpoint not committed");
  }
  int exit_code = outcome.exit_code;
  if (peers) {
    timeline.Begin("exit barrier");
    exit_code = peers->Finish(outcome, signals);
    timeline.Annotate("job exit " + std::to_string(exit_code));
  }
  // The commits rank 0 made on a spare during its drain, for node 0's report.
  if (role.keeps_store && read_remote_commits) read_remote_commits();
  if (!committed && !FailedWithItsPeers(peers.get(), outcome, exit_code)) exit_code = kExitIo;
  LogTimeline(timeline);
  if (recorder) {
    // The report says what the job's time became; it never changes how the job ended.
    try {
      WriteJobReport(job, peers.get(), LaneOf(timeline, clock, *steps, job.identity.rank, role.rank), clock, *recorder,
                     {destination, checkpointing && committed});
    } catch (const std::exception& error) {
      spdlog::warn("report: not written: {}", error.what());
    }
  }
  return exit_code;
}

}  // namespace

int RunSubcommand(const CliOptions& cli) {
  // Before any thread exists: every thread must inherit the blocked signal mask.
  SignalRouter signals;
  Timeline timeline;
  report::JobClock clock;
  try {
    return RunPhases(cli, signals, timeline, clock);
  } catch (const LaunchFailure& failure) {
    // The one line saying why, then where the time went before it.
    if (failure.code() == 0) {
      spdlog::info("{}", failure.what());
    } else {
      spdlog::error("{}", failure.what());
    }
    timeline.Annotate("failed");
    LogTimeline(timeline);
    return failure.code();
  }
}

}  // namespace bt::launcher
