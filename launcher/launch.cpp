#include "launcher/launch.h"

#include <chrono>
#include <cstring>
#include <memory>
#include <optional>

#include <spdlog/spdlog.h>

#include "launcher/exit_codes.h"
#include "launcher/job.h"
#include "launcher/phases/cache_seed.h"
#include "launcher/phases/checkpoints.h"
#include "launcher/phases/fabric.h"
#include "launcher/phases/nccl_preflight.h"
#include "launcher/phases/ready.h"
#include "launcher/phases/weights.h"
#include "launcher/supervision/peers.h"
#include "launcher/supervision/signals.h"
#include "launcher/supervision/supervisor.h"
#include "launcher/timeline.h"

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
// ready barrier (its deadline is the weights deadline), then the cache seed.
void PrepareNode(const PreparedJob& job, const std::optional<storage::DestinationSpec>& destination,
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
  if (job.config.runtime.load_checkpoint_config.enabled) {
    timeline.Begin("load checkpoints");
    phase.Publish("loading checkpoints");
    LoadCheckpoints(job.config, job.environment, *destination, job.identity.rank, [&] { CheckStop(peers, signals); });
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

// Every phase between the rendezvous and the run, through PreRunPeers: a failed peer or a
// lost leader ends any of them at once, and a store failure names the phase it hit.
void PrepareAfterRendezvous(PreparedJob& job, std::optional<rendezvous::fabric::Inventory> inventory,
                            const std::optional<storage::DestinationSpec>& destination, Peers* peers,
                            SignalRouter& signals, Timeline& timeline) {
  std::optional<PreRunPeers> pre_run;
  if (peers) pre_run.emplace(*peers, signals);
  Peers* phase_peers = pre_run ? &*pre_run : nullptr;
  NameStoreFailures(timeline, [&] {
    if (inventory) {
      timeline.Begin("fabric");
      PlanFabricPhase(job.config, job.identity, phase_peers, std::move(*inventory), job.environment);
    }
    if (job.config.launcher.fabric.nccl_preflight) {
      timeline.Begin("nccl preflight");
      RunNcclPreflight(job.config, job.identity, phase_peers, job.environment, [&] { CheckStop(phase_peers, signals); });
    }
    PrepareNode(job, destination, phase_peers, signals, timeline);
  });
}

bool UsesCheckpoints(const env::JobConfig& config) {
  return config.runtime.checkpointing_config.enabled || config.runtime.load_checkpoint_config.enabled;
}

int RunPhases(const CliOptions& cli, SignalRouter& signals, Timeline& timeline) {
  PreparedJob job = PrepareJob(cli, cli.command.empty(), timeline);
  try {
    env::CreateDirectories(job.environment);
  } catch (const std::runtime_error& error) {
    throw LaunchFailure(kExitIo, error.what());
  }
  std::optional<storage::DestinationSpec> destination;
  if (UsesCheckpoints(job.config)) destination = ResolveCheckpointDestination(job.config, job.environment, cli.root);

  // The fabric is what nodes talk over: a single node has nothing to check or choose.
  std::optional<rendezvous::fabric::Inventory> inventory;
  std::unique_ptr<Peers> peers;
  if (job.identity.count > 1) {
    inventory = ReadFabricInventory(rendezvous::fabric::SysfsRoot(cli.sysfs_root));
    timeline.Begin("rendezvous");
    peers = JoinPeers(job.config, job.identity, job.job_id(), signals);
  }
  try {
    PrepareAfterRendezvous(job, std::move(inventory), destination, peers.get(), signals, timeline);
  } catch (const LaunchFailure& failure) {
    // The others are waiting in the ready barrier or for the seed: tell them now.
    if (peers) {
      JobOutcome outcome;
      outcome.exit_code = failure.code();
      outcome.launcher_failure = failure.what();
      peers->Report(outcome);
    }
    throw;
  }
  CheckpointPhase checkpoints;
  if (destination) checkpoints = StartCheckpoints(job.config, job.environment, *destination, job.identity, peers ? peers->store() : nullptr);

  timeline.Begin("run");
  auto grace = std::chrono::milliseconds(int64_t(job.config.launcher.grace_period_s * 1000));
  auto peer_grace = std::chrono::milliseconds(int64_t(job.config.launcher.peer_failure_grace_s * 1000));
  Supervisor supervisor(signals, grace, peer_grace);
  JobOutcome outcome = supervisor.Run(CommandsToRun(cli, job.config), job.environment.ToEnviron(),
                                      job.environment.working_dir, peers.get());
  timeline.Annotate(DescribeOutcome(outcome));
  if (peers) peers->Report(outcome);  // the other nodes stop now, not after this node's drain
  bool committed = true;
  if (checkpoints.agent) {
    timeline.Begin("drain");
    committed = DrainCheckpoints(checkpoints, job.config, outcome);
    timeline.Annotate(committed ? "committed" : "last checkpoint not committed");
  }
  int exit_code = outcome.exit_code;
  if (peers) {
    timeline.Begin("exit barrier");
    exit_code = peers->Finish(outcome, signals);
    timeline.Annotate("job exit " + std::to_string(exit_code));
  }
  if (!committed) exit_code = kExitIo;
  LogTimeline(timeline);
  return exit_code;
}

}  // namespace

int RunSubcommand(const CliOptions& cli) {
  // Before any thread exists: every thread must inherit the blocked signal mask.
  SignalRouter signals;
  Timeline timeline;
  try {
    return RunPhases(cli, signals, timeline);
  } catch (const LaunchFailure& failure) {
    // The one line saying why, then where the time went before it.
    spdlog::error("{}", failure.what());
    timeline.Annotate("failed");
    LogTimeline(timeline);
    return failure.code();
  }
}

}  // namespace bt::launcher
