// Node 0's restart decision and its checkpoint agent's commits, kept apart (soak finding F5).
// The decision names the newest commit node 0 made (launcher/supervision/restart.h,
// CommittedCheckpoints, on the rendezvous server's thread); a save of the failed cycle that
// committed after that would make `latest` newer than what the next cycle resumes from, and
// the next cycle's saves would move it back. So the decision first seals the failed cycle: no
// save of it (or of an earlier one) starts committing any more. A commit already on its way
// (every rank's part uploaded, its record and `latest` not written yet) will still be
// written: waited for a short time, and when it is still on its way after that (rclone
// behind a slow object store), the decision names it, so the next cycle resumes from the
// commit `latest` is about to name instead of one before it (soak seed 301, s3).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>

#include "storage/commit_record.h"

namespace bt::checkpoint {

class CommitGate {
 public:
  // The agent: its job runs `cycle` now (its first cycle at start, then each BeginCycle).
  void EnterCycle(int64_t cycle);
  // The restart decision: seals every cycle up to the one running, then waits until the
  // commits begun before are written, at most `wait`. Returns the newest commit still on its
  // way then (its record is written after the decision), nullopt when none is. Before the
  // agent entered a cycle there is nothing to seal.
  std::optional<storage::CommitRecord> Seal(std::chrono::milliseconds wait);
  // The agent, before it asks for the commit `record` of save `seq` written in `cycle`:
  // false when a restart sealed that cycle (the save is not committed); otherwise it is on
  // its way.
  bool TryBegin(uint64_t seq, int64_t cycle, const storage::CommitRecord& record);
  // The commit of `seq` is written (or will never be).
  void Finished(uint64_t seq);

 private:
  std::mutex mutex_;
  std::condition_variable finished_;
  bool entered_ = false;
  int64_t cycle_ = 0;
  int64_t sealed_through_ = -1;  // saves of this cycle and before never start committing
  std::map<uint64_t, storage::CommitRecord> in_flight_;  // by save
  std::optional<uint64_t> newest_finished_;
};

}  // namespace bt::checkpoint
