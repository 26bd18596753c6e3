#include "tests/launcher/report/synthetic_jobs.h"

#include <algorithm>

namespace bt::launcher::report::testing {

Cycle Ran(int64_t cycle, double start_s, double end_s, const std::string& cause, int node, const std::string& resumed_from) {
  Cycle ran;
  ran.cycle = cycle;
  ran.start_s = start_s;
  ran.end_s = end_s;
  ran.cause = cause;
  ran.node = node;
  ran.host = node >= 0 ? "host-" + std::to_string(node) : "";
  ran.message = cause == "success" ? "" : "exit code 1";
  ran.resumed_from = resumed_from;
  return ran;
}

Cycle Hung(int64_t cycle, double start_s, double end_s, int node, double stall_s, double detected_s,
           const std::string& resumed_from) {
  Cycle hung = Ran(cycle, start_s, end_s, "hang", node, resumed_from);
  hung.stall_start_s = stall_s;
  hung.detected_s = detected_s;
  hung.message = "no progress for " + std::to_string(int(detected_s - stall_s)) + " s";
  return hung;
}

Commit Saved(const std::string& name, double saved_s, double committed_s) { return Commit{name, saved_s, committed_s}; }

namespace {

// The phases before the first run, squeezed into [0, first_run_s).
std::vector<Phase> StartPhases(double first_run_s, double skew_s) {
  static const char* names[] = {"identity", "environment", "rendezvous", "weights", "fabric", "health", "ready", "cache seed"};
  std::vector<Phase> phases;
  const double slice = first_run_s / 8;
  for (int i = 0; i < 8; ++i) {
    const double start = std::min(first_run_s, i * slice + (i ? skew_s : 0));
    phases.push_back(Phase{names[i], start, std::min(first_run_s, (i + 1) * slice)});
  }
  return phases;
}

}  // namespace

JobRecord SyntheticJob(int nodes, std::vector<Cycle> cycles, std::vector<Commit> commits, double wall_end_s,
                       double training_end_s) {
  JobRecord record;
  record.wall_end_s = wall_end_s;
  record.training_end_s = training_end_s;
  record.commits = std::move(commits);
  for (int node = 0; node < nodes; ++node) {
    NodeLane lane{node, node, "host-" + std::to_string(node), {}};
    const double skew_s = 0.001 * node;
    const double first_run_s = cycles.empty() ? wall_end_s : std::max(0.0, cycles.front().start_s);
    lane.phases = StartPhases(first_run_s, skew_s);
    double previous_end_s = first_run_s;
    for (size_t i = 0; i < cycles.size(); ++i) {
      const Cycle& cycle = cycles[i];
      if (i > 0 && cycle.start_s > previous_end_s) {
        const double middle = (previous_end_s + cycle.start_s) / 2;
        lane.phases.push_back(Phase{"resume", previous_end_s, middle});
        lane.phases.push_back(Phase{"load checkpoints", middle, cycle.start_s - skew_s});
      }
      if (cycle.start_s >= 0) lane.phases.push_back(Phase{"run", cycle.start_s, cycle.end_s + skew_s});
      previous_end_s = cycle.end_s;
    }
    const double drain_start_s = std::min(wall_end_s, previous_end_s + skew_s);
    const double barrier_s = std::max(drain_start_s, wall_end_s - 0.5);
    lane.phases.push_back(Phase{"drain", drain_start_s, barrier_s});
    lane.phases.push_back(Phase{"exit barrier", barrier_s, wall_end_s});
    record.lanes.push_back(std::move(lane));
  }
  record.cycles = std::move(cycles);
  return record;
}

double SumOfBuckets(const Goodput& goodput) { return goodput.goodput_s + goodput.badput.Total(); }

size_t Count(const std::string& text, const std::string& needle) {
  size_t count = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + needle.size())) ++count;
  return count;
}

}  // namespace bt::launcher::report::testing
