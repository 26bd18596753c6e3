// The cross-node commit over the store board: the board alone (what it stores and what node
// 0's rule decides from it), then across restarts: two checkpoint agents (node 0 and node 1,
// each with its own disk) with the real uploader process and a file:// destination, the
// launchers restarted on their volumes, restarted in place (cycles), or one replaced. A
// "kill" ends an agent at once (a drain with its deadline already past), leaving its journal
// as a killed launcher's would be.
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>

#include "checkpoint/agent.h"
#include "launcher/phases/checkpoints.h"
#include "launcher/phases/commit_board.h"
#include "rendezvous/commit_keys.h"
#include "rendezvous/store.h"
#include "storage/commit_record.h"
#include "storage/destination.h"
#include "tests/checkpoint/fixtures.h"
#include "tests/support/launcher_process.h"

namespace bt::launcher {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr const char* kJob = "board-job";

using checkpoint::Decision;
using checkpoint::PartKind;

// Defect 4: the board counted answers (a counter per declaration), so a replacement's answer
// wrote over node 1's version and completed the count while node 2 never answered.
// A leader that took rank 0 in cycle 3 begins no commit before the one before it stopped
// committing (rendezvous::kHandedOverKey, set by node 0 after its hand-over, or by the server
// when it settled a leader that left): its commits would otherwise land before the last of
// its predecessor's (review 14, F2).
TEST(StoreCommitBoard, ANewLeaderWaitsForItsPredecessorsHandOver) {
  auto store = rendezvous::MakeMemoryStore();
  auto first = MakeStoreCommitBoard(*store, 2, 0, 0);
  EXPECT_TRUE(first->PredecessorHandedOver()) << "the job's first leader has no predecessor";
  auto promoted = MakeStoreCommitBoard(*store, 2, 0, 3);
  EXPECT_FALSE(promoted->PredecessorHandedOver());
  store->Set(rendezvous::kHandedOverKey, "2");
  EXPECT_FALSE(promoted->PredecessorHandedOver()) << "a hand-over of an earlier move";
  store->Set(rendezvous::kHandedOverKey, "3");
  EXPECT_TRUE(promoted->PredecessorHandedOver());
}

TEST(StoreCommitBoard, CountsRanksNeverAnswers) {
  auto store = rendezvous::MakeMemoryStore();
  auto node0 = MakeStoreCommitBoard(*store, 3, 0);
  auto node1 = MakeStoreCommitBoard(*store, 3, 1);
  const uint64_t save = node0->Declare({0, "checkpoint-3", "s3", 0, {}});
  node0->ReportPart(save, PartKind::kVersion, "v0", 0);
  node1->ReportPart(save, PartKind::kVersion, "v1", 0);
  node1->ReportPart(save, PartKind::kNoPart, "", 0);  // a second word of the same launcher
  auto state = node0->Decide(save);
  ASSERT_TRUE(state.has_value());
  EXPECT_EQ(state->decision, Decision::kPending) << "committed while node 2 never answered";
  EXPECT_EQ(state->answers.at(1).version, "v1");
  EXPECT_FALSE(state->answers.contains(2));
}

// Defect 3: a replacement of node 1 (joined in cycle 1) must not answer "no part" for the save
// its predecessor was writing in cycle 0: node 1's part of it is lost, nothing is committed.
TEST(StoreCommitBoard, AReplacementMakesItsPredecessorsOpenSavesLost) {
  auto store = rendezvous::MakeMemoryStore();
  auto node0 = MakeStoreCommitBoard(*store, 2, 0);
  const uint64_t save = node0->Declare({0, "checkpoint-1", "s1", 0, {}});
  node0->ReportPart(save, PartKind::kVersion, "v0", 0);
  node0->Restart(1);
  auto replacement = MakeStoreCommitBoard(*store, 2, 1, /*incarnation=*/1);
  replacement->ReportPart(save, PartKind::kNoPart, "", 1);
  EXPECT_EQ(node0->Decide(save)->decision, Decision::kAbandon);
  // Its own saves, declared in its time, are its to answer.
  const uint64_t next = node0->Declare({0, "checkpoint-2", "s2", 1, {}});
  node0->ReportPart(next, PartKind::kVersion, "v0b", 1);
  replacement->ReportPart(next, PartKind::kVersion, "v1b", 1);
  EXPECT_EQ(node0->Decide(next)->decision, Decision::kCommit);
}

// Defect 2: a save declared in cycle 0 and left open across the restart is never completed
// by a part of cycle 1.
TEST(StoreCommitBoard, APartOfTheNextCycleNeverCompletesAnOpenSave) {
  auto store = rendezvous::MakeMemoryStore();
  auto node0 = MakeStoreCommitBoard(*store, 2, 0);
  auto node1 = MakeStoreCommitBoard(*store, 2, 1);
  const uint64_t save = node0->Declare({0, "checkpoint-2", "s", 0, {}});
  node0->ReportPart(save, PartKind::kVersion, "v0", 0);
  node0->Restart(1);
  node1->ReportPart(save, PartKind::kVersion, "v1", 1);
  EXPECT_EQ(node0->Decide(save)->decision, Decision::kAbandon);
  EXPECT_EQ(node1->DeclaredSince(0).front().cycle, 0);
}

// A node's view of node 0's store that can be cut off (a partition, node 0's launcher gone):
// every call then fails as a closed connection does.
class CutOffStore : public rendezvous::Store {
 public:
  explicit CutOffStore(rendezvous::Store& store) : store_(store) {}
  void Set(const std::string& key, const std::string& value) override {
    Through().Set(key, value);
    if (cut_after_answering && key.starts_with("bt/ckpt/answer/")) cut = true;
  }
  std::string Get(const std::string& key, std::chrono::milliseconds timeout) override { return Through().Get(key, timeout); }
  void Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override { Through().Wait(keys, timeout); }
  int64_t Add(const std::string& key, int64_t delta) override { return Through().Add(key, delta); }
  std::vector<std::optional<std::string>> Peek(const std::vector<std::string>& keys) override { return Through().Peek(keys); }
  std::atomic<bool> cut{false};
  std::atomic<bool> cut_after_answering{false};  // cut once an answer to a save went through

