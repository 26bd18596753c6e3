// `bt-launch bench rendezvous`: node 0's store under N nodes arriving together.
#pragma once

#include "launcher/cli.h"

namespace bt::launcher {

int BenchRendezvous(const CliOptions& cli);

}  // namespace bt::launcher
