// Step figures (issue 31 §1, optional): step numbers read from the job's output with
// `launcher.progress.step_pattern` or from its BT_HEARTBEAT_FILE, turned into steps done,
// steps redone after faults, step time percentiles and a straggler. Pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

#include "launcher/report/goodput.h"

namespace bt::launcher::report {

// launcher.progress.step_pattern: a regex with exactly one group, the step number
// ("step (\\d+)", "global_step=(\\d+)"); searched anywhere in a line.
class StepPattern {
 public:
  // Throws std::invalid_argument naming the pattern when it does not compile or has not
  // exactly one group.
  explicit StepPattern(const std::string& pattern);
  // The step a line names, or nullopt (no match, or the group is no integer).
  std::optional<int64_t> Match(std::string_view line) const;

 private:
  std::string pattern_;
  std::regex regex_;
};

// The step in a heartbeat file: its contents a bare integer ("1234\n") or a JSON object with
// an integer "step" ({"step": 1234, ...}). nullopt for anything else (an empty file, a
// file touched without a step, half a write).
std::optional<int64_t> ParseHeartbeatStep(std::string_view contents);

// Steps done and redone, step time p50/p95 over every node's steps, and the slowest node when
// its median step time exceeds the other nodes' median by more than `straggler_ratio`. A step
// time is the time between two samples divided by the steps between them; a sample whose step
// is not above the previous one (a restart resumed from a checkpoint) starts over, so restart
// time is never a step time. nullopt when no node has two samples.
std::optional<StepStats> ComputeStepStats(const std::vector<NodeSteps>& nodes, double straggler_ratio);

}  // namespace bt::launcher::report
