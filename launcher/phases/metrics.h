// The launcher's live metrics (launcher/metrics/live_metrics.h): what each part of a run adds
// to the snapshot. Each Read* returns the handle that keeps its source; keep it beside what
// the source reads, declared after it. All of them accept a null LiveMetrics (metrics off).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "checkpoint/agent.h"
#include "launcher/job.h"
#include "launcher/metrics/live_metrics.h"
#include "launcher/phases/health.h"
#include "launcher/report/recorder.h"
#include "launcher/supervision/peers.h"
#include "launcher/timeline.h"
#include "launcher/watchdog/progress.h"

namespace bt::launcher {

// Null when launcher.metrics.port (BT_METRICS_PORT) is off. The timeline's phases reach the
// metrics from now on. Throws LaunchFailure (65) for a bad BT_METRICS_PORT.
std::shared_ptr<metrics::LiveMetrics> StartMetrics(const PreparedJob& job, Timeline& timeline);

// The cycle and the restarts as the run goes: set on the run's thread, read by the metrics'.
struct RunCounters {
  std::atomic<int64_t> cycle{0};
  std::atomic<int> restarts_used{0};
  int restarts_allowed = 0;
};

std::shared_ptr<void> ReadRun(metrics::LiveMetrics* live, const RunCounters& run, const watchdog::Progress& progress);
std::shared_ptr<void> ReadCheckpoints(metrics::LiveMetrics* live, const checkpoint::CheckpointAgent* agent);
std::shared_ptr<void> ReadHealth(metrics::LiveMetrics* live, const HealthWatch* health);
// Node 0: the job's nodes, goodput and badput so far, its commits.
std::shared_ptr<void> ReadJob(metrics::LiveMetrics* live, Peers* peers, const report::JobRecorder* recorder,
                              const report::JobClock& clock, report::JobNs job_start);

}  // namespace bt::launcher
