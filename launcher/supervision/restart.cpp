#include "launcher/supervision/restart.h"

#include <cstring>
#include <memory>

#include <spdlog/spdlog.h>

#include "launcher/exit_codes.h"
#include "launcher/timeline.h"

namespace bt::launcher {
namespace {

using Clock = std::chrono::steady_clock;
using rendezvous::PeerEvent;

constexpr std::chrono::seconds kLeaderSlack{10};

double Seconds(Clock::duration duration) { return std::chrono::duration<double>(duration).count(); }

std::string FormatSeconds(double seconds) {
  return FormatDuration(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds)));
}

// The decision's "commit": the record's own text, and whether it predates versions (a
// record's text has no field saying so).
constexpr const char* kCommitField = "commit";
constexpr const char* kUnversionedField = "commit_unversioned";

// Node 0's account of the job's restarts. The budget is the job's, not a node's: every
// failure the leader accepts counts once, whichever node it came from.
class RestartBudget {
 public:
  RestartBudget(const env::RestartSettings& settings, std::shared_ptr<const CommittedCheckpoints> committed)
      : settings_(settings), committed_(std::move(committed)) {}

  rendezvous::RestartAnswer Decide(const rendezvous::CycleFailure& failure) {
    if (used_ >= settings_.max_restarts) {
      return {std::nullopt, "no restart left (" + Used() + " used, launcher.restart.max_restarts)"};
    }
    // From memory: the agent running rank 0 is the only writer of `latest` (node 0's, or one
    // on a spare whose commits the server read from its table); no read on this thread.
    std::optional<storage::CommitRecord> latest =
        committed_ ? committed_->LatestForDecision(failure.remote_commits) : std::nullopt;
    if (auto refusal = NoProgress(latest)) return {std::nullopt, *refusal};
    started_from_ = latest;
    ++used_;
    spdlog::warn("restart {}: cycle {} failed ({}); every node runs cycle {}{}", Used(), failure.cycle, failure.cause,
                 failure.cycle + 1, Resuming(latest));
    rendezvous::Message decision{{"resume", latest ? latest->name : ""},
                                 {"restarts_used", used_},
                                 {"max_restarts", settings_.max_restarts}};
    if (latest) {
      decision[kCommitField] = latest->ToText();
      decision[kUnversionedField] = latest->unversioned;
    }
    return {decision, ""};
  }

 private:
  std::string Used() const { return std::to_string(used_) + "/" + std::to_string(settings_.max_restarts); }

  // Loud when a job that checkpoints has nothing committed: every node starts from scratch.
  std::string Resuming(const std::optional<storage::CommitRecord>& latest) const {
    if (latest) return " from checkpoint " + latest->name + " (its commit record, on every node)";
    if (committed_) return ", from scratch: nothing of this job is committed yet";
    return "";
  }

  // A cycle that committed nothing new made no progress; several in a row mean the job
  // fails the same way each time, and restarting it only burns the allocation. Commits are
  // compared, not names: a name saved again is progress.
  std::optional<std::string> NoProgress(const std::optional<storage::CommitRecord>& latest) {
    if (!committed_) return std::nullopt;
    if (!started_from_known_) {
      started_from_ = committed_->AtStart();
      started_from_known_ = true;
    }
    without_progress_ = SameCommit(latest, started_from_) ? without_progress_ + 1 : 0;
    if (without_progress_ < settings_.max_cycles_without_progress) return std::nullopt;
    return "not restarting: " + std::to_string(without_progress_) +
           " cycles in a row ended without a new committed checkpoint (launcher.restart.max_cycles_without_progress; " +
           Used() + " restarts used)";
  }

  env::RestartSettings settings_;
  std::shared_ptr<const CommittedCheckpoints> committed_;
  std::optional<storage::CommitRecord> started_from_;  // the commit the current cycle started from
  bool started_from_known_ = false;
  int used_ = 0;
  int without_progress_ = 0;
};

// Thrown by a load between cycles when it must end at once: a shutdown signal
// (`signal_number`), or a newer restart or the job's verdict from the leader (0). Not a
// std::exception, so that no load's error handling takes it for a failed transfer.
struct LoadInterrupted {
  int signal_number = 0;
};

bool RestartsEnabled(const env::JobConfig& config, Peers* peers) {
  return peers != nullptr && config.launcher.restart.max_restarts > 0;
}

