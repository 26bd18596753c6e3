#include "launcher/report/steps.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace bt::launcher::report {
namespace {

std::optional<int64_t> ParseInteger(std::string_view text) {
  int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return value;
}

std::string_view Trimmed(std::string_view text) {
  const char* space = " \t\r\n";
  const size_t first = text.find_first_not_of(space);
  if (first == std::string_view::npos) return {};
  return text.substr(first, text.find_last_not_of(space) - first + 1);
}

// Linear interpolation between the closest ranks; `values` sorted.
double Percentile(const std::vector<double>& values, double fraction) {
  if (values.empty()) return 0;
  const double rank = fraction * double(values.size() - 1);
  const size_t below = size_t(std::floor(rank));
  const size_t above = std::min(below + 1, values.size() - 1);
  return values[below] + (values[above] - values[below]) * (rank - double(below));
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return Percentile(values, 0.5);
}

// One node's samples walked in time order.
struct NodeWalk {
  int64_t done = 0;
  int64_t redone = 0;
  std::vector<double> step_times;  // seconds per step, one per interval in which steps advanced
};

NodeWalk WalkNode(std::vector<StepSample> samples) {
  NodeWalk walk;
  std::stable_sort(samples.begin(), samples.end(),
                   [](const StepSample& a, const StepSample& b) { return a.time_s < b.time_s; });
  if (samples.empty()) return walk;
  StepSample previous = samples.front();
  int64_t highest = previous.step;
  for (size_t i = 1; i < samples.size(); ++i) {
    const StepSample& sample = samples[i];
    // Not forwards: a restart went back to a checkpoint; the next interval starts here.
    if (sample.step <= previous.step) {
      previous = sample;
      continue;
    }
    const int64_t advanced = sample.step - previous.step;
    const int64_t new_steps = std::max<int64_t>(0, sample.step - std::max(previous.step, highest));
    walk.done += new_steps;
    walk.redone += advanced - new_steps;
    // Across a restart (a job resumed right after the last step it printed) the interval
    // holds the restart, not a step (review 10, F3).
    const double elapsed_s = sample.time_s - previous.time_s;
    if (elapsed_s > 0 && sample.cycle == previous.cycle) walk.step_times.push_back(elapsed_s / double(advanced));
    highest = std::max(highest, sample.step);
    previous = sample;
  }
  return walk;
}

}  // namespace

StepPattern::StepPattern(const std::string& pattern) : pattern_(pattern) {
  try {
    regex_ = std::regex(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& error) {
    throw std::invalid_argument("launcher.progress.step_pattern \"" + pattern + "\" is no regular expression: " + error.what());
  }
  if (regex_.mark_count() != 1) {
    throw std::invalid_argument("launcher.progress.step_pattern \"" + pattern + "\" has " +
                                std::to_string(regex_.mark_count()) +
                                " groups: it needs exactly one, around the step number (\"step (\\\\d+)\")");
  }
}

std::optional<int64_t> StepPattern::Match(std::string_view line) const {
  std::match_results<std::string_view::const_iterator> match;
  if (!std::regex_search(line.begin(), line.end(), match, regex_)) return std::nullopt;
  if (!match[1].matched) return std::nullopt;
  return ParseInteger(std::string_view(&*match[1].first, size_t(match[1].length())));
}

std::optional<int64_t> ParseHeartbeatStep(std::string_view contents) {
  const std::string_view text = Trimmed(contents);
  if (text.empty()) return std::nullopt;
  if (text.front() != '{') return ParseInteger(text);
  const nlohmann::json parsed = nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (!parsed.is_object()) return std::nullopt;
  const auto step = parsed.find("step");
  if (step == parsed.end() || !step->is_number_integer()) return std::nullopt;
  return step->get<int64_t>();
}

std::optional<StepStats> ComputeStepStats(const std::vector<NodeSteps>& nodes, double straggler_ratio) {
  StepStats stats;
  std::vector<double> every_step_time;
  for (const NodeSteps& node : nodes) {
    const NodeWalk walk = WalkNode(node.samples);
    // Data-parallel nodes run the same steps: the job's count is the node that saw the most.
    stats.steps_done = std::max(stats.steps_done, walk.done);
    stats.steps_redone = std::max(stats.steps_redone, walk.redone);
    if (walk.step_times.empty()) continue;
    every_step_time.insert(every_step_time.end(), walk.step_times.begin(), walk.step_times.end());
    stats.nodes.push_back(NodeStepTime{node.node, Median(walk.step_times), int64_t(walk.step_times.size())});
  }
  if (every_step_time.empty()) return std::nullopt;
  std::sort(every_step_time.begin(), every_step_time.end());
  stats.step_p50_s = Percentile(every_step_time, 0.5);
  stats.step_p95_s = Percentile(every_step_time, 0.95);
  // Each node against the median of the other nodes' medians: one slow node cannot pull the
  // figure it is compared with.
  for (size_t i = 0; stats.nodes.size() >= 2 && i < stats.nodes.size(); ++i) {
    std::vector<double> others;
    for (size_t j = 0; j < stats.nodes.size(); ++j) {
      if (j != i) others.push_back(stats.nodes[j].median_s);
    }
    const double others_median = Median(others);
    if (others_median <= 0) continue;
    const double ratio = stats.nodes[i].median_s / others_median;
    if (ratio > straggler_ratio && ratio > stats.straggler_ratio) {
      stats.straggler_node = stats.nodes[i].node;
      stats.straggler_ratio = ratio;
    }
  }
  return stats;
}

}  // namespace bt::launcher::report
