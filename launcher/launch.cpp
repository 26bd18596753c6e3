#include "launcher/launch.h"

#include <cstdio>
#include <cstdlib>
#include <iostream>

#include <spdlog/spdlog.h>

#include "env/environment.h"
#include "launcher/exit_codes.h"
#include "launcher/log.h"
#include "launcher/signals.h"
#include "launcher/supervisor.h"
#include "launcher/timeline.h"

namespace bt::launcher {
namespace {

// What every subcommand knows once the first two phases are done.
struct PreparedJob {
  env::JobConfig config;
  env::NodeIdentity identity;
  env::JobEnvironment environment;
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
    env::NodeIdentity identity = env::ResolveIdentity(cli.identity, env::ProcessEnvLookup(), config.compute.node_count);
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
    for (const auto& name : environment.secret_variables) log::RegisterSecret(environment.variables.at(name));
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

}  // namespace

int RunSubcommand(const CliOptions& cli) {
  // Before any thread exists: every thread must inherit the blocked signal mask.
  SignalRouter signals;
  Timeline timeline;
  PreparedJob job = Prepare(cli, cli.command.empty(), timeline);
  try {
    env::CreateDirectories(job.environment);
  } catch (const std::runtime_error& error) {
    throw LaunchFailure(kExitIo, error.what());
  }

  timeline.Begin("run");
  auto grace = std::chrono::milliseconds(int64_t(job.config.launcher.grace_period_s * 1000));
  Supervisor supervisor(signals, grace);
  JobOutcome outcome = supervisor.Run(CommandsToRun(cli, job.config), job.environment.ToEnviron(),
                                      job.environment.working_dir, nullptr);
  timeline.Annotate(DescribeOutcome(outcome));
  timeline.End();
  spdlog::info("timeline: {}", timeline.Render());
  return outcome.exit_code;
}

int EnvSubcommand(const CliOptions& cli) {
  Timeline timeline;
  PreparedJob job = Prepare(cli, false, timeline);
  const std::string text = cli.output_format == "json" ? job.environment.RenderJson() : job.environment.RenderShell();
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

}  // namespace bt::launcher

namespace bt::launcher {
int RendezvousSubcommand(const CliOptions&) { throw LaunchFailure(kExitUsage, "rendezvous: not built yet"); }
}  // namespace bt::launcher
