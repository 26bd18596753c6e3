#include "launcher/report/recorder.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace bt::launcher::report {
namespace {

using json = nlohmann::json;

JobNs WallNs(std::chrono::system_clock::time_point when) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(when.time_since_epoch()).count();
}

const json& Field(const json& object, const char* name, json::value_t type, const std::string& where) {
  const auto found = object.find(name);
  if (found == object.end()) throw std::invalid_argument(where + name + ": missing");
  const bool integer_wanted = type == json::value_t::number_integer;
  const bool type_ok = integer_wanted ? found->is_number_integer() : found->type() == type;
  if (!type_ok) throw std::invalid_argument(where + name + ": expected " + (integer_wanted ? "an integer" : json(type).type_name()));
  return *found;
}

}  // namespace

JobClock::JobClock() : anchor_steady_(std::chrono::steady_clock::now()), anchor_wall_ns_(WallNs(std::chrono::system_clock::now())) {}

JobNs JobClock::At(std::chrono::steady_clock::time_point when) const {
  return anchor_wall_ns_ + std::chrono::duration_cast<std::chrono::nanoseconds>(when - anchor_steady_).count() +
         offset_ns_.load(std::memory_order_relaxed);
}

JobNs JobClock::FromWall(std::chrono::system_clock::time_point when) const {
  return WallNs(when) + offset_ns_.load(std::memory_order_relaxed);
}

void StepLog::BeginCycle(int64_t cycle) {
  std::lock_guard lock(mutex_);
  cycle_ = cycle;
}

void StepLog::Note(JobNs at, int64_t step) {
  if (step < 0) return;
  std::lock_guard lock(mutex_);
  if (!samples_.empty() && samples_.back().step == step && samples_.back().cycle == cycle_) return;
  if (samples_.size() >= kMaxStepSamples) {
    // Every other one, but never the first of a cycle: where a restart went back stays known.
    size_t kept = 0;
    for (size_t i = 0; i < samples_.size(); ++i) {
      if (i % 2 == 0 || samples_[i].cycle != samples_[i - 1].cycle) samples_[kept++] = samples_[i];
    }
    samples_.resize(kept);
  }
  samples_.push_back({at, step, cycle_});
}

std::vector<StepLogSample> StepLog::Samples() const {
  std::lock_guard lock(mutex_);
  return samples_;
}

std::string LaneKey(int slot) { return "bt/report/lane/" + std::to_string(slot); }

std::string LaneRecordToJson(const LaneRecord& lane) {
  json phases = json::array();
  for (const LaneRecord::Span& span : lane.phases) {
    phases.push_back({{"name", span.name}, {"start_ns", span.start}, {"end_ns", span.end}});
  }
  json steps = json::array();
  for (const StepLogSample& sample : lane.steps) steps.push_back({sample.at, sample.step, sample.cycle});
  const json record = {{"slot", lane.slot}, {"node", lane.node}, {"host", lane.host}, {"phases", std::move(phases)},
                       {"steps", std::move(steps)}};
  return record.dump(-1, ' ', false, json::error_handler_t::replace);
}

LaneRecord LaneRecordFromJson(std::string_view text) {
  const json record = json::parse(text, nullptr, false);
  if (record.is_discarded() || !record.is_object()) throw std::invalid_argument("not a JSON object");
  LaneRecord lane;
  lane.slot = Field(record, "slot", json::value_t::number_integer, "").get<int>();
  lane.node = Field(record, "node", json::value_t::number_integer, "").get<int>();
  lane.host = Field(record, "host", json::value_t::string, "").get<std::string>();
  const json& phases = Field(record, "phases", json::value_t::array, "");
  for (size_t i = 0; i < phases.size(); ++i) {
    const std::string where = "phases[" + std::to_string(i) + "].";
    if (!phases[i].is_object()) throw std::invalid_argument(where + ": not an object");
    lane.phases.push_back({Field(phases[i], "name", json::value_t::string, where).get<std::string>(),
                           Field(phases[i], "start_ns", json::value_t::number_integer, where).get<JobNs>(),
                           Field(phases[i], "end_ns", json::value_t::number_integer, where).get<JobNs>()});
  }
  if (!record.contains("steps")) return lane;
  const json& steps = Field(record, "steps", json::value_t::array, "");
  for (size_t i = 0; i < steps.size(); ++i) {
    const json& sample = steps[i];
    if (!sample.is_array() || sample.size() != 3 || !sample[0].is_number_integer() || !sample[1].is_number_integer() ||
        !sample[2].is_number_integer()) {
      throw std::invalid_argument("steps[" + std::to_string(i) + "]: expected [time_ns, step, cycle], three integers");
    }
    lane.steps.push_back({sample[0].get<JobNs>(), sample[1].get<int64_t>(), sample[2].get<int64_t>()});
  }
  return lane;
}

