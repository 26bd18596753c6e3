#include "launcher/report/goodput.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <tuple>

#include "launcher/report/steps.h"

namespace bt::launcher::report {
namespace {

// Within this, two times are the same (the launcher's clocks are read to the microsecond).
constexpr double kSameTimeS = 1e-6;

// `value` inside [low, high]; NaN is `low` (a missing time never moves anything forward).
double Clamp(double value, double low, double high) {
  if (!(value >= low)) return low;
  return value > high ? high : value;
}

std::string Fixed(double value, int decimals) { return FormatFixed(value, decimals); }

bool HasRun(const Cycle& cycle) { return std::isfinite(cycle.start_s) && cycle.start_s >= 0; }

// Walks [0, wall] once, forwards only: each bucket gets the span from where the walk stands to
// its end, so the buckets add up to the wall time whatever the input's times say.
class Walk {
 public:
  explicit Walk(double wall_s) : wall_s_(wall_s) {}
  // Moves to `to` (never backwards, never past the wall); the seconds covered.
  double AdvanceTo(double to) {
    const double next = Clamp(to, at_s_, wall_s_);
    const double covered = next - at_s_;
    at_s_ = next;
    return covered;
  }
  double at_s() const { return at_s_; }

 private:
  double wall_s_;
  double at_s_ = 0;
};

std::vector<NodeLane> ClampedLanes(const std::vector<NodeLane>& lanes, double wall_s, std::vector<std::string>& notes) {
  std::vector<NodeLane> clamped = lanes;
  for (NodeLane& lane : clamped) {
    for (Phase& phase : lane.phases) {
      phase.start_s = Clamp(phase.start_s, 0, wall_s);
      if (phase.end_s < phase.start_s) {
        notes.push_back("node " + std::to_string(lane.node) + "'s phase " + phase.name +
                        " ends before it starts: drawn as zero-length");
      }
      phase.end_s = Clamp(phase.end_s, phase.start_s, wall_s);
    }
    std::stable_sort(lane.phases.begin(), lane.phases.end(),
                     [](const Phase& a, const Phase& b) { return a.start_s < b.start_s; });
  }
  // Spares that never trained (node -1) after every training rank.
  std::stable_sort(clamped.begin(), clamped.end(), [](const NodeLane& a, const NodeLane& b) {
    return std::make_tuple(a.node < 0, a.node, a.slot) < std::make_tuple(b.node < 0, b.node, b.slot);
  });
  return clamped;
}

std::vector<Commit> ClampedCommits(const std::vector<Commit>& commits, double wall_s, std::vector<std::string>& notes) {
  std::vector<Commit> clamped;
  for (Commit commit : commits) {
    // Committed after the last launcher left: no restart of this job could resume from it.
    if (!(commit.committed_s <= wall_s)) {
      notes.push_back("checkpoint " + commit.name + " is committed after the job's end: not counted");
      continue;
    }
    commit.saved_s = Clamp(commit.saved_s, 0, wall_s);
    if (commit.committed_s < commit.saved_s) {
      notes.push_back("checkpoint " + commit.name + " is committed before it was saved: taken as committed when saved");
    }
    commit.committed_s = Clamp(commit.committed_s, commit.saved_s, wall_s);
    clamped.push_back(std::move(commit));
  }
  std::stable_sort(clamped.begin(), clamped.end(),
                   [](const Commit& a, const Commit& b) { return a.committed_s < b.committed_s; });
  return clamped;
}

// Cycles in the order they ran (by run start; a cycle that never reached its run by its end),
// every time inside the job, none ending before it starts, none starting before the previous
// run ended.
std::vector<Cycle> OrderedCycles(const std::vector<Cycle>& cycles, double wall_s, std::vector<std::string>& notes) {
  std::vector<Cycle> ordered = cycles;
  auto when = [](const Cycle& cycle) { return HasRun(cycle) ? cycle.start_s : cycle.end_s; };
  if (!std::is_sorted(ordered.begin(), ordered.end(), [&](const Cycle& a, const Cycle& b) { return when(a) < when(b); })) {
    notes.push_back("cycles were not in the order they ran: sorted by their run's start");
  }
  std::stable_sort(ordered.begin(), ordered.end(), [&](const Cycle& a, const Cycle& b) {
    return std::make_tuple(when(a), a.cycle) < std::make_tuple(when(b), b.cycle);
  });
  double previous_end_s = 0;
  for (Cycle& cycle : ordered) {
    const std::string name = "cycle " + std::to_string(cycle.cycle);
    if (HasRun(cycle)) {
      if (cycle.start_s < previous_end_s) {
        notes.push_back(name + " starts at " + Fixed(cycle.start_s, 3) + " s, before the previous cycle ended at " +
                        Fixed(previous_end_s, 3) + " s: taken from there");
      }
      cycle.start_s = Clamp(cycle.start_s, previous_end_s, wall_s);
    }
    const double start_s = HasRun(cycle) ? cycle.start_s : previous_end_s;
    if (cycle.end_s < start_s) {
      notes.push_back(name + " ends at " + Fixed(cycle.end_s, 3) + " s, before it starts at " + Fixed(start_s, 3) +
                      " s: taken as zero-length");
    }
    cycle.end_s = Clamp(cycle.end_s, start_s, wall_s);
    if (cycle.stall_start_s) cycle.stall_start_s = Clamp(*cycle.stall_start_s, 0, wall_s);
    if (cycle.detected_s) cycle.detected_s = Clamp(*cycle.detected_s, 0, wall_s);
    previous_end_s = cycle.end_s;
  }
  return ordered;
}

// The newest commit named `name` that holds state from no later than `not_after_s` (a name can
// be saved again in every cycle: `state.pt`).
const Commit* NewestNamed(const std::vector<Commit>& commits, const std::string& name, double not_after_s) {
  const Commit* newest = nullptr;
  for (const Commit& commit : commits) {
    if (commit.name != name || commit.saved_s > not_after_s + kSameTimeS) continue;
    if (!newest || commit.saved_s >= newest->saved_s) newest = &commit;
  }
  return newest;
}

// The newest checkpoint saved during [start_s, end_s] and committed before the job ended.
const Commit* NewestSavedDuring(const std::vector<Commit>& commits, double start_s, double end_s, double job_end_s) {
  const Commit* newest = nullptr;
  for (const Commit& commit : commits) {
    if (commit.saved_s < start_s - kSameTimeS || commit.saved_s > end_s + kSameTimeS) continue;
    if (commit.committed_s > job_end_s + kSameTimeS) continue;
    if (!newest || commit.saved_s >= newest->saved_s) newest = &commit;
  }
  return newest;
}

struct Kept {
  std::string name;  // "" when nothing of the cycle was kept
  double until_s;    // the end of its goodput
};

// What of a failed cycle's run survived: see goodput.h for the rule.
Kept KeptOf(const Cycle& failed, const Cycle* next, const std::vector<Commit>& commits, double wall_s,
            std::vector<std::string>& notes) {
  const std::string name = "cycle " + std::to_string(failed.cycle);
  const Kept nothing{"", failed.start_s};
  const Commit* by_rule = NewestSavedDuring(commits, failed.start_s, failed.end_s, wall_s);
  if (!next) {
    if (!by_rule) return nothing;
    return Kept{by_rule->name, Clamp(by_rule->saved_s, failed.start_s, failed.end_s)};
  }
  if (next->resumed_from.empty()) {
    if (by_rule) {
      notes.push_back(name + "'s checkpoint " + by_rule->name + " was committed, but cycle " +
                      std::to_string(next->cycle) + " resumed from none: its progress is counted as lost");
    }
    return nothing;
  }
  const Commit* resumed = NewestNamed(commits, next->resumed_from, failed.end_s);
  if (!resumed) {
    notes.push_back("cycle " + std::to_string(next->cycle) + " resumed from " + next->resumed_from +
                    ", which is in no commit: " + name + " is judged by its commits");
    if (!by_rule) return nothing;
    return Kept{by_rule->name, Clamp(by_rule->saved_s, failed.start_s, failed.end_s)};
  }
  // Resumed from a checkpoint saved before this run: the whole run was redone.
  if (resumed->saved_s < failed.start_s - kSameTimeS) return nothing;
  return Kept{resumed->name, Clamp(resumed->saved_s, failed.start_s, failed.end_s)};
}

// Splits a failed cycle's run (and its hang) between goodput, lost work and hang; the walk
// stands at its run start and ends at its fault (or the hang's detection).
void ShareFailedRun(CycleShare& share, const Cycle* next, const std::vector<Commit>& commits, double wall_s,
                    Walk& walk, std::vector<std::string>& notes) {
  const Cycle& cycle = share.cycle;
  const Kept kept = KeptOf(cycle, next, commits, wall_s, notes);
  share.kept = kept.name;
  share.goodput_s = walk.AdvanceTo(kept.until_s);
  share.kept_s = walk.at_s();
  if (cycle.cause != "hang") {
    share.lost_work_s = walk.AdvanceTo(cycle.end_s);
    return;
  }
  if (!cycle.stall_start_s) {
    notes.push_back("cycle " + std::to_string(cycle.cycle) +
                    " hung with no stall start: its run up to the fault counts as lost work");
  }
  // No progress after the stall began: the job's time from there on is the hang's.
  share.lost_work_s = walk.AdvanceTo(cycle.stall_start_s.value_or(cycle.end_s));
  share.hang_s = walk.AdvanceTo(cycle.detected_s.value_or(cycle.end_s));
}

// The last cycle ended in success: its whole run is goodput, up to the end of training.
void ShareSuccessfulRun(CycleShare& share, double training_end_s, Walk& walk) {
  share.goodput_s = walk.AdvanceTo(training_end_s);
  share.kept_s = walk.at_s();
}

}  // namespace

std::string FormatFixed(double value, int decimals) {
  char text[400];  // DBL_MAX in fixed notation is 309 digits
  const auto [end, error] = std::to_chars(text, text + sizeof text, value, std::chars_format::fixed, decimals);
  if (error != std::errc()) return "?";
  return std::string(text, end);
}

std::string FormatSeconds(double seconds) {
  if (!std::isfinite(seconds)) return "?";
  const bool negative = seconds < 0;
  const double magnitude = std::fabs(seconds);
  char text[48];
  if (magnitude < 10) {
    std::snprintf(text, sizeof text, "%.2f s", magnitude);
  } else if (magnitude < 120) {
    std::snprintf(text, sizeof text, "%.1f s", magnitude);
  } else {
    const long long whole = std::llround(magnitude);
    if (whole < 3600) {
      std::snprintf(text, sizeof text, "%lldm%02llds", whole / 60, whole % 60);
    } else {
      std::snprintf(text, sizeof text, "%lldh%02lldm%02llds", whole / 3600, whole / 60 % 60, whole % 60);
    }
  }
  return negative ? "-" + std::string(text) : std::string(text);
}

Goodput ComputeGoodput(const JobRecord& record) {
  Goodput result;
  if (!std::isfinite(record.wall_end_s) || record.wall_end_s < 0) {
    result.notes.push_back("the job's end (wall_end_s) is not a time: taken as a zero-length job");
  }
  const double wall_s = Clamp(record.wall_end_s, 0, std::isfinite(record.wall_end_s) ? record.wall_end_s : 0);
  result.wall_s = wall_s;
  result.lanes = ClampedLanes(record.lanes, wall_s, result.notes);
  result.commits = ClampedCommits(record.commits, wall_s, result.notes);
  const std::vector<Cycle> cycles = OrderedCycles(record.cycles, wall_s, result.notes);

  Walk walk(wall_s);
  result.cycles.reserve(cycles.size());
  // Restart time goes to the cycle whose fault caused it: the last one that ran.
  std::optional<size_t> last_run;
  auto spend_gap_until = [&](double until_s) {
    const double gap = walk.AdvanceTo(until_s);
    if (last_run) {
      result.cycles[*last_run].restart_s += gap;
      result.badput.restart_s += gap;
    } else {
      result.badput.prepare_s += gap;
    }
  };
  for (size_t i = 0; i < cycles.size(); ++i) {
    result.cycles.push_back(CycleShare{cycles[i], "", 0, 0, 0, 0, 0});
    CycleShare& share = result.cycles.back();
    const Cycle& cycle = share.cycle;
    if (!HasRun(cycle)) {
      // Failed before its run (a resume load, the barrier): the time is the restart's.
      spend_gap_until(cycle.end_s);
      share.cycle.start_s = share.kept_s = walk.at_s();
      continue;
    }
    spend_gap_until(cycle.start_s);
    const bool last = i + 1 == cycles.size();
    if (cycle.cause == "success") {
      double end_s = cycle.end_s;
      if (last && record.training_end_s >= 0) {
        if (std::fabs(record.training_end_s - cycle.end_s) > kSameTimeS) {
          result.notes.push_back("the last cycle ends at " + Fixed(cycle.end_s, 3) + " s, training at " +
                                 Fixed(record.training_end_s, 3) + " s: its goodput runs to the end of training");
        }
        end_s = record.training_end_s;
      }
      ShareSuccessfulRun(share, end_s, walk);
    } else {
      ShareFailedRun(share, last ? nullptr : &cycles[i + 1], result.commits, wall_s, walk, result.notes);
    }
    result.goodput_s += share.goodput_s;
    result.badput.lost_work_s += share.lost_work_s;
    result.badput.hang_s += share.hang_s;
    last_run = i;
  }
  // Before any run, the whole job was preparation; after the last, the drain.
  result.training_end_s = walk.at_s();
  if (!last_run) {
    result.badput.prepare_s += walk.AdvanceTo(wall_s);
  } else {
    result.badput.drain_s += walk.AdvanceTo(wall_s);
  }
  result.goodput_ratio = wall_s > 0 ? result.goodput_s / wall_s : 0;
  if (!record.steps.empty()) result.steps = ComputeStepStats(record.steps, record.straggler_ratio);
  return result;
}

std::string FormatGoodputTable(const Goodput& goodput) {
  auto share = [&](double seconds) { return goodput.wall_s > 0 ? Fixed(100 * seconds / goodput.wall_s, 1) + "%" : "-"; };
  auto row = [&](const char* name, double seconds) {
    char line[160];
    std::snprintf(line, sizeof line, "  %-10s %12s %10.1f s %7s\n", name, FormatSeconds(seconds).c_str(), seconds,
                  share(seconds).c_str());
    return std::string(line);
  };
  std::string text = "goodput " + FormatSeconds(goodput.goodput_s) + " of " + FormatSeconds(goodput.wall_s) +
                     " wall time (" + share(goodput.goodput_s) + ")\n";
  text += row("goodput", goodput.goodput_s);
  text += row("prepare", goodput.badput.prepare_s);
  text += row("restart", goodput.badput.restart_s);
  text += row("lost work", goodput.badput.lost_work_s);
  text += row("hang", goodput.badput.hang_s);
  text += row("drain", goodput.badput.drain_s);
  text += row("wall", goodput.wall_s);
  if (!goodput.cycles.empty()) {
    size_t host_width = 4;
    for (const CycleShare& share_of : goodput.cycles) host_width = std::max(host_width, std::min<size_t>(share_of.cycle.host.size(), 40));
    char line[512];
    std::snprintf(line, sizeof line, "  %-5s %-9s %4s %-*s %10s %10s %10s %10s %10s %10s  %s\n", "cycle", "cause", "node",
                  int(host_width), "host", "start", "end", "goodput", "lost work", "hang", "restart", "kept");
    text += line;
    for (const CycleShare& cycle : goodput.cycles) {
      std::snprintf(line, sizeof line, "  %-5lld %-9s %4s %-*s %10s %10s %10s %10s %10s %10s  %s\n",
                    static_cast<long long>(cycle.cycle.cycle), cycle.cycle.cause.c_str(),
                    cycle.cycle.node >= 0 ? std::to_string(cycle.cycle.node).c_str() : "-", int(host_width),
                    cycle.cycle.host.substr(0, host_width).c_str(), Fixed(cycle.cycle.start_s, 1).c_str(),
                    Fixed(cycle.cycle.end_s, 1).c_str(), FormatSeconds(cycle.goodput_s).c_str(),
                    FormatSeconds(cycle.lost_work_s).c_str(), FormatSeconds(cycle.hang_s).c_str(),
                    FormatSeconds(cycle.restart_s).c_str(), cycle.kept.empty() ? "-" : cycle.kept.c_str());
      text += line;
    }
  }
  if (goodput.steps) {
    const StepStats& steps = *goodput.steps;
    text += "  steps " + std::to_string(steps.steps_done) + " done, " + std::to_string(steps.steps_redone) +
            " redone after faults; step time p50 " + FormatSeconds(steps.step_p50_s) + ", p95 " +
            FormatSeconds(steps.step_p95_s) + "\n";
    if (steps.straggler_node) {
      text += "  straggler: node " + std::to_string(*steps.straggler_node) + " (median step " +
              Fixed(steps.straggler_ratio, 2) + "x the other nodes')\n";
    }
  }
  for (const std::string& note : goodput.notes) text += "  note: " + note + "\n";
  return text;
}

}  // namespace bt::launcher::report
