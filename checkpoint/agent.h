// The checkpoint agent: from before the first start command until the drain ends it watches
// BT_CHECKPOINT_DIR, decides when a checkpoint is complete, snapshots it, records it in the
// journal and hands it to the uploader process; with other nodes it takes part in the
// cross-node commit, and node 0 publishes `latest`. It runs on its own thread of the
// launcher, outside the training's process group, so a SIGKILLed training cannot stop it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/commit_gate.h"
#include "checkpoint/commit_rule.h"
#include "env/job_config.h"
#include "storage/commit_record.h"
#include "storage/destination.h"

namespace bt::checkpoint {

// The cross-node part of a commit (DESIGN.md §3), over the rendezvous store (launcher/):
// node 0 declares each version it hands off (a number per declaration, so a name saved again
// is declared again, with the save: node 0's version id, and the cycle its part was written
// in); every launcher answers each declaration once for its rank, with its own version of
// that save, "no part" or "lost"; node 0's board feeds what it reads to the commit rule
// (checkpoint/commit_rule.h), which alone says when a save commits or is abandoned.
//
// After the launchers restart on their volumes, node 0 declares again what it had handed
// off but not committed ("resumed", with how long ago its part was complete) before any
// training starts, and says when it is done; each follower (its launcher waited for that)
// answers those from its journal, or from its disk as the last run left it, before its own
// training rewrites anything.
class CommitBoard {
 public:
  struct Declaration {
    uint64_t number = 0;
    std::string name;
    std::string save;  // node 0's version id of the save declared
    int64_t cycle = 0;  // the restart cycle node 0's part was written in
    // Resumed from before a restart: how long before the declaration node 0's part of this
    // save was complete, by node 0's clock (a duration, so no two hosts' clocks are compared).
    std::optional<int64_t> resumed_age_ns;
  };
  enum class Outcome { kPending, kCommitted, kAbandoned };