std::string FaultKind(int exit_code) {
  if (exit_code == 0) return "lost";
  if (exit_code == 124) return "hang";       // kExitHung
  if (exit_code == 75) return "unhealthy";   // kExitUnhealthy
  return "failure";
}

void JobRecorder::CycleRan(int64_t cycle, const std::string& resumed_from) {
  const JobNs now = clock_.Now();
  std::lock_guard lock(mutex_);
  CycleTimes& times = cycles_[cycle];
  times.run_start = now;
  times.resumed_from = resumed_from;
}

void JobRecorder::CycleEnded(int64_t cycle) {
  const JobNs now = clock_.Now();
  std::lock_guard lock(mutex_);
  cycles_[cycle].run_end = now;
}

void JobRecorder::CycleFailed(int64_t cycle, JobNs fault, const std::string& cause, int node, const std::string& host,
                              const std::string& message) {
  std::lock_guard lock(mutex_);
  CycleTimes& times = cycles_[cycle];
  times.fault = fault;
  times.cause = cause;
  times.node = node;
  times.host = host;
  times.message = message;
}

void JobRecorder::JobEnded(const std::string& cause, const std::string& message) {
  std::lock_guard lock(mutex_);
  for (auto it = cycles_.rbegin(); it != cycles_.rend(); ++it) {
    if (!it->second.run_start) continue;
    if (!it->second.cause.empty()) return;  // a restart's decision named it already
    it->second.cause = cause;
    it->second.message = message;
    return;
  }
}

void JobRecorder::HangCalled(int64_t cycle, JobNs stall_start, JobNs detected) {
  std::lock_guard lock(mutex_);
  CycleTimes& times = cycles_[cycle];
  times.stall_start = stall_start;
  times.detected = detected;
}

void JobRecorder::Committed(const std::string& name, JobNs saved, int64_t cycle) {
  const JobNs now = clock_.Now();
  std::lock_guard lock(mutex_);
  commits_.push_back({name, std::min(saved, now), now, cycle});
}

JobRecorder::SoFar JobRecorder::JobSoFar(JobNs job_start, JobNs now) const {
  LaneRecord start;
  start.phases.push_back({"start", job_start, job_start});
  JobRecord record;
  bool running = false;
  {
    // One lock for the copy and the question: a cycle that starts in between made the
    // answer the next cycle's while the copy had none (review 11: node 0 crashed on an empty
    // vector's back()).
    std::lock_guard lock(mutex_);
    record = BuildLocked({start}, now, 1.2);
    running = !cycles_.empty() && cycles_.rbegin()->second.run_start && !cycles_.rbegin()->second.run_end &&
              !cycles_.rbegin()->second.fault;
  }
  if (running && !record.cycles.empty()) {
    record.cycles.back().end_s = record.wall_end_s;
    record.cycles.back().cause = "running";  // a failure's rule: goodput to its last commit, the rest apart
  }
  SoFar so_far;
  so_far.goodput = ComputeGoodput(record);
  if (running && !so_far.goodput.cycles.empty()) {
    so_far.uncommitted_s = so_far.goodput.cycles.back().lost_work_s;
    so_far.goodput.badput.lost_work_s -= so_far.uncommitted_s;
  }
  so_far.commits = record.commits.size();
  for (const Commit& commit : record.commits) {
    const double age = record.wall_end_s - commit.committed_s;
    if (!so_far.latest_commit_age_s || age < *so_far.latest_commit_age_s) so_far.latest_commit_age_s = age;
  }
  return so_far;
}

