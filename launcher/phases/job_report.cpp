#include "launcher/phases/job_report.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>

#include "launcher/report/goodput_json.h"
#include "launcher/report/html_report.h"
#include "launcher/report/steps.h"
#include "launcher/watchdog/watchdog.h"
#include "rendezvous/node_info.h"
#include "storage/bounded_call.h"
#include "storage/durable_file.h"

namespace bt::launcher {
namespace {

namespace fs = std::filesystem;

constexpr std::chrono::milliseconds kLaneWait{3000};
constexpr std::chrono::milliseconds kUploadBound{10000};

// Every other launcher's lane, as it sent it; one that cannot be read is left out, said why.
std::vector<report::LaneRecord> OtherLanes(Peers* peers, int launchers) {
  std::vector<report::LaneRecord> lanes;
  if (peers == nullptr || peers->store() == nullptr || launchers < 2) return lanes;
  std::vector<std::string> keys;
  for (int slot = 1; slot < launchers; ++slot) keys.push_back(report::LaneKey(slot));
  // A follower sends its lane once it knows the job's verdict, as node 0 does: the ones still
  // connected are waited for, briefly.
  const std::vector<int> absent = peers->AbsentRanks();
  std::vector<std::string> awaited;
  for (int slot = 1; slot < launchers; ++slot) {
    if (std::find(absent.begin(), absent.end(), slot) == absent.end()) awaited.push_back(report::LaneKey(slot));
  }
  std::vector<std::optional<std::string>> values;
  try {
    try {
      peers->store()->Wait(awaited, kLaneWait);
    } catch (const rendezvous::StoreTimeout& late) {
      spdlog::warn("report: some nodes' phases did not come within {} ms ({}): drawn without them", kLaneWait.count(),
                   late.what());
    }
    values = peers->store()->Peek(keys);
  } catch (const std::exception& error) {
    spdlog::warn("report: cannot read the other nodes' phases ({}): the report has node 0's lane only", error.what());
    return lanes;
  }
  for (size_t i = 0; i < values.size(); ++i) {
    const int slot = int(i) + 1;
    if (!values[i]) continue;  // lost before its end: its lane is not known
    try {
      report::LaneRecord lane = report::LaneRecordFromJson(*values[i]);
      lane.slot = slot;
      lanes.push_back(std::move(lane));
    } catch (const std::invalid_argument& error) {
      spdlog::warn("report: node {}'s phases ({}) cannot be read: {}: left out", slot, report::LaneKey(slot), error.what());
    }
  }
  return lanes;
}

// Reading the job's output for step numbers happens off the relay's thread (review 10: on the
// relay's 256 KiB stack std::regex's recursion overflowed on one 1 KB line, and a pattern that
// backtracks held the job's output until the end of the job dropped it). The relay hands over
// each block's last lines and never waits: a newer block replaces one not matched yet.
constexpr size_t kLinesMatched = 64;        // a burst of output costs a bounded number of matches
constexpr size_t kMatchedLineBytes = 1024;  // std::regex recurses about once a character

struct OfferedLines {
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<std::string> lines;  // newest first
  report::JobNs at = 0;
  bool pending = false;
};

// A block's last lines, newest first, each cut to its first kMatchedLineBytes.
std::vector<std::string> LastLines(std::string_view block) {
  std::vector<std::string> lines;
  if (!block.empty() && block.back() == '\n') block.remove_suffix(1);
  while (!block.empty() && lines.size() < kLinesMatched) {
    const size_t start = block.rfind('\n');
    const std::string_view line = start == std::string_view::npos ? block : block.substr(start + 1);
    lines.emplace_back(line.substr(0, kMatchedLineBytes));
    if (start == std::string_view::npos) break;
    block = block.substr(0, start);
  }
  return lines;
}

// The matcher's thread (the default 8 MiB stack), detached: one stuck in a pattern that
// backtracks ends with the process and delays only the steps, never the job's output. A
// block's newest step is its sample.
void MatchSteps(std::shared_ptr<OfferedLines> offered, std::shared_ptr<const report::StepPattern> pattern,
                std::shared_ptr<report::StepLog> steps) {
  while (true) {
    std::vector<std::string> lines;
    report::JobNs at = 0;
    {
      std::unique_lock lock(offered->mutex);
      offered->changed.wait(lock, [&] { return offered->pending; });
      lines.swap(offered->lines);
      at = offered->at;
      offered->pending = false;
    }
    for (const std::string& line : lines) {
      if (const std::optional<int64_t> step = pattern->Match(line)) {
        steps->Note(at, *step);
        break;
      }
    }
  }
}

// The report beside the job's checkpoints, where whoever reads them finds it.
void Upload(const storage::DestinationSpec& spec, const std::string& job_id, const std::string& json_text,
            const std::string& html) {
  if (spec.scheme == "spool") {
    spdlog::info("report: {} is a spool (checkpoints only): the report stays on node 0", spec.uri);
    return;
  }
  const std::string dir = job_id + "/.bt-report/";
  auto error = std::make_shared<std::string>();
  // Bounded: node 0's exit code is decided, the others have left; an object store that stalls
  // (rclone's retries) must not hold the exit (review 9, F3: 80 s).
  const bool finished = storage::FinishesWithin(kUploadBound, [spec, dir, json_text, html, error] {
    try {
      std::unique_ptr<storage::Destination> destination = storage::OpenDestination(spec);
      destination->WriteText(dir + "goodput.json", json_text);
      destination->WriteText(dir + "report.html", html);
    } catch (const std::exception& failure) {
      *error = failure.what();
    }
  });
  if (finished && error->empty()) {
    spdlog::info("report: uploaded to {}/{}", spec.uri, dir);
    return;
  }
  spdlog::warn("report: not uploaded to {}/{}: {} (it stays on node 0)", spec.uri, dir,
               finished ? *error : "no answer within " + std::to_string(kUploadBound.count() / 1000) + " s");
}

}  // namespace

report::LaneRecord LaneOf(const Timeline& timeline, const report::JobClock& clock, const report::StepLog& steps, int slot,
                          std::optional<int> rank) {
  report::LaneRecord lane;
  lane.steps = steps.Samples();
  lane.slot = slot;
  lane.node = rank.value_or(-1);
  lane.host = rendezvous::HostName();
  for (const Timeline::Span& span : timeline.Spans()) lane.phases.push_back({span.name, clock.At(span.start), clock.At(span.end)});
  return lane;
}

std::function<void(std::string_view lines)> StepsFromOutput(const env::ProgressSettings& settings,
                                                            std::shared_ptr<report::StepLog> steps,
                                                            const report::JobClock& clock) {
  if (settings.step_pattern.empty()) return nullptr;
  // Validated with the config (65 naming it): a pattern that fails here is a bug.
  auto pattern = std::make_shared<const report::StepPattern>(settings.step_pattern);
  auto offered = std::make_shared<OfferedLines>();
  std::thread(MatchSteps, offered, pattern, std::move(steps)).detach();
  return [offered, &clock](std::string_view block) {
    std::vector<std::string> lines = LastLines(block);
    const report::JobNs at = clock.Now();
    {
      std::lock_guard lock(offered->mutex);
      offered->lines = std::move(lines);
      offered->at = at;
      offered->pending = true;
    }
    offered->changed.notify_one();
  };
}

void NoteHeartbeatStep(const std::string& contents, int64_t modified_ns, report::StepLog& steps, const report::JobClock& clock) {
  const std::optional<int64_t> step = report::ParseHeartbeatStep(contents);
  if (!step) return;
  const auto modified = std::chrono::system_clock::time_point(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::nanoseconds(modified_ns)));
  steps.Note(clock.FromWall(modified), *step);
}

