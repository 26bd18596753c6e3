#include "launcher/tools/commands.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <map>
#include <optional>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "checkpoint/uploader.h"
#include "launcher/exit_codes.h"
#include "launcher/job.h"
#include "launcher/phases/checkpoints.h"
#include "launcher/phases/fabric.h"
#include "launcher/phases/ready.h"
#include "launcher/report/goodput_json.h"
#include "launcher/report/html_report.h"
#include "launcher/supervision/peers.h"
#include "launcher/supervision/signals.h"
#include "launcher/timeline.h"
#include "storage/destination.h"
#include "storage/durable_file.h"

namespace bt::launcher {
namespace {

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

}  // namespace

// Joins (or leads), prints the roster, and leaves through the exit barrier: the way to
// debug a cluster's rendezvous without starting any training.
int RendezvousSubcommand(const CliOptions& cli) {
  SignalRouter signals;
  Timeline timeline;
  CliOptions options = cli;
  if (cli.serve && !options.identity.node_rank) options.identity.node_rank = "0";
  PreparedJob job = PrepareJob(options, false, timeline);
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
      // Node 0 sent only its verdict; this tool shows every node's selection.
      if (job.identity.rank != 0 && fabric->plan.checked()) fabric->plan = ReadWholePlan(job.config, pre_run, job.identity.count, fabric->gids);
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
  PreparedJob job = PrepareJob(cli, false, timeline);
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
  PreparedJob job = PrepareJob(options, false, timeline);
  return ListCheckpoints(job.config, job.environment, cli);
}

namespace {

// A goodput.json's text and where it came from: --input, or the one node 0 uploaded beside
// the job's checkpoints. Throws LaunchFailure(74) when it cannot be read or is not there.
std::pair<std::string, std::string> GoodputText(const CliOptions& cli) {
  if (cli.input) {
    std::ifstream file(*cli.input, std::ios::binary);
    std::stringstream text;
    text << file.rdbuf();
    if (!file) throw LaunchFailure(kExitIo, "report: cannot read " + *cli.input + ": " + std::strerror(errno));
    return {text.str(), *cli.input};
  }
  Timeline timeline;
  CliOptions options = cli;
  if (!options.identity.node_rank) options.identity.node_rank = "0";
  if (!options.identity.leader_addr) options.identity.leader_addr = "127.0.0.1";
  PreparedJob job = PrepareJob(options, false, timeline);
  const std::string job_id = cli.job_id.value_or(job.job_id());
  try {
    env::ValidateJobId(job_id, cli.job_id ? "--job-id" : "BT_TRAINING_JOB_ID");
  } catch (const env::ConfigError& error) {
    throw LaunchFailure(kExitConfig, error.what());
  }
  const storage::DestinationSpec spec = ResolveCheckpointDestination(job.config, job.environment, cli.root, cli.destination);
  const std::string path = job_id + "/.bt-report/goodput.json";
  std::optional<std::string> text;
  try {
    text = storage::OpenDestination(spec)->ReadText(path);
  } catch (const storage::DestinationError& error) {
    throw LaunchFailure(kExitIo, "report: cannot read " + spec.uri + "/" + path + ": " + error.what());
  }
  if (!text) {
 throw LaunchFailure(kExitIo, "report: " + spec.uri + "/" + path + " does not exist (node 0 writes it when the "
                                      "job ends; give a local file with --input)");
  }
  return {*text, spec.uri + "/" + path};
}

}  // namespace

int ReportSubcommand(const CliOptions& cli) {
  const auto [text, origin] = GoodputText(cli);
  report::Goodput goodput;
  try {
    goodput = report::ParseGoodputJson(text, origin);
  } catch (const report::GoodputJsonError& error) {
    throw LaunchFailure(kExitConfig, std::string("report: ") + error.what());
  }
  try {
    storage::WriteFileAtomically(cli.out, report::RenderHtmlReport(goodput));
  } catch (const std::exception& error) {
    throw LaunchFailure(kExitIo, std::string("report: cannot write ") + cli.out + ": " + error.what());
  }
  std::printf("%s", report::FormatGoodputTable(goodput).c_str());
  std::printf("report: %s (from %s)\n", cli.out.c_str(), origin.c_str());
  return 0;
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
  PreparedJob job = PrepareJob(cli, false, timeline);
  // The user's own BT_CHECKPOINT_DESTINATION may hold credentials, which `run` refuses
  // (65); shown here, they would reach a terminal or a CI log.
  if (auto destination = job.environment.variables.find("BT_CHECKPOINT_DESTINATION");
      destination != job.environment.variables.end()) {
    destination->second = storage::MaskCredentials(destination->second);
  }
  const std::string text = cli.output_format == "json" ? job.environment.RenderJson() : job.environment.RenderShell();
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

}  // namespace bt::launcher
