#include "launcher/phases/metrics.h"

#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>

#include <spdlog/spdlog.h>

#include "launcher/exit_codes.h"
#include "launcher/supervision/peers.h"
#include "rendezvous/node_info.h"

namespace bt::launcher {
namespace {

// Whether `port` is one node 0 also serves, as this launcher will use them (the environment's
// overrides included; MASTER_PORT walking one port per restart cycle when the launcher chose
// it): what takes it, or nullopt.
std::optional<std::string> PortTakenBy(const PreparedJob& job, uint16_t port) {
  const auto& launcher = job.config.launcher;
  const auto master_variable = job.environment.variables.find("MASTER_PORT");
  if (master_variable != job.environment.variables.end()) {
    char* end = nullptr;
    const long master = std::strtol(master_variable->second.c_str(), &end, 10);
    const bool walks = launcher.restart.max_restarts > 0 && master == launcher.master_port &&
                       !job.config.runtime.environment_variables.contains("MASTER_PORT");
    if (*end == '\0' && port >= master && port < master + (walks ? env::kMasterPortCycles : 1)) {
      return "a MASTER_PORT of the training";
    }
  }
  try {
    if (port == RendezvousPort(job.config)) return "the rendezvous port (BT_RENDEZVOUS_PORT, launcher.rendezvous.port)";
  } catch (const LaunchFailure&) {  // no port: the rendezvous says so, naming the variable
  }
  return std::nullopt;
}

}  // namespace

std::shared_ptr<metrics::LiveMetrics> StartMetrics(const PreparedJob& job, Timeline& timeline) {
  uint16_t port = 0;
  try {
    port = metrics::MetricsPort(job.config.launcher.metrics.port);
  } catch (const std::invalid_argument& error) {
    throw LaunchFailure(kExitConfig, error.what());
  }
  if (port == 0) return nullptr;
  // The config's own clash is refused when it is read (every node at once); one that the
  // environment makes is this node's alone: refusing it here would leave the others waiting
  // for this node at the rendezvous (review 12), so it runs without metrics, as for a port
  // in use.
  if (auto taken = PortTakenBy(job, port)) {
    spdlog::error("metrics: not served: port {} (BT_METRICS_PORT / launcher.metrics.port) is also {}; the job runs "
                  "without them",
                  port, *taken);
    return nullptr;
  }
  auto live = std::make_shared<metrics::LiveMetrics>(port, metrics::NodeLabels{job.identity.rank, rendezvous::HostName()});
  live->SetRank(job.identity.rank);
  live->SetPhase(timeline.Current());
  // Weak: the timeline outlives the run's objects, the metrics do not.
  timeline.OnBegin([weak = std::weak_ptr<metrics::LiveMetrics>(live)](const std::string& phase) {
    if (auto metrics = weak.lock()) metrics->SetPhase(phase);
  });
  return live;
}

std::shared_ptr<void> ReadRun(metrics::LiveMetrics* live, const RunCounters& run, const watchdog::Progress& progress) {
  if (live == nullptr) return nullptr;
  return live->Read([&run, &progress](metrics::SampleSink& sink) {
    sink.Add("bt_launch_cycle", double(run.cycle.load()));
    sink.Add("bt_launch_restarts_used", run.restarts_used.load());
    sink.Add("bt_launch_restarts_allowed", run.restarts_allowed);
    const double since = progress.seen()
                             ? std::chrono::duration<double>(watchdog::Progress::Clock::now() - progress.last()).count()
                             : -1;
    sink.Add("bt_launch_seconds_since_progress", since);
  });
}

std::shared_ptr<void> ReadCheckpoints(metrics::LiveMetrics* live, const checkpoint::CheckpointAgent* agent) {
  if (live == nullptr || agent == nullptr) return nullptr;
  return live->Read([agent](metrics::SampleSink& sink) {
    const checkpoint::CheckpointStats stats = agent->Stats();
    sink.Add("bt_launch_checkpoints_committed_total", double(stats.committed));
    sink.Add("bt_launch_checkpoints_failed_total", double(stats.failed));
    sink.Add("bt_launch_checkpoints_in_flight", double(stats.in_flight));
    sink.Add("bt_launch_upload_bytes_total", double(stats.bytes_uploaded));
    sink.Add("bt_launch_upload_seconds_total", stats.upload_seconds);
  });
}

std::shared_ptr<void> ReadHealth(metrics::LiveMetrics* live, const HealthWatch* health) {
  if (live == nullptr || health == nullptr) return nullptr;
  return live->Read([health](metrics::SampleSink& sink) {
    const HealthWatch::Counts seen = health->Seen();
    sink.Add("bt_launch_health_findings", double(seen.fatal), {{"severity", "fatal"}});
    sink.Add("bt_launch_health_findings", double(seen.warning), {{"severity", "warning"}});
  });
}

std::shared_ptr<void> ReadJob(metrics::LiveMetrics* live, Peers* peers, const report::JobRecorder* recorder,
                              const report::JobClock& clock, report::JobNs job_start) {
  if (live == nullptr || recorder == nullptr) return nullptr;
  return live->Read([peers, recorder, &clock, job_start](metrics::SampleSink& sink) {
    if (auto states = peers ? peers->NodeStates() : std::nullopt) {
      sink.Add("bt_launch_nodes", states->ready, {{"state", "ready"}});
      sink.Add("bt_launch_nodes", states->lost, {{"state", "lost"}});
      sink.Add("bt_launch_nodes", states->spare, {{"state", "spare"}});
    }
    const report::JobRecorder::SoFar so_far = recorder->JobSoFar(job_start, clock.Now());
    sink.Add("bt_launch_job_checkpoints_committed_total", double(so_far.commits));
    if (so_far.latest_commit_age_s) sink.Add("bt_launch_latest_checkpoint_age_seconds", *so_far.latest_commit_age_s);
    sink.Add("bt_launch_wall_seconds", so_far.goodput.wall_s);
    sink.Add("bt_launch_goodput_seconds", so_far.goodput.goodput_s);
    const report::Badput& badput = so_far.goodput.badput;
    for (const auto& [cause, seconds] : {std::pair{"prepare", badput.prepare_s}, std::pair{"restart", badput.restart_s},
                                         std::pair{"lost_work", badput.lost_work_s}, std::pair{"hang", badput.hang_s},
                                         std::pair{"drain", badput.drain_s}}) {
      sink.Add("bt_launch_badput_seconds", seconds, {{"cause", cause}});
    }
    sink.Add("bt_launch_uncommitted_seconds", so_far.uncommitted_s);
  });
}

}  // namespace bt::launcher