void SendLane(Peers* peers, const report::LaneRecord& lane) {
  if (peers == nullptr || peers->store() == nullptr) return;
  try {
    peers->store()->Set(report::LaneKey(lane.slot), report::LaneRecordToJson(lane));
  } catch (const std::exception& error) {
    spdlog::warn("report: cannot send this node's phases to node 0 ({}): its lane is missing from the report", error.what());
  }
}

report::JobNs SavedAt(const std::string& checkpoint_dir, const std::string& name, const report::JobClock& clock) {
  struct stat status {};
  if (checkpoint_dir.empty() || stat((checkpoint_dir + "/" + name).c_str(), &status) != 0) return clock.Now();
  const auto modified = std::chrono::system_clock::time_point(std::chrono::duration_cast<std::chrono::system_clock::duration>(
      std::chrono::seconds(status.st_mtim.tv_sec) + std::chrono::nanoseconds(status.st_mtim.tv_nsec)));
  return clock.FromWall(modified);
}

void WriteJobReport(const PreparedJob& job, Peers* peers, const report::LaneRecord& own_lane,
                    const report::JobClock& clock, const report::JobRecorder& recorder, const ReportPlace& place) {
  std::vector<report::LaneRecord> lanes{own_lane};
  for (report::LaneRecord& lane : OtherLanes(peers, job.identity.count)) lanes.push_back(std::move(lane));
  const report::Goodput goodput =
      report::ComputeGoodput(recorder.Build(lanes, clock.Now(), job.config.launcher.progress.straggler_ratio));
  const std::string table = report::FormatGoodputTable(goodput);
  spdlog::info("goodput:\n{}", table);

  // The watchdog's report folder, beside the hang reports.
  const fs::path dir = watchdog::ReportDir(job.config.launcher.watchdog, job.environment);
  // Names are bytes (a checkpoint's may not be UTF-8): replaced in the report, never thrown on
  // (review 9, F1: node 0 exited 70 after a job that succeeded).
  const std::string json_text =
      report::GoodputToJson(goodput).dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  const std::string html = report::RenderHtmlReport(goodput, table);
  try {
    // Not synced: two fsyncs a file would cost every job's end (`run -- /bin/true`) 1.6 ms.
    storage::ReplaceFile((dir / "goodput.json").string(), json_text);
    storage::ReplaceFile((dir / "report.html").string(), html);
    spdlog::info("report: {} (open it in a browser), {}", (dir / "report.html").string(), (dir / "goodput.json").string());
  } catch (const std::exception& error) {
    spdlog::warn("report: cannot write it under {}: {}", dir.string(), error.what());
  }
  if (place.upload && place.destination) Upload(*place.destination, job.job_id(), json_text, html);
}

}  // namespace bt::launcher
