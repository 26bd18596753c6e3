// `bt-launch bench checkpoint|rendezvous`: figures beside a peer measured in the same run
// (docs/PERFORMANCE.md), a table and then one JSON line.
#pragma once

#include "launcher/cli.h"

namespace bt::launcher {

int BenchSubcommand(const CliOptions& cli);

}  // namespace bt::launcher