  virtual ~CommitBoard() = default;
  virtual uint64_t Declare(const Declaration& declaration) = 0;                  // node 0; number ignored
  virtual std::vector<Declaration> DeclaredSince(uint64_t first) = 0;            // numbers first...
  virtual void FinishResumedDeclarations() = 0;                                  // node 0, at start
  virtual bool ResumedDeclared() = 0;                                             // followers; never waits
  // Every launcher, once per declaration, for its rank: `version` for kVersion; `cycle` is
  // the cycle the part (or its absence) was seen in.
  virtual void ReportPart(uint64_t declaration, PartKind kind, const std::string& version, int64_t cycle) = 0;
  // Node 0: the rule's state of `declaration` after reading every answer and replacement
  // there is now; nullopt when it was never declared.
  virtual std::optional<SaveState> Decide(uint64_t declaration) = 0;
  virtual void Restart(int64_t cycle) = 0;                                        // node 0: the job entered `cycle`
  virtual void SetOutcome(uint64_t declaration, Outcome outcome) = 0;            // node 0
  virtual Outcome GetOutcome(uint64_t declaration) = 0;
  virtual void CloseDeclarations() = 0;                                          // node 0's drain
  virtual bool DeclarationsClosed() = 0;
  virtual void StartDrain() = 0;       // node 0: its training ended, its drain began
  virtual bool LeaderDraining() = 0;
  // A leader on another launcher than node 0's (rank 0 moved to a spare), whose commits node
  // 0's restart decisions learn of through the store (rendezvous/commit_keys.h): the commit
  // `record` of `declaration`, a save of `cycle`, is about to be written; false when a
  // restart's decision sealed that cycle first (it is never written).
  virtual bool BeginCommit(uint64_t /*declaration*/, int64_t /*cycle*/, const storage::CommitRecord& /*record*/) {
    return true;
  }
  // Just before each try to write that commit: whether it is still this launcher's to write
  // (false once a restart revoked it, or the store is out of reach: a newer leader may exist).
  virtual bool CommitStillBegun(uint64_t /*declaration*/, int64_t /*cycle*/) { return true; }
  // ... and is written; `latest` names it when `moved_latest`.
  virtual void CommitWritten(uint64_t /*declaration*/, const storage::CommitRecord& /*record*/, bool /*moved_latest*/) {}
  // The training ranks whose launcher is gone now, as node 0's server says.
  virtual std::vector<int> AbsentRanks() { return {}; }
  // A leader that took rank 0 in a later cycle: whether the one before it has stopped
  // committing (rendezvous::kHandedOverKey); until then it begins no commit.
  virtual bool PredecessorHandedOver() { return true; }
};

struct AgentOptions {
  std::string checkpoint_dir;
  env::CheckpointSettings settings;
  std::string job_id;
  int node_rank = 0;
  int node_count = 1;
  storage::DestinationSpec destination;
  std::vector<std::string> uploader_environ;
  std::string uploader_binary;        // bt-launch itself (its `upload-worker` subcommand)
  CommitBoard* board = nullptr;       // null: this node commits on its own
  // Rank 0 on another launcher than node 0's (a spare took it): its commits go through the
  // board's BeginCommit/CommitWritten, node 0's restart decisions being in another process.
  bool commits_through_board = false;
  // With commits_through_board: how long a `go` for a commit lets the uploader start writing
  // it (less than the heartbeat timeout: a launcher frozen past it has lost rank 0 by then).
  std::chrono::milliseconds commit_lease{0};
  bool publish_latest = true;         // without a board: whether this node writes `latest`
  // The restart cycle this launcher joined the job in: 0 from the start, a replacement's
  // rejoin cycle (Peers::TakeRejoin). A replacement answers "lost" for the saves declared
  // before it joined (DESIGN.md §3): its predecessor wrote those parts, not it.
  int64_t incarnation = 0;
  // BT_LOAD_CHECKPOINT_DIR: when it lies inside checkpoint_dir, what the launcher loads there
  // is never taken for a checkpoint of this run.
  std::string load_dir;
  // The launcher read the job's resume point (`latest`) before this agent started, and every
  // node's training starts from it: node 0 abandons the saves the last run left open (see
  // AbandonResumed) instead of declaring them again, which would commit them after the
  // resume point was chosen (soak finding F4).
  bool resume_point_read = false;
  // Node 0 with restarts on: shared with the restart decision, which seals the failed cycle
  // (no save of it commits after the decision reads `latest`). Null: no restarts.
  std::shared_ptr<CommitGate> commit_gate;
  // Called on the agent's thread when a checkpoint has been snapshotted and queued.
  std::function<void(const std::string& name)> on_handoff;
  // Called on the agent's thread once `latest` names `commit` (written by this node): what
  // node 0's restart decision resumes from, known without reading the destination.
  std::function<void(const storage::CommitRecord& commit)> on_latest;
  // Node 0 with a board: the ranks whose launcher is gone now. A save still missing the
  // answer of such a rank can never commit (only the launcher that ran the rank may answer).
  std::function<std::vector<int>()> absent_ranks;
};

// A follower's drain once node 0 is lost (cut off, or gone): no commit can come any more,
// so the drain waits only for this node's own uploads (its journal keeps them for a
// restarted launcher), and at most `upload_bound` from when the loss is seen.
struct LeaderLoss {
  std::function<bool()> lost;  // true once node 0 cannot be reached; called on the agent's thread
  std::chrono::milliseconds upload_bound{0};
};

// What this node's checkpoint parts did since the launcher started (live metrics).
struct CheckpointStats {
  uint64_t committed = 0;  // parts committed (node 0's commit record names them)
  uint64_t failed = 0;     // parts abandoned: never committed (modified, superseded, sealed by a restart, a lost node's)
  uint64_t in_flight = 0;  // handed off, neither committed nor abandoned yet
  uint64_t bytes_uploaded = 0;
  double upload_seconds = 0;  // from each part's handoff to its upload's end
};

struct DrainResult {
  bool committed = true;  // the last complete checkpoint is committed (or there was none)
  std::string message;    // one line: what was committed, or what was not and why
};

class CheckpointAgent {
 public:
  // Creates the staging area and journal, starts the uploader and the watcher thread, and
  // resumes what the journal says is unfinished. Throws std::runtime_error.
  explicit CheckpointAgent(AgentOptions options);
  ~CheckpointAgent();
  CheckpointAgent(const CheckpointAgent&) = delete;
  CheckpointAgent& operator=(const CheckpointAgent&) = delete;

  // Node 0's launcher, whose rank moved to a spare after a restart's decision sealed its
  // cycles: writes the commits it had begun (at most until `deadline`), abandons the rest, and
  // stops, leaving the job's declarations open for the node running rank 0 now.
  DrainResult HandOver(std::chrono::steady_clock::time_point deadline);

  // The training has ended (`succeeded`: every command exited 0). Commits what is complete
  // and waits until it is uploaded and committed, or until `deadline`; once `leader_loss`
  // says node 0 is lost, only until this node's own uploads are done (see LeaderLoss).
  DrainResult Drain(bool training_succeeded, std::chrono::steady_clock::time_point deadline,
                    LeaderLoss leader_loss = {});

  // The job's training of `cycle` is about to start (restart in place), the last cycle's is
  // stopped. Returns once the agent judged what the last cycle left as that cycle's (at most
  // a few seconds): a part written from now on never answers an earlier cycle's save.
  void BeginCycle(int64_t cycle);
  // Node 0 decided a restart into `cycle`: every save of the cycles before it that is not
  // committed is sealed (never committed), and the drain counts none of them as lost, even
  // when the job ends before `cycle` begins (a SIGTERM during the restart).
  void RestartDecided(int64_t cycle);
  // Thread-safe, never waits on the agent's thread: counters it keeps as it goes.
  CheckpointStats Stats() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// `<checkpoint_dir>/.bt-checkpoint`: the journal and the staging area.
std::string StateDirectory(const std::string& checkpoint_dir);

}  // namespace bt::checkpoint
