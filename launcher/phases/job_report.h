// The job's report at its end (issue 31 §1 and §3, docs/GOODPUT.md): every launcher sends its
// phases to node 0; node 0 adds the cycles, hangs and commits it recorded, prints the goodput
// table after the timeline, and writes goodput.json and report.html to its report folder
// (launcher.watchdog.report_dir, else <BT_SCRATCH_DIR>/bt-launch) and beside the job's
// checkpoints (<job_id>/.bt-report/). A report that cannot be made is logged, never the job's
// failure: nothing here changes an exit code.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "launcher/job.h"
#include "launcher/report/recorder.h"
#include "launcher/supervision/peers.h"
#include "launcher/timeline.h"
#include "storage/destination.h"

namespace bt::launcher {

// This launcher's phases and its job's steps on the job's clock; `rank` the training rank it ran last.
report::LaneRecord LaneOf(const Timeline& timeline, const report::JobClock& clock, const report::StepLog& steps, int slot,
                          std::optional<int> rank);

// What the relay shows of the job's output, read for step numbers (launcher.progress.
// step_pattern): the newest step among a block's last lines, noted at the time the block came.
// The matching runs on a thread of its own, never the relay's. Null without a pattern.
std::function<void(std::string_view lines)> StepsFromOutput(const env::ProgressSettings& settings,
                                                            std::shared_ptr<report::StepLog> steps,
                                                            const report::JobClock& clock);
// The heartbeat file's steps (BT_HEARTBEAT_FILE holding a number, or {"step": N}), at the
// time the file says it was written.
void NoteHeartbeatStep(const std::string& contents, int64_t modified_ns, report::StepLog& steps, const report::JobClock& clock);

// A follower (and a node leaving the job): its lane to node 0's store, before the exit barrier.
void SendLane(Peers* peers, const report::LaneRecord& lane);

// When a checkpoint node 0 committed was saved: its folder's last change under
// `checkpoint_dir` (the marker or the last file written), else now.
report::JobNs SavedAt(const std::string& checkpoint_dir, const std::string& name, const report::JobClock& clock);

struct ReportPlace {
  const std::optional<storage::DestinationSpec>& destination;
  bool upload = false;  // the job's last checkpoint was committed: its destination takes the report too
};

// Node 0, after the exit barrier: every lane, the table, the files.
void WriteJobReport(const PreparedJob& job, Peers* peers, const report::LaneRecord& own_lane,
                    const report::JobClock& clock, const report::JobRecorder& recorder, const ReportPlace& place);

}  // namespace bt::launcher
