// The handoff journal: one JSON line per state change of a checkpoint version, appended and
// fdatasync'ed in the checkpoint volume (`.bt-checkpoint/journal.jsonl`), so that a launcher
// restarted on the same volume resumes what was pending and skips what was committed.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/snapshot.h"

namespace bt::checkpoint {

// A version is recorded once it is complete and snapshotted (one record: the rule that
// declared it complete is its detail), then uploaded, then committed; or abandoned.
enum class HandoffState { kSnapshotted, kUploaded, kCommitted, kAbandoned };
const char* HandoffStateName(HandoffState state);

struct JournalEntry {
  uint64_t seq = 0;
  std::string job_id;
  std::string destination;
  std::string name;
  HandoffState state = HandoffState::kSnapshotted;
  std::string detail;                // why abandoned, which rule declared it complete
  std::optional<Snapshot> snapshot;
};

class HandoffJournal {
 public:
  // Opens (creating) `path` and replays it. Lines that do not parse (a crash mid-append)
  // are skipped with a warning naming the file and the line; a last line cut short is
  // ended, so that the next record starts a line of its own.
  explicit HandoffJournal(std::string path);
  ~HandoffJournal();
  HandoffJournal(const HandoffJournal&) = delete;
  HandoffJournal& operator=(const HandoffJournal&) = delete;

  // Records a state change; durable when it returns. Throws std::runtime_error on I/O errors.
  void Record(uint64_t seq, const std::string& name, HandoffState state, const std::string& detail = "",
              const std::optional<Snapshot>& snapshot = std::nullopt);
  // Record without waiting for the disk: durable once the next Sync() or Record() returns.
  void Append(uint64_t seq, const std::string& name, HandoffState state, const std::string& detail = "",
              const std::optional<Snapshot>& snapshot = std::nullopt);
  void Sync();
  // A follower's version bound to node 0's save after it was snapshotted: durable when it
  // returns, replayed into the entry's snapshot (Snapshot::answers).
  void RecordAnswers(uint64_t seq, const std::string& save);

  uint64_t NextSeq() const { return next_seq_; }
  // This job's and destination's versions by their latest state.
  std::vector<JournalEntry> Entries() const;
  // Whether any version of this job's and destination's was ever recorded (no copy made).
  bool RecordedAny() const;
  // A launcher of this job and destination started on this volume: durable when it returns
  // ({"started": ...} lines, which older launchers skip with a warning). Throws
  // std::runtime_error on I/O errors.
  void RecordStart();
  // Whether a launcher of this job and destination started here before this one (recorded a
  // start or any version): what the volume holds then is the job's own last run.
  bool StartedBefore() const;
  // Snapshotted or uploaded but not yet committed: what a restarted launcher resumes.
  std::vector<JournalEntry> Unfinished() const;
  // Whether any version of `name` (this job's, this destination's) was ever recorded.
  bool Knows(const std::string& name) const;
  // The version of `name` with this fingerprint reached at least `state`.
  bool Reached(const std::string& name, const std::string& fingerprint, HandoffState state) const;
  // Another job that committed this very version of `name` from this volume (a job run
  // again on a volume an earlier job left checkpoints on): the version is that job's.
  std::optional<std::string> CommittedByAnotherJob(const std::string& name, const std::string& fingerprint) const;
  // A recorded version of the candidate's checkpoint (any job's) that holds every one of its
  // files unchanged, and more: the checkpoint is being deleted (rotation removes files one
  // by one, the marker possibly last), not written anew, and is no new version.
  bool HoldsMoreThan(const Candidate& candidate) const;
  const std::string& path() const { return path_; }

  void SetScope(std::string job_id, std::string destination);

 private:
  void Replay();
  void EndTornLine();
  void AppendLine(const std::string& text);  // whole, or not at all
  nlohmann::json Line(uint64_t seq, const std::string& name, HandoffState state) const;  // a record's common fields

  std::string path_;
  int fd_ = -1;
  std::string job_id_;
  std::string destination_;
  std::map<uint64_t, JournalEntry> entries_;  // by seq, latest state (all scopes)
  std::set<std::pair<std::string, std::string>> started_;  // (job id, destination) of each start recorded
  uint64_t next_seq_ = 1;
};

}  // namespace bt::checkpoint
