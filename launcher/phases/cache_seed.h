// Cache seeding: launcher.cache.seed_commands run once per seed key, on node 0, after the
// ready barrier and before the start commands; the other nodes wait on a rendezvous key.
// Across concurrent jobs of a project, a lock in BT_PROJECT_CACHE_DIR/.bt-seed/ (an advisory
// lock plus a renewed lease, for filesystems where the lock does not work or its holder
// died) and a `<key>.done` marker make the seed run exactly once.
#pragma once

#include <string>
#include <vector>

#include "env/environment.h"
#include "env/identity.h"
#include "env/job_config.h"
#include "launcher/supervision/peers.h"
#include "launcher/supervision/signals.h"

namespace bt::launcher {

// SHA-256 (hex) of the commands and launcher.cache.seed_key.
std::string SeedKey(const std::vector<std::string>& commands, const std::string& seed_key);

// Throws LaunchFailure: on node 0 with the failed command's exit code (one line naming it),
// on the others 69 naming node 0's failure; 128+signal when stopped.
void SeedCache(const env::JobConfig& config, const env::JobEnvironment& environment, const env::NodeIdentity& identity,
               Peers* peers, SignalRouter& signals);

}  // namespace bt::launcher
