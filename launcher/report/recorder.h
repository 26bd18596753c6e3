// What node 0 needs at the end of a job to say what the job's time became (issue 31 §1),
// gathered while it runs: every launcher's phases (its lane, sent to node 0 under
// bt/report/lane/<slot> as it ends), and on node 0 the cycles, hangs and commits as they
// happen. One clock for the whole job: node 0's wall clock, which a follower reaches through
// the offset its handshake measured (rendezvous/client.h), so hosts whose clocks differ are
// drawn on one axis. Within a launcher every time is read on its steady clock and placed on
// that axis from one anchor, so a wall-clock step during the job moves nothing.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "launcher/report/goodput.h"

namespace bt::launcher::report {

// Nanoseconds since the epoch on node 0's wall clock.
using JobNs = int64_t;

class JobClock {
 public:
  // Anchored now: the launcher's start.
  JobClock();
  // Node 0's wall clock minus this host's (a follower's handshake measured it).
  void SetLeaderOffset(std::chrono::nanoseconds offset) { offset_ns_.store(offset.count(), std::memory_order_relaxed); }
  JobNs At(std::chrono::steady_clock::time_point when) const;
  // A time this host's wall clock gave (a file's modification time).
  JobNs FromWall(std::chrono::system_clock::time_point when) const;
  JobNs Now() const { return At(std::chrono::steady_clock::now()); }

 private:
  std::chrono::steady_clock::time_point anchor_steady_;
  JobNs anchor_wall_ns_ = 0;
  std::atomic<int64_t> offset_ns_{0};
};

struct StepLogSample {
  JobNs at = 0;
  int64_t step = 0;
  int64_t cycle = 0;
};

// One launcher's phases, as it sends them to node 0.
struct LaneRecord {
  struct Span {
    std::string name;
    JobNs start = 0;
    JobNs end = 0;
  };
  int slot = -1;
  int node = -1;  // the training rank it ran last; -1: a spare that never took one
  std::string host;
  std::vector<Span> phases;
  std::vector<StepLogSample> steps;  // its job's step numbers as they came (StepLog)
};

// The store key a launcher's lane goes under.
std::string LaneKey(int slot);
std::string LaneRecordToJson(const LaneRecord& lane);
// Throws std::invalid_argument naming the field that is wrong.
LaneRecord LaneRecordFromJson(std::string_view text);

// This launcher's step numbers as its job reports them (BT_HEARTBEAT_FILE, or its output's
// lines matching launcher.progress.step_pattern), for the report's step figures. A sample is
// kept when the step changes. Bounded: past kMaxStepSamples every other sample is dropped, so
// a week's job keeps its whole span at half the resolution. Thread-safe (the relay's thread
// and the watchdog's note steps).
class StepLog {
 public:
  static constexpr size_t kMaxStepSamples = 4096;
  // The job's samples from now on are `cycle`'s (a restart's downtime is never a step).
  void BeginCycle(int64_t cycle);
  // A negative step is no step.
  void Note(JobNs at, int64_t step);
  std::vector<StepLogSample> Samples() const;

 private:
  mutable std::mutex mutex_;
  int64_t cycle_ = 0;
  std::vector<StepLogSample> samples_;
};

// The kind of fault a restart's decision names, from the failed node's exit code (0: its
// launcher was lost): the cause goodput.h counts it under.
std::string FaultKind(int exit_code);

// Node 0's record of the job's cycles, hangs and commits. Thread-safe: the run's thread, the
// watchdog's and the commit's call it.
class JobRecorder {
 public:
  explicit JobRecorder(const JobClock& clock) : clock_(clock) {}

  // `cycle`'s start commands start now (on node 0), from `resumed_from` ("" for none).
  void CycleRan(int64_t cycle, const std::string& resumed_from);
  // `cycle`'s start commands ended now on node 0.
  void CycleEnded(int64_t cycle);
  // `cycle` failed at `fault`: a restart's decision (the failed node, its host, the line).
  void CycleFailed(int64_t cycle, JobNs fault, const std::string& cause, int node, const std::string& host,
                   const std::string& message);
  // How the job's last cycle that ran ended (success, stopped, failure, hang, unhealthy), unless
  // a restart's decision named its fault already.
  void JobEnded(const std::string& cause, const std::string& message);
  // The watchdog called `cycle` hung at `detected`; the job's last progress was at `stall_start`.
  void HangCalled(int64_t cycle, JobNs stall_start, JobNs detected);
  // `latest` moved to `name`: saved (complete on disk) at `saved` in `cycle`, committed now. A
  // save time before its cycle's start (a folder copied with its old mtime, a file server's
  // clock behind) is taken as that start.
  void Committed(const std::string& name, JobNs saved, int64_t cycle);

  // The job's record on one axis: 0 is the earliest launcher start among `lanes` (node 0's own
  // included); `wall_end` is the job's end.
  JobRecord Build(const std::vector<LaneRecord>& lanes, JobNs wall_end, double straggler_ratio) const;

  // The job so far (live metrics), from `job_start` to `now`: a cycle still running counts to
  // now, its time since its last committed checkpoint as `uncommitted_s` (lost if it failed
  // now), not as lost work.
  struct SoFar {
    Goodput goodput;
    double uncommitted_s = 0;
    std::optional<double> latest_commit_age_s;
    size_t commits = 0;
  };
  SoFar JobSoFar(JobNs job_start, JobNs now) const;

 private:
  struct CycleTimes {
    std::optional<JobNs> run_start;
    std::optional<JobNs> run_end;
    std::optional<JobNs> fault;
    std::string cause;
    int node = -1;
    std::string host;
    std::string message;
    std::string resumed_from;
    std::optional<JobNs> stall_start;
    std::optional<JobNs> detected;
  };
  struct CommitTimes {
    std::string name;
    JobNs saved = 0;
    JobNs committed = 0;
    int64_t cycle = 0;
  };

  JobRecord BuildLocked(const std::vector<LaneRecord>& lanes, JobNs wall_end, double straggler_ratio) const;

  const JobClock& clock_;
  mutable std::mutex mutex_;
  std::map<int64_t, CycleTimes> cycles_;
  std::vector<CommitTimes> commits_;
};

}  // namespace bt::launcher::report
