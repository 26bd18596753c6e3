// `bt-launch run`: the phase sequence of one launch (DESIGN.md §1), from identity to the
// exit barrier. The other subcommands are in tools/.
#pragma once

#include "launcher/cli.h"

namespace bt::launcher {

int RunSubcommand(const CliOptions& cli);

}  // namespace bt::launcher