// After a cycle's commands: the restart the leader pushed, or nullopt when this outcome
// ends the job. A failed or finished node reports and waits for the leader's answer; a
// signal from the orchestrator never restarts.
std::optional<PeerEvent> NextRestart(Peers& peers, SignalRouter& signals, const CycleHooks& hooks, JobOutcome& outcome) {
  if (outcome.shutdown_signal) {
    // Its report must belong to the leader's current cycle, or the leader drops it as stale.
    if (auto restart = peers.TakeRestart()) {
      peers.BeginCycle(restart->cycle);
      if (hooks.restart_decided) hooks.restart_decided(restart->cycle);
    }
    return std::nullopt;
  }
  if (auto restart = peers.TakeRestart()) return restart;
  if (outcome.stop_reason) return std::nullopt;  // a verdict stopped it
  peers.Report(outcome);
  int signal_number = 0;
  if (peers.AwaitRestartOrVerdict(signals, signal_number)) return peers.TakeRestart();
  if (signal_number != 0 && !outcome.shutdown_signal) outcome.shutdown_signal = signal_number;
  return std::nullopt;
}

CycleRecord RecordOf(const PeerEvent& restart) {
  CycleRecord record;
  record.cycle = restart.cycle;
  record.cause = restart.message;
  record.resume_commit = ResumeCommitOf(restart.decision);
  record.resume = record.resume_commit ? record.resume_commit->name : "";
  record.decided_in_s = restart.decision.value("decided_in_s", -1.0);
  record.restarts_used = restart.decision.value("restarts_used", 0);
  record.max_restarts = restart.decision.value("max_restarts", 0);
  record.stopped = Clock::now();
  record.failed_node = restart.rank;
  record.failed_host = restart.host;
  record.failed_exit_code = restart.exit_code;
  record.fault = restart.received == Clock::time_point{} ? record.stopped : restart.received;
  return record;
}

// What ends a load between cycles: a shutdown signal, or news from the leader (a newer
// restart, the job's verdict) that makes this cycle's load pointless. Each is thrown as
// LoadInterrupted; MeetAtBarrier then acts on it as on the same news at the barrier.
std::function<void()> LoadStopCheck(Peers& peers, SignalRouter& signals) {
  return [&peers, &signals] {
    while (auto signal_number = signals.Take()) {
      if (StartsShutdown(*signal_number)) throw LoadInterrupted{*signal_number};
    }
    if (peers.TakeStop()) throw LoadInterrupted{0};
  };
}

// The node's failure to prepare the next cycle is the job's: the others are waiting at
// the barrier, so they are told before the launcher fails. Loads exactly the commit the
// decision names; with none, a launcher that has not run a cycle yet (`first_cycle_here`:
// it replaced a lost one) loads what the job's first cycle loaded.
void LoadForCycle(Peers& peers, SignalRouter& signals, const CycleHooks& hooks, const CycleRecord& record,
                  bool first_cycle_here) {
  const std::function<void()> check_stop = LoadStopCheck(peers, signals);
  try {
    if (record.resume_commit) {
      hooks.load_resume(*record.resume_commit, check_stop);
    } else if (first_cycle_here && hooks.load_start) {
      hooks.load_start(check_stop);
    }
  } catch (const LaunchFailure& failure) {
    JobOutcome outcome;
    outcome.exit_code = failure.code();
    outcome.launcher_failure = failure.what();
    peers.Report(outcome);
    throw;
  }
}

// A node whose hardware cannot train does not restart on it: it leaves, and the others
// await a launcher in its slot at the barrier, as for a lost node.
static JobOutcome LeaveTheJob(JobOutcome outcome, const std::string& reason) {
  spdlog::error("restart: this node leaves the job instead of restarting on it: {}", reason);
  outcome.exit_code = kExitUnhealthy;
  outcome.left_job = reason;
  return outcome;
}

// What ends a wait between cycles before the leader's news is read: a shutdown signal
// (`signal_number`), or this node's hardware (it leaves). True when `outcome` says which.
bool StoppedOrLeaving(int signal_number, const CycleHooks& hooks, JobOutcome& outcome) {
  if (signal_number != 0) {
    outcome.shutdown_signal = signal_number;
    outcome.exit_code = 128 + signal_number;
    return true;
  }
  if (auto reason = hooks.leave ? hooks.leave() : std::nullopt) {
    outcome = LeaveTheJob(outcome, *reason);
    return true;
  }
  return false;
}

// Why this node's rank moved to a spare in `restart` (the leader's "promoted").
std::string RankMovedAway(const PeerEvent& restart) {
  const auto promoted = restart.decision.find("promoted");
  if (promoted == restart.decision.end() || !promoted->is_object()) return "its rank moved to a spare";
  return "rank " + std::to_string(promoted->value("rank", -1)) + " moved to the spare node " +
         std::to_string(promoted->value("to", -1)) + ": " + promoted->value("why", std::string("this node must leave"));
}