 private:
  rendezvous::Store& Through() {
    if (cut) throw rendezvous::StoreError("read failed: Connection reset by peer");
    return store_;
  }
  rendezvous::Store& store_;
};

class CommitAcrossRestart : public ::testing::Test {
 protected:
  std::string Disk(int rank) const { return dir_.path() + "/node-" + std::to_string(rank); }
  std::string Remote() const { return dir_.path() + "/remote"; }

  // Every launcher of a job starts together after a restart: a fresh store (node 0's new
  // server), node 0's agent first (the followers' wait for its resumed declarations).
  void NewStore() {
    store_ = rendezvous::MakeMemoryStore();
    boards_.clear();
  }

  std::unique_ptr<checkpoint::CheckpointAgent> Start(int rank, int64_t incarnation = 0, const std::string& load_dir = "",
                                                      bool resume_point_read = false) {
    if (rank == cut_off_rank_) cut_off_ = std::make_unique<CutOffStore>(*store_);
    boards_.push_back(MakeStoreCommitBoard(rank == cut_off_rank_ ? *cut_off_ : *store_, node_count_, rank, incarnation));
    checkpoint::AgentOptions options;
    options.checkpoint_dir = Disk(rank);
    options.settings.scan_interval_s = 0.2;
    options.job_id = kJob;
    options.node_rank = rank;
    options.node_count = node_count_;
    if (rank == 0) options.absent_ranks = absent_ranks_;
    options.destination = storage::ParseDestination("file://" + Remote(), "test");
    options.uploader_binary = BT_LAUNCH_BINARY;
    options.board = boards_.back().get();
    options.incarnation = incarnation;
    options.load_dir = load_dir;
    options.resume_point_read = resume_point_read;
    return std::make_unique<checkpoint::CheckpointAgent>(options);
  }

  // The training ended on both nodes: both drain at once, as two launchers do.
  static std::pair<checkpoint::DrainResult, checkpoint::DrainResult> DrainBoth(checkpoint::CheckpointAgent& node0,
                                                                                checkpoint::CheckpointAgent& node1) {
    checkpoint::DrainResult leader;
    std::thread draining([&] { leader = node0.Drain(true, Clock::now() + 20s); });
    checkpoint::DrainResult follower = node1.Drain(true, Clock::now() + 20s);
    draining.join();
    return {leader, follower};
  }

  static void Kill(std::unique_ptr<checkpoint::CheckpointAgent>& agent) {
    agent->Drain(false, Clock::now());
    agent.reset();
  }

  // Node `rank`'s launcher runs alone (the other's is down) until it uploaded `uploads`
  // versions, and is killed.
  void UploadAloneThenKill(int rank, size_t uploads) {
    NewStore();
    auto agent = Start(rank);
    WaitForUploads(rank, uploads);
    Kill(agent);
  }

  // Every launcher starts again on its volume, the training ends at once, both drain.
  std::pair<checkpoint::DrainResult, checkpoint::DrainResult> RestartBothAndDrain() {
    NewStore();
    auto node0 = Start(0);
    auto node1 = Start(1);
    return DrainBoth(*node0, *node1);
  }

  // Node 0's part of a save of `name`: a weights file of `bytes` bytes, then the marker.
  void SaveOnNodeZero(const std::string& name, size_t bytes) {
    const std::string dir = Disk(0) + "/" + name;
    fs::remove_all(dir);
    testing::WriteFile(dir + "/weights.bin", std::string(bytes, 'w'));
    testing::WriteFile(dir + "/.complete", "");
  }

