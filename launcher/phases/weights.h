// The weights phase: every weights[] mount complete before user code runs. bt-launch stages
// file:// and object-store sources itself where no platform does (into a hidden sibling,
// renamed into place, then `.complete`), and waits for mounts a platform delivers (the
// `.complete` sentinel, no `.tmp*` files left), with progress and a deadline.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "env/environment.h"
#include "env/job_config.h"

namespace bt::launcher {

// huggingface_hub's filter_repo_objects: fnmatch on the path relative to the source (`*`
// crosses '/'), a pattern ending in '/' means everything under that folder; a path is kept
// when it matches some allow pattern (or there are none) and no ignore pattern.
bool WeightsPathSelected(const std::string& path, const std::vector<std::string>& allow,
                         const std::vector<std::string>& ignore);

struct WeightsHooks {
  // One line of progress ("staging /models/base: 1.2 of 4.0 GiB"), at most every few
  // seconds; the multi-node phase publishes it to the other nodes.
  std::function<void(const std::string&)> report;
  // Throws LaunchFailure when the launch must stop (a shutdown signal, a failed peer).
  std::function<void()> check_stop;
};

// Throws LaunchFailure: 65 for a source that cannot be staged (naming weights[i].source, a
// secret that is not the expected JSON), 74 when a mount is not complete by
// launcher.weights.timeout_s (one line naming each mount, its source and what is missing).
void PrepareWeights(const env::JobConfig& config, const env::JobEnvironment& environment, const WeightsHooks& hooks);

// A mount is complete: `.complete` present and no `.tmp*` file anywhere under it.
bool WeightsMountComplete(const std::string& mount);

}  // namespace bt::launcher
