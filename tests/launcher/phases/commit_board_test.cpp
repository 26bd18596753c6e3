// The cross-node commit across a restart of every launcher on its volume: two checkpoint
// agents (node 0 and node 1, each with its own disk) over the store commit board, with the
// real uploader process and a file:// destination. A "kill" ends an agent at once (a drain
// with its deadline already past), leaving its journal as a killed launcher's would be.
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>

#include "checkpoint/agent.h"
#include "launcher/phases/checkpoints.h"
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

  std::unique_ptr<checkpoint::CheckpointAgent> Start(int rank) {
    boards_.push_back(MakeStoreCommitBoard(*store_, 2, rank));
    checkpoint::AgentOptions options;
    options.checkpoint_dir = Disk(rank);
    options.settings.scan_interval_s = 0.2;
    options.job_id = kJob;
    options.node_rank = rank;
    options.node_count = 2;
    options.destination = storage::ParseDestination("file://" + Remote(), "test");
    options.uploader_binary = BT_LAUNCH_BINARY;
    options.board = boards_.back().get();
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
  std::vector<std::unique_ptr<checkpoint::CommitBoard>> boards_;
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
  EXPECT_TRUE(leader.committed) << leader.message;
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

}  // namespace
}  // namespace bt::launcher
