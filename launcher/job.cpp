#include "launcher/job.h"

#include <cstdlib>
#include <optional>

#include <spdlog/spdlog.h>

#include "launcher/exit_codes.h"
#include "launcher/log.h"

namespace bt::launcher {
namespace {

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
    env::NodeIdentity identity =
        env::ResolveIdentity(cli.identity, env::ProcessEnvLookup(), config_node_count, config.launcher.spares);
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
  } catch (const env::ConfigError& error) {
    throw LaunchFailure(kExitConfig, std::string("bad config: ") + error.what());
  }
}

}  // namespace

PreparedJob PrepareJob(const CliOptions& cli, bool require_start_command, Timeline& timeline) {
  timeline.Begin("identity");
  PreparedJob job;
  job.config = LoadConfig(cli, require_start_command);
  job.identity = ResolveNode(cli, job.config);
  if (!job.config.compute.node_count_given) job.config.compute.node_count = job.identity.training_count();
  timeline.Begin("environment");
  job.environment = BuildEnvironment(cli, job.config, job.identity);
  return job;
}

void LogTimeline(Timeline& timeline) {
  timeline.End();
  spdlog::info("timeline: {}", timeline.Render());
}

}  // namespace bt::launcher
