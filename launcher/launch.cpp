#include "launcher/launch.h"

#include <cstdio>
#include <cstdlib>
#include <iostream>

#include <spdlog/spdlog.h>

#include "env/environment.h"
#include "checkpoint/uploader.h"
#include "launcher/cache_seed.h"
#include "launcher/checkpoints.h"
#include "launcher/exit_codes.h"
#include "launcher/fabric.h"
#include "launcher/log.h"
#include "launcher/nccl_preflight.h"
#include "launcher/peers.h"
#include "launcher/ready.h"
#include "launcher/signals.h"
#include "launcher/supervisor.h"
#include "launcher/timeline.h"
#include "launcher/weights.h"

namespace bt::launcher {
namespace {

// What every subcommand knows once the first two phases are done.
struct PreparedJob {
  env::JobConfig config;
  env::NodeIdentity identity;
  env::JobEnvironment environment;

  const std::string& job_id() const { return environment.variables.at("BT_TRAINING_JOB_ID"); }
};

env::JobConfig LoadConfig(const CliOptions& cli, bool require_start_command) {
  try {
    return env::LoadJobConfig(cli.config_path, std::getenv("BT_JOB_CONFIG"), require_start_command);
  } catch (const env::ConfigError& error) {
    throw LaunchFailure(kExitConfig, std::string("bad config: ") + error.what());
  }
}

env::NodeIdentity ResolveNode(const CliOptions& cli, const env::JobConfig& config) {
  try {
    std::optional<int> config_node_count;
    if (config.compute.node_count_given) config_node_count = config.compute.node_count;
    env::NodeIdentity identity = env::ResolveIdentity(cli.identity, env::ProcessEnvLookup(), config_node_count);
    log::SetNodeRank(identity.rank);
    spdlog::info("identity: {}", identity.Describe());
    return identity;
  } catch (const env::IdentityError& error) {
    throw LaunchFailure(kExitConfig, std::string("bad node identity: ") + error.what());
  }
}

env::JobEnvironment BuildEnvironment(const CliOptions& cli, const env::JobConfig& config,
                                     const env::NodeIdentity& identity) {
  try {
    env::PathLayout paths(cli.root, identity.rank);
    env::JobEnvironment environment = env::BuildJobEnvironment(config, identity, paths, env::CurrentEnviron());
    for (const auto& name : environment.secret_variables) {
      if (!log::RegisterSecret(environment.variables.at(name))) {
        spdlog::warn("secret variable {} is shorter than {} bytes: it is not redacted from the logs (too short to mask "
                     "safely); use a longer secret", name, log::kMinRedactedBytes);
      }
    }
    return environment;
  } catch (const env::SecretError& error) {
    throw LaunchFailure(kExitConfig, error.what());
  }
}

PreparedJob Prepare(const CliOptions& cli, bool require_start_command, Timeline& timeline) {
  timeline.Begin("identity");
  PreparedJob job;
  job.config = LoadConfig(cli, require_start_command);
  job.identity = ResolveNode(cli, job.config);
  if (!job.config.compute.node_count_given) job.config.compute.node_count = job.identity.count;
  timeline.Begin("environment");
  job.environment = BuildEnvironment(cli, job.config, job.identity);
  return job;
}

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

void LogTimeline(Timeline& timeline) {
  timeline.End();
  spdlog::info("timeline: {}", timeline.Render());
}

// After the rendezvous, before the first command: weights and loaded checkpoints, the
// ready barrier (its deadline is the weights deadline), then the cache seed.
void PrepareNode(const PreparedJob& job, const std::optional<checkpoint::DestinationSpec>& destination,
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

// A store exception escaping a phase becomes the launch failure that names the phase.
template <typename Phases>
void NameStoreFailures(const Timeline& timeline, Phases phases) {
  try {
    phases();
  } catch (const rendezvous::StoreTimeout& error) {
    throw StoreFailure(timeline.Current(), error);
  } catch (const rendezvous::StoreError& error) {
    throw StoreFailure(timeline.Current(), error);
  }
}

// Every phase between the rendezvous and the run, through PreRunPeers: a failed peer or a
// lost leader ends any of them at once, and a store failure names the phase it hit.
void PrepareAfterRendezvous(PreparedJob& job, std::optional<rendezvous::fabric::Inventory> inventory,
                            const std::optional<checkpoint::DestinationSpec>& destination, Peers* peers,
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
  PreparedJob job = Prepare(cli, cli.command.empty(), timeline);
  try {
    env::CreateDirectories(job.environment);
  } catch (const std::runtime_error& error) {
    throw LaunchFailure(kExitIo, error.what());
  }
  std::optional<checkpoint::DestinationSpec> destination;
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

// The roster with each node's fabric summary, and the mismatch table under it.
std::string RosterText(const std::vector<rendezvous::NodeInfo>& roster, const std::optional<FabricResult>& fabric) {
  std::map<int, std::string> summaries;
  if (fabric) {
    for (const auto& node : fabric->plan.nodes) summaries[node.rank] = node.summary;
  }
  std::string text = rendezvous::FormatRosterTable(roster, summaries);
  if (fabric && !fabric->plan.mismatches.empty()) text += "\nfabric differences:\n" + DescribeMismatches(fabric->plan);
  return text;
}

std::string RosterJson(const std::vector<rendezvous::NodeInfo>& roster, const std::optional<FabricResult>& fabric) {
  nlohmann::json json = rendezvous::RosterToJson(roster);
  if (fabric) {
    json["fabric"] = fabric->plan.ToJson();
    json["nccl_env"] = rendezvous::fabric::NcclEnvironmentToJson(fabric->nccl);
  }
  return json.dump(2) + "\n";
}

// Joins (or leads), prints the roster, and leaves through the exit barrier: the way to
// debug a cluster's rendezvous without starting any training.
int RendezvousSubcommand(const CliOptions& cli) {
  SignalRouter signals;
  Timeline timeline;
  CliOptions options = cli;
  if (cli.serve && !options.identity.node_rank) options.identity.node_rank = "0";
  PreparedJob job = Prepare(options, false, timeline);
  if (cli.serve && job.identity.rank != 0) {
    throw LaunchFailure(kExitUsage, "--serve: this node's rank is " + std::to_string(job.identity.rank) + "; only node 0 serves");
  }
  auto inventory = ReadFabricInventory(rendezvous::fabric::SysfsRoot(cli.sysfs_root));
  timeline.Begin("rendezvous");
  auto peers = JoinPeers(job.config, job.identity, job.job_id(), signals);
  timeline.Begin("fabric");
  JobOutcome outcome;
  std::optional<FabricResult> fabric;
  try {
    PreRunPeers pre_run(*peers, signals);
    NameStoreFailures(timeline, [&] {
      fabric = PlanFabricPhase(job.config, job.identity, &pre_run, std::move(inventory), job.environment);
    });
  } catch (const LaunchFailure& failure) {
    spdlog::error("{}", failure.what());
    outcome.exit_code = failure.code();
    outcome.launcher_failure = failure.what();
  }
  const auto roster = peers->Roster();
  const std::string text = cli.output_format == "json" ? RosterJson(roster, fabric) : RosterText(roster, fabric);
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
  if (outcome.launcher_failure) peers->Report(outcome);
  timeline.Begin("exit barrier");
  int code = peers->Finish(outcome, signals);
  LogTimeline(timeline);
  return code;
}

// This node's RDMA devices and what the launcher would export, without a rendezvous.
int FabricSubcommand(const CliOptions& cli) {
  Timeline timeline;
  PreparedJob job = Prepare(cli, false, timeline);
  const FabricResult fabric = InspectFabric(job.config, job.identity, rendezvous::fabric::SysfsRoot(cli.sysfs_root),
                                            job.environment);
  const std::string text = FormatFabricReport(fabric, cli.output_format == "json");
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

// The listing reads every rank's part and talks to no node, so it needs no identity: when
// none is given it reads as node 0 (the rank only places --root's node-local paths).
int CheckpointsSubcommand(const CliOptions& cli) {
  Timeline timeline;
  CliOptions options = cli;
  if (!options.identity.node_rank) options.identity.node_rank = "0";
  if (!options.identity.leader_addr) options.identity.leader_addr = "127.0.0.1";
  PreparedJob job = Prepare(options, false, timeline);
  return ListCheckpoints(job.config, job.environment, cli);
}

int UploadWorkerSubcommand(const CliOptions& cli) {
  if (!cli.destination || !cli.job_id || !cli.identity.node_rank) {
    throw LaunchFailure(kExitUsage, "upload-worker: --destination, --job-id and --node-rank are required");
  }
  checkpoint::UploaderConfig config{*cli.destination, *cli.job_id, std::stoi(*cli.identity.node_rank)};
  return checkpoint::RunUploadWorker(config, cli.parent_pid);
}

int EnvSubcommand(const CliOptions& cli) {
  Timeline timeline;
  PreparedJob job = Prepare(cli, false, timeline);
  const std::string text = cli.output_format == "json" ? job.environment.RenderJson() : job.environment.RenderShell();
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

}  // namespace bt::launcher