// A hot spare (launcher.spares): prepared as every node is, it runs nothing until the leader
// gives it a leaving node's rank. Returns that rank's first restart, which it meets the others
// in as a launcher that replaced a lost one does; nullopt with `outcome` saying why not (the
// job's verdict, a signal, or its own hardware: it leaves).
std::optional<PeerEvent> WaitAsSpare(Peers& peers, SignalRouter& signals, const CycleHooks& hooks, JobOutcome& outcome) {
  // Unhealthy already (a node whose rank started on a spare, a spare found bad): it leaves
  // before it says it is ready, or the leader could give it a rank.
  if (auto reason = hooks.leave ? hooks.leave() : std::nullopt) {
    outcome = LeaveTheJob(outcome, *reason);
    return std::nullopt;
  }
  spdlog::info("this node is a hot spare: prepared, it waits for a node's rank to take (launcher.spares)");
  int signal_number = 0;
  std::function<bool()> leaving;
  if (hooks.leave) leaving = [&hooks] { return hooks.leave().has_value(); };
  if (peers.AwaitRank(signals, signal_number, leaving)) {
    PeerEvent promoted = *peers.TakeRejoin();
    spdlog::warn("this spare takes rank {} from cycle {}: {}", promoted.training_rank, promoted.cycle, promoted.message);
    if (hooks.promote) hooks.promote(promoted.training_rank, promoted.cycle);
    promoted.received = {};  // it had no job to stop
    return promoted;
  }
  if (StoppedOrLeaving(signal_number, hooks, outcome)) return std::nullopt;
  if (auto verdict = peers.Verdict()) {
    outcome.stop_reason = *verdict;
    return std::nullopt;
  }
  spdlog::info("the job has ended without needing this spare");
  return std::nullopt;
}

// Between two cycles: load, then the barrier. A newer restart while waiting (a node lost
// or failed again) starts the wait over for that cycle; a verdict or a signal ends the job.
// Returns the restart whose barrier passed, or nullopt with `outcome` saying why not.
std::optional<PeerEvent> MeetAtBarrier(const env::JobConfig& config, Peers& peers, SignalRouter& signals,
                                       const CycleHooks& hooks, PeerEvent restart, bool first_cycle_here,
                                       JobOutcome& outcome, std::vector<CycleRecord>& cycles) {
  // The leader ends a barrier that waits past rejoin_timeout_s, naming the ranks it waited
  // for; the slack only covers a leader that died without a word.
  const auto wait = std::chrono::milliseconds(int64_t(config.launcher.restart.rejoin_timeout_s * 1000)) + kLeaderSlack;
  while (true) {
    peers.BeginCycle(restart.cycle);
    cycles.push_back(RecordOf(restart));
    if (hooks.restart_known) hooks.restart_known(cycles.back());
    spdlog::info("this node's job is stopped; waiting for every node to be ready for cycle {}", restart.cycle);
    int signal_number = 0;
    bool interrupted = false;
    try {
      LoadForCycle(peers, signals, hooks, cycles.back(), first_cycle_here);
    } catch (const LoadInterrupted& stop) {
      spdlog::info("the load for cycle {} was stopped", restart.cycle);
      signal_number = stop.signal_number;
      interrupted = true;
    }
    // 0 for a launcher that rejoined (no job to stop); a node whose own job failed had
    // stopped before the push came: 0 too.
    const double stopped_s =
        restart.received == Clock::time_point{} ? 0 : std::max(0.0, Seconds(cycles.back().stopped - restart.received));
    // Found unhealthy while it stopped or loaded (review 5, R5-4): it leaves before it says it
    // is ready, or every node would start the cycle and lose it at once, a restart spent.
    if (auto reason = !interrupted && hooks.leave ? hooks.leave() : std::nullopt) {
      outcome = LeaveTheJob(outcome, *reason);
      return std::nullopt;
    }
    std::function<bool()> leaving;
    if (hooks.leave) leaving = [&hooks] { return hooks.leave().has_value(); };
    if (!interrupted &&
        peers.AwaitCycleStart(restart.cycle, stopped_s, Clock::now() + wait, signals, signal_number, leaving)) {
      CycleRecord& record = cycles.back();
      record.all_ready = Clock::now();
      const rendezvous::Message go = peers.CycleGo();
      record.every_job_stopped_s = go.value("stopped_s", -1.0);
      record.every_node_restarted_s = go.value("restarted_s", -1.0);
      record.lost_ranks = go.value("lost", "");
      return restart;
    }
    if (signal_number != 0) {
      spdlog::info("stopped by {} while restarting: cycle {} does not start", strsignal(signal_number), restart.cycle);
    }
    // Found unhealthy while it waited: it leaves the barrier, awaited again in its slot.
    if (StoppedOrLeaving(signal_number, hooks, outcome)) return std::nullopt;
    if (auto newer = peers.TakeRestart()) {
      restart = *newer;
      continue;
    }
    if (auto verdict = peers.Verdict()) {
      outcome.stop_reason = *verdict;
      return std::nullopt;
    }
    throw LaunchFailure(kExitUnavailable, "cycle " + std::to_string(restart.cycle) + ": not every node was ready within " +
                                              "launcher.restart.rejoin_timeout_s");
  }
}

}  // namespace