JobRecord JobRecorder::Build(const std::vector<LaneRecord>& lanes, JobNs wall_end, double straggler_ratio) const {
  std::lock_guard lock(mutex_);
  return BuildLocked(lanes, wall_end, straggler_ratio);
}

JobRecord JobRecorder::BuildLocked(const std::vector<LaneRecord>& lanes, JobNs wall_end, double straggler_ratio) const {
  JobNs origin = wall_end;
  for (const LaneRecord& lane : lanes) {
    for (const LaneRecord::Span& span : lane.phases) origin = std::min(origin, span.start);
  }
  for (const auto& [cycle, times] : cycles_) {
    if (times.run_start) origin = std::min(origin, *times.run_start);
  }
  const auto seconds = [origin](JobNs at) { return double(at - origin) / 1e9; };
  constexpr double kNever = std::numeric_limits<double>::quiet_NaN();

  JobRecord record;
  record.wall_end_s = seconds(wall_end);
  record.straggler_ratio = straggler_ratio;
  for (const LaneRecord& lane : lanes) {
    NodeLane drawn{lane.node, lane.slot, lane.host, {}};
    for (const LaneRecord::Span& span : lane.phases) drawn.phases.push_back({span.name, seconds(span.start), seconds(span.end)});
    record.lanes.push_back(std::move(drawn));
    if (lane.node < 0 || lane.steps.empty()) continue;
    NodeSteps steps{lane.node, {}};
    for (const StepLogSample& sample : lane.steps) steps.samples.push_back({seconds(sample.at), sample.step, sample.cycle});
    record.steps.push_back(std::move(steps));
  }
  for (const auto& [number, times] : cycles_) {
    Cycle cycle;
    cycle.cycle = number;
    cycle.start_s = times.run_start ? seconds(*times.run_start) : kNever;
    const std::optional<JobNs> end = times.fault ? times.fault : times.run_end;
    cycle.end_s = end ? seconds(*end) : cycle.start_s;
    cycle.cause = times.cause.empty() ? "failure" : times.cause;
    cycle.node = times.node;
    cycle.host = times.host;
    cycle.message = times.message;
    cycle.resumed_from = times.resumed_from;
    if (times.stall_start) cycle.stall_start_s = seconds(*times.stall_start);
    if (times.detected) cycle.detected_s = seconds(*times.detected);
    record.cycles.push_back(std::move(cycle));
  }
  // The job's training ends with its last node's: a follower may train on after node 0's
  // commands ended (uneven ends), and that is the last cycle's run, not the drain.
  std::optional<JobNs> last_run_end;
  for (const LaneRecord& lane : lanes) {
    for (const LaneRecord::Span& span : lane.phases) {
      if (span.name == "run" && (!last_run_end || span.end > *last_run_end)) last_run_end = span.end;
    }
  }
  if (!cycles_.empty() && cycles_.rbegin()->second.run_end) {
    const CycleTimes& last = cycles_.rbegin()->second;
    JobNs end = *last.run_end;
    if (!last.fault && last_run_end && *last_run_end > end) {
      end = *last_run_end;
      record.cycles.back().end_s = seconds(end);
    }
    record.training_end_s = seconds(end);
  }
  for (const CommitTimes& commit : commits_) {
    JobNs saved = commit.saved;
    auto cycle = cycles_.find(commit.cycle);
    if (cycle != cycles_.end() && cycle->second.run_start) saved = std::max(saved, *cycle->second.run_start);
    record.commits.push_back({commit.name, seconds(saved), seconds(std::max(saved, commit.committed))});
  }
  return record;
}

}  // namespace bt::launcher::report
