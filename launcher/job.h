// The first two phases of `run` and of the subcommands that inspect a job (env, rendezvous,
// fabric, checkpoints; DESIGN.md §1): who this node is (identity) and what its job sees
// (environment), and the timeline printed at the end.
#pragma once

#include <string>

#include "env/environment.h"
#include "env/identity.h"
#include "env/job_config.h"
#include "launcher/cli.h"
#include "launcher/timeline.h"

namespace bt::launcher {

// What every subcommand knows once the first two phases are done.
struct PreparedJob {
  env::JobConfig config;
  env::NodeIdentity identity;
  env::JobEnvironment environment;

  const std::string& job_id() const { return environment.variables.at("BT_TRAINING_JOB_ID"); }
};

// Loads the config, resolves the identity and builds the environment, each a timeline
// phase. Throws LaunchFailure: 65 for a bad config, identity or secret.
PreparedJob PrepareJob(const CliOptions& cli, bool require_start_command, Timeline& timeline);

// Ends the timeline and logs it: where the time went, on every exit path.
void LogTimeline(Timeline& timeline);

}  // namespace bt::launcher