void CommittedCheckpoints::Started(std::optional<storage::CommitRecord> record) {
  std::lock_guard lock(mutex_);
  at_start_ = record;
  latest_ = std::move(record);
}

void CommittedCheckpoints::Committed(const storage::CommitRecord& record) {
  std::lock_guard lock(mutex_);
  latest_ = record;
}

namespace {

// A record text a remote leader left in node 0's table (rendezvous/commit_keys.h); nullopt,
// logged, when it does not parse: the decision then names what node 0 knows.
std::optional<storage::CommitRecord> RemoteRecord(const std::optional<std::string>& text, const char* what) {
  if (!text) return std::nullopt;
  try {
    return storage::CommitRecord::FromText(*text, std::string("the store's ") + rendezvous::kCommitLatestKey);
  } catch (const std::exception& error) {
    spdlog::error("restart: the commit {} by the node running rank 0 is not a commit record: {}", what, error.what());
    return std::nullopt;
  }
}

}  // namespace

std::optional<storage::CommitRecord> CommittedCheckpoints::LatestForDecision(const rendezvous::RemoteCommits& remote) const {
  // Sealed first, always: node 0's own agent begins no commit of the failed cycle after this.
  std::optional<storage::CommitRecord> on_its_way = seal_ ? seal_() : std::nullopt;
  if (auto record = RemoteRecord(remote.on_its_way, "on its way")) return record;
  if (auto record = RemoteRecord(remote.latest, "`latest` names")) return record;
  return on_its_way ? on_its_way : Latest();
}

std::optional<storage::CommitRecord> CommittedCheckpoints::AtStart() const {
  std::lock_guard lock(mutex_);
  return at_start_;
}

std::optional<storage::CommitRecord> CommittedCheckpoints::Latest() const {
  std::lock_guard lock(mutex_);
  return latest_;
}

bool SameCommit(const std::optional<storage::CommitRecord>& a, const std::optional<storage::CommitRecord>& b) {
  if (!a || !b) return !a && !b;
  return a->unversioned == b->unversioned && a->ToText() == b->ToText();
}

rendezvous::RestartPolicy MakeRestartPolicy(const env::RestartSettings& settings,
                                            std::shared_ptr<const CommittedCheckpoints> committed) {
  auto budget = std::make_shared<RestartBudget>(settings, std::move(committed));
  return [budget](const rendezvous::CycleFailure& failure) { return budget->Decide(failure); };
}

std::optional<storage::CommitRecord> ResumeCommitOf(const rendezvous::Message& decision) {
  auto field = decision.find(kCommitField);
  if (field == decision.end() || field->is_null()) return std::nullopt;
  const std::string origin = "the leader's restart decision";
  try {
    storage::CommitRecord record = storage::CommitRecord::FromText(field->get<std::string>(), origin);
    record.unversioned = decision.value(kUnversionedField, false);
    return record;
  } catch (const std::exception& error) {  // ManifestError, or a field that is not a string
    throw LaunchFailure(kExitInternal, origin + ": `" + kCommitField + "` is not a commit record: " + error.what());
  }
}

std::string RenderCycles(const std::vector<CycleRecord>& cycles) {
  std::string text;
  for (const CycleRecord& record : cycles) {
    if (!text.empty()) text += "; ";
    text += "cycle " + std::to_string(record.cycle) + " (" + record.cause + "): ";
    if (record.every_node_restarted_s >= 0) {
      text += "fault → ";
      if (record.decided_in_s >= 0) text += "decided " + FormatSeconds(record.decided_in_s) + " → ";
      text += "every job stopped " + FormatSeconds(record.every_job_stopped_s);
      if (!record.lost_ranks.empty()) text += " (but lost node " + record.lost_ranks + "'s, whose stop is not known)";
      text += " → every node restarted " + FormatSeconds(record.every_node_restarted_s) +
              " (this node: stopped → all ready " + FormatDuration(record.all_ready - record.stopped) + ")";
    } else {
      text += "never restarted";
    }
    text += record.resume.empty() ? ", no checkpoint to resume from" : ", resumed from " + record.resume;
    text += ", restarts " + std::to_string(record.restarts_used) + "/" + std::to_string(record.max_restarts);
  }
  return text;
}