  // A torch.save file at the top of node `rank`'s disk: complete on its own on every node.
  void TorchSave(int rank, const std::string& payload) {
    testing::WriteFile(Disk(rank) + "/model.pt", testing::ZipBytes("data", payload));
  }

  std::string CommittedPayload(const storage::CommitRecord& commit, int rank) const {
    return testing::ReadFile(Remote() + "/" + *storage::PartRoot(commit, rank) + "/model.pt");
  }

  void SaveOnNodeOne(const std::string& name, size_t bytes) {
    const std::string dir = Disk(1) + "/" + name;
    fs::remove_all(dir);
    testing::WriteFile(dir + "/shard-1.bin", std::string(bytes, 's'));
  }

  // Waits until node `rank`'s journal records `count` uploads.
  void WaitForUploads(int rank, size_t count) {
    const std::string journal = Disk(rank) + "/.bt-checkpoint/journal.jsonl";
    const auto deadline = Clock::now() + 30s;
    while (Clock::now() < deadline) {
      std::ifstream file(journal);
      std::string line;
      size_t uploads = 0;
      while (std::getline(file, line)) uploads += line.find("\"state\":\"uploaded\"") != std::string::npos;
      if (uploads >= count) return;
      std::this_thread::sleep_for(50ms);
    }
    FAIL() << "node " << rank << " did not upload " << count << " version(s) within 30 s";
  }

  std::optional<storage::CommitRecord> Committed(const std::string& name) const {
    const std::string path = Remote() + "/" + storage::CommitRecordPath(kJob, name);
    if (!fs::exists(path)) return std::nullopt;
    return storage::CommitRecord::FromText(testing::ReadFile(path), path);
  }

  // The size of the file node `rank`'s committed part of `name` holds.
  uintmax_t CommittedSize(const storage::CommitRecord& commit, int rank, const std::string& file) const {
    return fs::file_size(Remote() + "/" + *storage::PartRoot(commit, rank) + "/" + commit.name + "/" + file);
  }

