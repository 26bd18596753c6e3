// The phase sequence of one launch (DESIGN.md §1) behind each subcommand.
#pragma once

#include "launcher/cli.h"

namespace bt::launcher {

int RunSubcommand(const CliOptions& cli);
int EnvSubcommand(const CliOptions& cli);
int RendezvousSubcommand(const CliOptions& cli);
int CheckpointsSubcommand(const CliOptions& cli);
int UploadWorkerSubcommand(const CliOptions& cli);
int BenchSubcommand(const CliOptions& cli);
int FabricSubcommand(const CliOptions& cli);

}  // namespace bt::launcher