std::vector<std::string> CycleEnviron(const env::JobEnvironment& environment, const env::JobConfig& config, int64_t cycle,
                                      const std::string& resume, std::optional<int> training_rank,
                                      const std::optional<std::string>& master_addr) {
  env::JobEnvironment copy = environment;
  auto& variables = copy.variables;
  // Only where the launcher set it (to node 0's address, as BT_LEADER_ADDR): one the user set is theirs.
  auto master = variables.find("MASTER_ADDR");
  auto leader = variables.find("BT_LEADER_ADDR");
  if (master_addr && master != variables.end() && leader != variables.end() && master->second == leader->second) {
    master->second = *master_addr;
  }
  if (training_rank) {
    // NODE_RANK only where the launcher set it (to the slot, as BT_NODE_RANK): one the user
    // set is theirs.
    if (variables["NODE_RANK"] == variables["BT_NODE_RANK"]) variables["NODE_RANK"] = std::to_string(*training_rank);
    variables["BT_NODE_RANK"] = std::to_string(*training_rank);
  }
  if (config.launcher.restart.max_restarts > 0) {
    variables["BT_RESTART_COUNT"] = std::to_string(cycle);
    variables["TORCHELASTIC_RESTART_COUNT"] = std::to_string(cycle);
    // Only a port the launcher chose moves; one the user set is theirs.
    const std::string chosen = std::to_string(config.launcher.master_port);
    const bool user_set = config.runtime.environment_variables.contains("MASTER_PORT");
    if (!user_set && variables["MASTER_PORT"] == chosen) {
      variables["MASTER_PORT"] = std::to_string(int(config.launcher.master_port) + int(cycle % kMasterPortCycles));
    }
  }
  if (!resume.empty()) variables["BT_RESUME_CHECKPOINT"] = resume;
  return copy.ToEnviron();
}

JobOutcome RunCycles(const env::JobConfig& config, Peers* peers, SignalRouter& signals, const CycleHooks& hooks,
                     const std::string& first_resume, std::optional<PeerEvent> rejoin, std::vector<CycleRecord>& cycles) {
  int64_t cycle = 0;
  std::string resume = first_resume;
  std::optional<PeerEvent> restart = std::move(rejoin);
  bool first_cycle_here = restart.has_value();  // a replacement has loaded nothing yet
  JobOutcome outcome;
  if (!restart && peers && !peers->RunsARank() && !peers->ServesTheStore()) {
    restart = WaitAsSpare(*peers, signals, hooks, outcome);
    if (!restart) return outcome;
    first_cycle_here = true;
  } else if (restart) {
    spdlog::warn("this launcher replaces a lost one: it meets the other nodes in cycle {}", restart->cycle);
    restart->received = {};  // it had no job for the push to stop (not the time its preparation took)
  }
  while (true) {
    if (!restart) {
      outcome = hooks.run(cycle, resume);
      if (!RestartsEnabled(config, peers)) return outcome;
      restart = NextRestart(*peers, signals, hooks, outcome);
      if (!restart) return outcome;
      // Node 0 whose rank moved stays: it serves the store (hand_over, below).
      if (peers->RunsARank() || !peers->ServesTheStore()) {
        if (auto reason = hooks.leave ? hooks.leave() : std::nullopt) return LeaveTheJob(outcome, *reason);
        if (!peers->RunsARank()) return LeaveTheJob(outcome, RankMovedAway(*restart));
      }
    }
    if (hooks.restart_decided) hooks.restart_decided(restart->cycle);
    if (!peers->RunsARank() && peers->ServesTheStore() && hooks.hand_over) hooks.hand_over(restart->cycle);
    restart = MeetAtBarrier(config, *peers, signals, hooks, *restart, first_cycle_here, outcome, cycles);
    if (!restart) return outcome;
    first_cycle_here = false;
    cycle = restart->cycle;
    resume = cycles.back().resume;
    restart.reset();
    spdlog::info("every node is ready: running cycle {} (BT_RESTART_COUNT={}){}", cycle, cycle,
                 resume.empty() ? "" : ", resuming from checkpoint " + resume);
  }
}

}  // namespace bt::launcher