  testing::TempDir dir_;
  std::unique_ptr<rendezvous::Store> store_;
  int cut_off_rank_ = -1;  // this rank's board reaches the store through cut_off_
  std::unique_ptr<CutOffStore> cut_off_;
  std::vector<std::unique_ptr<checkpoint::CommitBoard>> boards_;
  int node_count_ = 2;
  std::function<std::vector<int>()> absent_ranks_;  // node 0's server: the ranks whose launcher is gone
};

// The CI failure: node 0 had uploaded two saves of one name, node 1 only its part of the
// second. After the restart node 0 declared both again, node 1's one part answered the
// first, and node 0's first save was committed with node 1's second. Only the newest is
// declared again, and it is committed with the part of that same save.
TEST_F(CommitAcrossRestart, OnlyTheNewestSaveOfANameIsCommittedWithTheFollowersPartOfIt) {
  NewStore();
  SaveOnNodeZero("ckpt", 1000);
  auto node0 = Start(0);  // node 1's launcher is down: nothing can be committed
  WaitForUploads(0, 1);
  SaveOnNodeZero("ckpt", 2000);
  SaveOnNodeOne("ckpt", 2500);  // node 1's part of the second save (its first is gone)
  WaitForUploads(0, 2);
  Kill(node0);

  auto [leader, follower] = RestartBothAndDrain();
  EXPECT_TRUE(leader.committed) << leader.message;
  EXPECT_TRUE(follower.committed) << follower.message;
  auto commit = Committed("ckpt");
  ASSERT_TRUE(commit.has_value()) << leader.message;
  EXPECT_EQ(CommittedSize(*commit, 0, "weights.bin"), 2000u) << "node 0's first save was committed";
  EXPECT_EQ(CommittedSize(*commit, 1, "shard-1.bin"), 2500u);
}

// Node 1's part was written again after node 0's part of the resumed save was complete (a
// later save started over it before the launchers died): that save is lost on node 1, so
// node 0 commits nothing of it, and neither drain waits for it.
TEST_F(CommitAcrossRestart, AFollowerPartWrittenAfterTheResumedSaveIsLostAndNothingIsCommitted) {
  SaveOnNodeZero("ckpt", 1000);
  UploadAloneThenKill(0, 1);
  SaveOnNodeOne("ckpt", 1500);
  const std::string shard = Disk(1) + "/ckpt/shard-1.bin";
  const auto later = fs::last_write_time(shard) + 5s;  // as a save 5 s after node 0's would be
  fs::last_write_time(shard, later);

  const auto started = Clock::now();
  auto [leader, follower] = RestartBothAndDrain();
  EXPECT_LT(Clock::now() - started, 10s) << "a drain waited for a save that cannot be committed";
  EXPECT_FALSE(Committed("ckpt").has_value()) << "node 0's save was committed with a later part of node 1";
  // The job's newest save is not committed, and no later one replaced it: both drains say so.
  EXPECT_FALSE(leader.committed) << leader.message;
  EXPECT_NE(leader.message.find("ckpt was not committed"), std::string::npos) << leader.message;
  EXPECT_FALSE(follower.committed) << follower.message;
  EXPECT_NE(follower.message.find("written over"), std::string::npos) << follower.message;
}

// Node 1's part as the last run left it, written before node 0's part was complete, answers
// the save node 0 declares again: the checkpoint complete before the kill is committed.
TEST_F(CommitAcrossRestart, AFollowerPartUntouchedSinceTheResumedSaveIsCommitted) {
  SaveOnNodeOne("ckpt", 1500);
  SaveOnNodeZero("ckpt", 1000);
  UploadAloneThenKill(0, 1);

  auto [leader, follower] = RestartBothAndDrain();
  EXPECT_TRUE(leader.committed) << leader.message;
  auto commit = Committed("ckpt");
  ASSERT_TRUE(commit.has_value()) << leader.message;
  EXPECT_EQ(CommittedSize(*commit, 0, "weights.bin"), 1000u);
  EXPECT_EQ(CommittedSize(*commit, 1, "shard-1.bin"), 1500u);
}

// Soak finding F4: the launchers read the job's resume point (`latest`) before their agents
// start, and the training starts from it. Node 0 then committed the saves the last run left
// open (here the one every node completed), after the trainers had started from an older
// `latest`, and the training's own saves moved `latest` back. With the resume point read
// first, node 0 commits none of them; `latest` stays what the training resumes from.
TEST_F(CommitAcrossRestart, ASaveLeftOpenIsNotCommittedOnceTheResumePointWasRead) {
  SaveOnNodeOne("ckpt", 1500);
  SaveOnNodeZero("ckpt", 1000);
  UploadAloneThenKill(0, 1);

  NewStore();
  auto node0 = Start(0, 0, "", /*resume_point_read=*/true);
  auto node1 = Start(1, 0, "", /*resume_point_read=*/true);
  const auto started = Clock::now();
  auto [leader, follower] = DrainBoth(*node0, *node1);
  EXPECT_LT(Clock::now() - started, 10s) << "a drain waited for a save that is not committed";
  EXPECT_FALSE(Committed("ckpt").has_value()) << "a save of the last run was committed after the resume point was read";
  const std::string journal = testing::ReadFile(Disk(0) + "/.bt-checkpoint/journal.jsonl");
  EXPECT_NE(journal.find("the job resumes from the `latest` committed before"), std::string::npos) << journal;
}

// Node 0's training wrote the checkpoint again before the restart (a save cut short): the
// resumed save is not declared again; the part on disk is judged as any other (here the
// training ends with exit 0, which makes the unmarked files final).
TEST_F(CommitAcrossRestart, AResumedSaveWrittenAgainOnNodeZeroIsNotDeclared) {
  SaveOnNodeOne("ckpt", 1500);
  SaveOnNodeZero("ckpt", 1000);
  UploadAloneThenKill(0, 1);
  fs::remove(Disk(0) + "/ckpt/.complete");
  testing::WriteFile(Disk(0) + "/ckpt/weights.bin", std::string(3000, 'n'));  // half of the next save

  auto [leader, follower] = RestartBothAndDrain();
  auto commit = Committed("ckpt");
  if (commit) {
    EXPECT_EQ(CommittedSize(*commit, 0, "weights.bin"), 3000u) << "the save written over was committed";
  }
  const std::string journal = testing::ReadFile(Disk(0) + "/.bt-checkpoint/journal.jsonl");
  EXPECT_NE(journal.find("written again on disk"), std::string::npos) << journal;
}

// A part complete on its own (a torch.save file) that node 1 snapshotted before node 0 ever
// declared that save, then node 1 wrote its next save over it while its launcher was down:
// after the restart node 0's resumed save 2 took node 1's journaled save 1, the newest
// version "of no save in particular". It must take the part on disk, save 2.
TEST_F(CommitAcrossRestart, AResumedSaveNeverTakesAnEarlierPartCompleteOnItsOwn) {
  TorchSave(1, "save 1 rank 1");
  UploadAloneThenKill(1, 1);  // node 0's launcher is down: nothing declares save 1
  TorchSave(1, "save 2 rank 1");
  TorchSave(0, "save 2 rank 0");
  UploadAloneThenKill(0, 1);  // node 1's is down: node 0's save 2 is never answered

  auto [leader, follower] = RestartBothAndDrain();
  EXPECT_TRUE(leader.committed) << leader.message;
  auto commit = Committed("model.pt");
  ASSERT_TRUE(commit.has_value()) << leader.message;
  EXPECT_NE(CommittedPayload(*commit, 0).find("save 2 rank 0"), std::string::npos);
  EXPECT_NE(CommittedPayload(*commit, 1).find("save 2 rank 1"), std::string::npos) << "node 1's save 1 was committed";
}

// A checkpoint only node 0 writes (an export), complete before the kill, while node 1's
// launcher never saw it; node 1's disk changed afterwards (the next save began): node 1
// holds no part of it, and it is committed with node 0's part alone.
TEST_F(CommitAcrossRestart, ANodeZeroOnlyCheckpointResumedIsCommittedWithoutTheFollowersPart) {
  SaveOnNodeZero("export-1", 1000);
  UploadAloneThenKill(0, 1);
  std::this_thread::sleep_for(1s);  // past the slack: the next save starts later
  SaveOnNodeOne("shared-2", 500);

  auto [leader, follower] = RestartBothAndDrain();
  auto commit = Committed("export-1");
  ASSERT_TRUE(commit.has_value()) << leader.message << " / " << follower.message;
  EXPECT_EQ(CommittedSize(*commit, 0, "weights.bin"), 1000u);
  EXPECT_FALSE(storage::PartRoot(*commit, 1).has_value()) << "node 1 holds no part of export-1";
}

// Restart in place: the agents live on, the cycle moves on (CheckpointAgent::BeginCycle).
class CommitAcrossCycles : public CommitAcrossRestart {
 protected:
  void SetUp() override { NewStore(); }

  // Both nodes save their part of `name` (node 1's first); whether node 0 committed it.
  bool SaveOnBothNodesAndCommit(const std::string& name, size_t node0_bytes, size_t node1_bytes) {
    SaveOnNodeOne(name, node1_bytes);
    SaveOnNodeZero(name, node0_bytes);
    return WaitForCommit(name).has_value();
  }

  // Waits until `name` is committed, or `within` passes.
  std::optional<storage::CommitRecord> WaitForCommit(const std::string& name, std::chrono::seconds within = 15s) {
    const auto deadline = Clock::now() + within;
    while (Clock::now() < deadline) {
      if (auto commit = Committed(name)) return commit;
      std::this_thread::sleep_for(50ms);
    }
    return std::nullopt;
  }
};

// Defect 2 and 30: node 0 wrote checkpoint-2 as the restart stopped the job, node 1's part was
// not complete; the next cycle saved checkpoint-2 again. The commit names the second save's
// parts only (never node 0's cycle-0 part with node 1's cycle-1 part), and neither drain
// waits on the first save, which can no longer complete.
TEST_F(CommitAcrossCycles, ANameSavedAgainInTheNextCycleCommitsOneCyclesParts) {
  auto node0 = Start(0);
  auto node1 = Start(1);
  SaveOnNodeZero("save-2", 1000);
  WaitForUploads(0, 1);
  testing::WriteFile(Disk(1) + "/save-2/shard-1.bin.tmp", "half");  // cut short by the restart
  std::thread next_cycle([&] { node0->BeginCycle(1); });
  node1->BeginCycle(1);
  next_cycle.join();
  fs::remove_all(Disk(1) + "/save-2");
  SaveOnNodeOne("save-2", 2500);
  SaveOnNodeZero("save-2", 2000);

  const auto started = Clock::now();
  auto [leader, follower] = DrainBoth(*node0, *node1);
  EXPECT_LT(Clock::now() - started, 15s) << "a drain waited on a save that cannot complete";
  EXPECT_TRUE(leader.committed) << leader.message;
  EXPECT_TRUE(follower.committed) << follower.message;
  auto commit = Committed("save-2");
  ASSERT_TRUE(commit.has_value()) << leader.message;
  EXPECT_EQ(CommittedSize(*commit, 0, "weights.bin"), 2000u) << "node 0's part of cycle 0 was committed";
  EXPECT_EQ(CommittedSize(*commit, 1, "shard-1.bin"), 2500u);
  EXPECT_EQ(commit->cycle, 1);
  EXPECT_EQ(commit->part_cycles, (std::map<int, int64_t>{{0, 1}, {1, 1}}));
  EXPECT_TRUE(storage::CommitRecordProblems(*commit).empty());
}

// Review 12: node 0 wrote its part of a committed save again (a file rewritten in place, its
// marker still there), node 1 saved its part once. Node 0 declared a second save of the
// name; node 1's one part had answered the first, so nothing ever answered the second, and
// both drains waited drain_timeout_s (600 s by default). Once its training ended, node 1
// answers "lost": the second save is not committed (never node 0's new part with node 1's
// old one), and neither drain waits.
TEST_F(CommitAcrossCycles, ASecondSaveOfANameNodeOneNeverWroteEndsItsDrainUncommitted) {
  auto node0 = Start(0);
  auto node1 = Start(1);
  ASSERT_TRUE(SaveOnBothNodesAndCommit("ckpt", 1000, 1500));
  testing::WriteFile(Disk(0) + "/ckpt/weights.bin", std::string(3000, 'v'));
  WaitForUploads(0, 2);

  const auto started = Clock::now();
  auto [leader, follower] = DrainBoth(*node0, *node1);
  EXPECT_LT(Clock::now() - started, 10s) << "a drain waited for an answer that never comes";
  EXPECT_FALSE(leader.committed) << leader.message;
  EXPECT_NE(leader.message.find("ckpt"), std::string::npos) << leader.message;
  auto commit = Committed("ckpt");
  ASSERT_TRUE(commit.has_value()) << leader.message;
  EXPECT_EQ(CommittedSize(*commit, 0, "weights.bin"), 1000u) << "node 0's second part was committed with node 1's first";
  EXPECT_EQ(CommittedSize(*commit, 1, "shard-1.bin"), 1500u);
  EXPECT_TRUE(storage::CommitRecordProblems(*commit).empty());
}

// Defect 3: node 1's launcher was lost while node 1 wrote its part of checkpoint-1; its
// replacement (joined in cycle 1, on a fresh disk) holds nothing of it. It answers "lost",
// never "no part": checkpoint-1 is not committed without node 1's shard; the next save is.
TEST_F(CommitAcrossCycles, AReplacementNeverAnswersNoPartForItsPredecessorsSave) {
  auto node0 = Start(0);
  auto lost = Start(1);
  SaveOnNodeZero("save-1", 1000);
  WaitForUploads(0, 1);
  Kill(lost);
  fs::remove_all(Disk(1));  // a fresh node in its place
  node0->BeginCycle(1);
  auto replacement = Start(1, /*incarnation=*/1);
  replacement->BeginCycle(1);
  SaveOnNodeZero("save-2", 1000);
  SaveOnNodeOne("save-2", 500);
  ASSERT_TRUE(WaitForCommit("save-2").has_value());
  auto [leader, follower] = DrainBoth(*node0, *replacement);
  EXPECT_FALSE(Committed("save-1").has_value()) << "checkpoint-1 was committed without node 1's shard";
  EXPECT_TRUE(leader.committed) << leader.message;
}

// Review 4, F1: node 2's launcher was lost before it answered the job's last save. Node 0
// abandoned that save at once (its part can never come), then took its newest version left,
// an older commit, for its drain's target and reported the drain committed; node 1, which
// had answered with its part, skipped the abandoned save too. Both exited 0 with the last
// checkpoint never committed.
TEST_F(CommitAcrossCycles, ALastSaveANodeLostBeforeItAnsweredFailsEveryDrain) {
  node_count_ = 3;
  std::atomic<bool> gone{false};
  absent_ranks_ = [&] { return gone ? std::vector<int>{2} : std::vector<int>{}; };
  auto node0 = Start(0);
  auto node1 = Start(1);
  auto node2 = Start(2);
  SaveOnNodeOne("save-1", 500);
  testing::WriteFile(Disk(2) + "/save-1/shard-2.bin", std::string(500, 's'));
  SaveOnNodeZero("save-1", 1000);
  ASSERT_TRUE(WaitForCommit("save-1").has_value());
  Kill(node2);
  gone = true;
  SaveOnNodeOne("save-2", 500);
  SaveOnNodeZero("save-2", 1000);
  const auto started = Clock::now();
  auto [leader, follower] = DrainBoth(*node0, *node1);
  EXPECT_LT(Clock::now() - started, 15s) << "a drain waited for a part that can never come";
  EXPECT_FALSE(Committed("save-2").has_value());
  EXPECT_FALSE(leader.committed) << leader.message;
  EXPECT_NE(leader.message.find("save-2 was not committed"), std::string::npos) << leader.message;
  EXPECT_FALSE(follower.committed) << follower.message;
  EXPECT_NE(follower.message.find("save-2"), std::string::npos) << follower.message;
}

// Review 4, F2: node 1's part of save-1 was complete, but its handoff failed (the snapshot
// refused: a full disk, an I/O error), and the training's rotation removed it. Node 1 then
// answered "holds no part", and node 0 committed save-1 without rank 1's shard. It is lost.
TEST_F(CommitAcrossCycles, APartRemovedBeforeItsHandoffIsLostNeverAbsent) {
  auto node0 = Start(0);
  auto node1 = Start(1);
  const std::string staging = Disk(1) + "/.bt-checkpoint/staging";
  fs::remove_all(staging);
  testing::WriteFile(staging, "not a directory");  // every snapshot of node 1 fails
  SaveOnNodeOne("save-1", 500);
  SaveOnNodeZero("save-1", 1000);
  WaitForUploads(0, 1);
  std::this_thread::sleep_for(1s);  // node 1 judged its part complete and failed to hand it off
  fs::remove_all(Disk(1) + "/save-1");  // rotation
  std::this_thread::sleep_for(6s);  // past the grace an absent part is given
  EXPECT_FALSE(Committed("save-1").has_value()) << "save-1 was committed without rank 1's shard";
  fs::remove(staging);
  fs::create_directories(staging);
  ASSERT_TRUE(SaveOnBothNodesAndCommit("save-2", 1000, 500));
  auto [leader, follower] = DrainBoth(*node0, *node1);
  EXPECT_FALSE(Committed("save-1").has_value()) << "save-1 was committed without rank 1's shard";
  EXPECT_TRUE(leader.committed) << leader.message;  // a newer save was committed
  EXPECT_TRUE(follower.committed) << follower.message;
}

// Review 5, R5-2: only node 0 saves; node 2's launcher is lost before it answered the last
// save, which node 0 abandons (its drain fails). Node 1, holding no part, reported its drain
// fine: the job's nodes disagreed (74 and 0) about a last checkpoint that never committed.
TEST_F(CommitAcrossCycles, AFollowerWithNoPartOfALastSaveNodeZeroAbandonedFailsItsDrain) {
  node_count_ = 3;
  std::atomic<bool> gone{false};
  absent_ranks_ = [&] { return gone ? std::vector<int>{2} : std::vector<int>{}; };
  auto node0 = Start(0);
  auto node1 = Start(1);
  auto node2 = Start(2);
  SaveOnNodeZero("export-1", 1000);
  ASSERT_TRUE(WaitForCommit("export-1").has_value());
  Kill(node2);
  gone = true;
  SaveOnNodeZero("export-2", 1000);
  auto [leader, follower] = DrainBoth(*node0, *node1);
  EXPECT_FALSE(Committed("export-2").has_value());
  EXPECT_FALSE(leader.committed) << leader.message;
  EXPECT_FALSE(follower.committed) << follower.message;
  EXPECT_NE(follower.message.find("export-2"), std::string::npos) << follower.message;
}

// Review 5, R5-1: as APartRemovedBeforeItsHandoffIsLostNeverAbsent, but a scan sees the part
// half deleted first (a rotation removes file by file): the failed handoff was dropped as
// "written again" and the name then answered "no part".
TEST_F(CommitAcrossCycles, APartDeletedFileByFileBeforeItsHandoffIsLostNeverAbsent) {
  auto node0 = Start(0);
  auto node1 = Start(1);
  const std::string staging = Disk(1) + "/.bt-checkpoint/staging";
  fs::remove_all(staging);
  testing::WriteFile(staging, "not a directory");  // every snapshot of node 1 fails
  testing::WriteFile(Disk(1) + "/save-1/shard-1.bin", std::string(500, 's'));
  testing::WriteFile(Disk(1) + "/save-1/shard-1b.bin", std::string(500, 't'));
  SaveOnNodeZero("save-1", 1000);
  WaitForUploads(0, 1);
  std::this_thread::sleep_for(1s);  // node 1 judged its part complete and failed to hand it off
  fs::remove(Disk(1) + "/save-1/shard-1b.bin");
  std::this_thread::sleep_for(1s);  // scans see it half deleted
  fs::remove_all(Disk(1) + "/save-1");
  std::this_thread::sleep_for(6s);  // past the grace an absent part is given
  EXPECT_FALSE(Committed("save-1").has_value()) << "save-1 was committed without rank 1's shard";
}

// Soak seed 166: node 0's last checkpoint could not be handed off when the drain began (its
// disk full); node 0 closed its declarations anyway, node 1 left, and the save node 0
// declared once there was room could never be answered. Node 0 keeps them open until
// its complete checkpoints are handed off.
TEST_F(CommitAcrossCycles, DeclarationsStayOpenWhileNodeZerosLastCheckpointWaitsForRoom) {
  auto node0 = Start(0);
  auto node1 = Start(1);
  const std::string staging = Disk(0) + "/.bt-checkpoint/staging";
  fs::remove_all(staging);
  testing::WriteFile(staging, "not a directory");  // node 0's snapshots fail, as on a full disk
  SaveOnNodeZero("export-1", 1000);
  std::this_thread::sleep_for(1s);  // judged complete, its handoff failed
  std::thread room([&] {
    std::this_thread::sleep_for(2s);
    fs::remove(staging);
    fs::create_directories(staging);
  });
  auto [leader, follower] = DrainBoth(*node0, *node1);
  room.join();
  EXPECT_TRUE(Committed("export-1").has_value()) << leader.message;
  EXPECT_TRUE(leader.committed) << leader.message;
  EXPECT_TRUE(follower.committed) << follower.message;
}

// Review 6, R6-2: as above, but the room never comes: node 0's drain fails, and so must the
// follower's (it reported committed the save before, while node 0's last one, newer, never
// reached anyone: exit codes 74 and 0 for one job).
TEST_F(CommitAcrossCycles, AFollowerWhoseDrainEndsWithNodeZerosSavesStillOpenFailsIt) {
  auto node0 = Start(0);
  auto node1 = Start(1);
  ASSERT_TRUE(SaveOnBothNodesAndCommit("export-1", 1000, 500));
  const std::string staging = Disk(0) + "/.bt-checkpoint/staging";
  fs::remove_all(staging);
  testing::WriteFile(staging, "not a directory");  // node 0's snapshots fail from now on
  SaveOnNodeOne("export-2", 500);
  SaveOnNodeZero("export-2", 1000);
  std::this_thread::sleep_for(1s);  // judged complete, its handoff failed
  auto [leader, follower] = DrainBoth(*node0, *node1);
  EXPECT_FALSE(leader.committed) << leader.message;
  EXPECT_FALSE(follower.committed) << follower.message;
  EXPECT_NE(follower.message.find("node 0 had not finished declaring its saves"), std::string::npos) << follower.message;
}

// Review 8, N2: node 0 trains on long after node 1's training ended (a final evaluation):
// node 1's drain ends before node 0's begins. It judges node 0's newest declaration as
// before (committed), not as a drain that node 0 left open.
TEST_F(CommitAcrossCycles, AFollowerWhoseDrainEndsWhileNodeZeroStillTrainsJudgesTheNewestSave) {
  auto node0 = Start(0);
  auto node1 = Start(1);
  ASSERT_TRUE(SaveOnBothNodesAndCommit("export-1", 1000, 500));
  std::this_thread::sleep_for(1s);  // node 1 saw the commit
  checkpoint::DrainResult follower = node1->Drain(true, Clock::now() + 3s);
  EXPECT_TRUE(follower.committed) << follower.message;
  checkpoint::DrainResult leader = node0->Drain(true, Clock::now() + 10s);
  EXPECT_TRUE(leader.committed) << leader.message;
}

// Review 6, R6-3: only node 0 saves; node 1 is cut off from the store before node 0's last
// save. Node 1 read node 0's outcome as "committed" when the store could not answer, and
// reported its drain fine while node 0's failed. An outcome it cannot read is unknown.
TEST_F(CommitAcrossCycles, AFollowerCutOffFromTheStoreNeverTakesAnUnknownOutcomeForACommit) {
  cut_off_rank_ = 1;
  auto node0 = Start(0);
  auto node1 = Start(1);
  SaveOnNodeZero("export-1", 1000);
  ASSERT_TRUE(WaitForCommit("export-1").has_value());
  std::this_thread::sleep_for(1s);  // node 1 has answered it
  cut_off_->cut = true;
  SaveOnNodeZero("export-2", 1000);
  auto [leader, follower] = DrainBoth(*node0, *node1);
  EXPECT_FALSE(leader.committed) << leader.message;
  EXPECT_FALSE(follower.committed) << follower.message;
  EXPECT_NE(follower.message.find("not known to be committed"), std::string::npos) << follower.message;
}

// Soak seed 3088: node 1 answered node 0's last save with its uploaded part and was cut off
// (its link down) before it heard the commit, which node 0 wrote: node 1's drain failed (74)
// while node 0's succeeded. The save's commit record at the destination names node 1's part:
// committed. (The record of a save node 0 never committed is no such proof: the test above.)
TEST_F(CommitAcrossCycles, AFollowerCutOffAfterItsAnswerReadsTheCommitAtTheDestination) {
  cut_off_rank_ = 1;
  auto node0 = Start(0);
  auto node1 = Start(1);
  cut_off_->cut_after_answering = true;
  ASSERT_TRUE(SaveOnBothNodesAndCommit("export-1", 1000, 500));
  ASSERT_TRUE(cut_off_->cut);
  auto [leader, follower] = DrainBoth(*node0, *node1);
  EXPECT_TRUE(leader.committed) << leader.message;
  EXPECT_TRUE(follower.committed) << follower.message;
  EXPECT_NE(follower.message.find("its commit record at the destination says so"), std::string::npos) << follower.message;
}

// Defect 12: BT_LOAD_CHECKPOINT_DIR inside BT_CHECKPOINT_DIR: what the launcher loads there
// for the restart is not a checkpoint of this run, and `latest` never names it.
TEST(CheckpointLoadFolder, ALoadFolderInsideTheCheckpointFolderIsNeverCommitted) {
  testing::TempDir dir;
  const std::string disk = dir.path() + "/ckpt";
  testing::WriteFile(disk + "/loaded/rank-0/ckpt-4/weights.bin", std::string(100, 'w'));
  testing::WriteFile(disk + "/loaded/rank-0/ckpt-4/.complete", "");
  checkpoint::AgentOptions options;
  options.checkpoint_dir = disk;
  options.settings.scan_interval_s = 0.2;
  options.job_id = kJob;
  options.destination = storage::ParseDestination("file://" + dir.path() + "/remote", "test");
  options.uploader_binary = BT_LAUNCH_BINARY;
  options.load_dir = disk + "/loaded";
  checkpoint::CheckpointAgent agent(options);
  std::this_thread::sleep_for(500ms);
  checkpoint::DrainResult result = agent.Drain(true, Clock::now() + 10s);
  EXPECT_FALSE(fs::exists(dir.path() + "/remote/" + kJob + "/latest"))
      << testing::ReadFile(dir.path() + "/remote/" + kJob + "/latest");
  EXPECT_NE(result.message.find("no complete checkpoint"), std::string::npos) << result.message;
}

}  // namespace
}  // namespace bt::launcher
