// The snapshot taken when a checkpoint is complete: staged beside it, immune to rotation.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "checkpoint/layout.h"
#include "checkpoint/snapshot.h"
#include "checkpoint/tree.h"
#include "tests/checkpoint/fixtures.h"
#include "tests/support/launcher_process.h"

namespace bt::checkpoint {
namespace {

using testing::OnlyCandidate;
using testing::ReadFile;
using testing::TempDir;
using testing::WriteBytes;

TEST(Snapshot, LinksLargeFilesCopiesSmallOnesAndSurvivesRotation) {
  TempDir dir;
  const std::string root = dir.path() + "/ckpts";
  WriteBytes(root + "/checkpoint-2/model.bin", std::string(kCopyBelowBytes + 1, 'm'));
  WriteBytes(root + "/checkpoint-2/trainer_state.json", "{}");
  Snapshot snapshot = TakeSnapshot(root, OnlyCandidate(root), dir.path() + "/staging/1", 1);
  ASSERT_EQ(snapshot.files.size(), 2u);
  EXPECT_EQ(snapshot.files[0].path, "model.bin");
  EXPECT_NE(snapshot.files[0].method, StagingMethod::kCopy);  // hard link (or reflink)
  EXPECT_EQ(snapshot.files[1].method, StagingMethod::kCopy);
  EXPECT_EQ(snapshot.total_bytes, kCopyBelowBytes + 3);
  // What a destination uploads: the same files, where they were staged, this version.
  const storage::StagedFiles staged = snapshot.Staged();
  EXPECT_EQ(staged.dir, dir.path() + "/staging/1");
  EXPECT_EQ(staged.paths, (std::vector<std::string>{"model.bin", "trainer_state.json"}));
  EXPECT_EQ(staged.total_bytes, snapshot.total_bytes);
  EXPECT_EQ(staged.version, 1u);
  std::filesystem::remove_all(root + "/checkpoint-2");  // save_total_limit rotation
  EXPECT_EQ(ReadFile(dir.path() + "/staging/1/model.bin").size(), kCopyBelowBytes + 1);
  EXPECT_EQ(ReadFile(dir.path() + "/staging/1/trainer_state.json"), "{}");
}

TEST(Snapshot, ASmallFileDeletedSinceTheScanAbortsItAndLeavesNothing) {
  TempDir dir;
  const std::string root = dir.path() + "/ckpts";
  WriteBytes(root + "/checkpoint-3/notes.txt", "small: copied, not linked");
  WriteBytes(root + "/checkpoint-3/trainer_state.json", "{}");
  Candidate candidate = OnlyCandidate(root);
  std::filesystem::remove(root + "/checkpoint-3/notes.txt");  // rotation, between scan and snapshot
  EXPECT_THROW(TakeSnapshot(root, candidate, dir.path() + "/staging/3", 3), SnapshotChanged);
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/staging/3"));
}

TEST(Snapshot, AFileThatChangedSinceTheScanAbortsItAndLeavesNothing) {
  TempDir dir;
  const std::string root = dir.path() + "/ckpts";
  WriteBytes(root + "/checkpoint-2/model.bin", std::string(100000, 'm'));
  WriteBytes(root + "/checkpoint-2/trainer_state.json", "{}");
  Candidate candidate = OnlyCandidate(root);
  WriteBytes(root + "/checkpoint-2/model.bin", std::string(100001, 'm'));  // still being written
  EXPECT_THROW(TakeSnapshot(root, candidate, dir.path() + "/staging/1", 1), SnapshotChanged);
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/staging/1"));
}

TEST(Snapshot, FileCheckpointKeepsItsNameAndFingerprintFollowsTheContent) {
  TempDir dir;
  const std::string root = dir.path() + "/ckpts";
  WriteBytes(root + "/model.pt", testing::ZipBytes("data.pkl", "v1"));
  Candidate first = OnlyCandidate(root);
  Snapshot snapshot = TakeSnapshot(root, first, dir.path() + "/staging/1", 1);
  EXPECT_FALSE(snapshot.is_directory);
  ASSERT_EQ(snapshot.files.size(), 1u);
  EXPECT_EQ(snapshot.files[0].path, "model.pt");
  WriteBytes(root + "/model.pt", testing::ZipBytes("data.pkl", "v2, longer"));
  EXPECT_NE(Fingerprint(OnlyCandidate(root)), Fingerprint(first));
}

// What a restarted node 0 asks of a resumed version: is the checkpoint on disk still it (or
// it being deleted file by file), or a later save written over it?
TEST(Snapshot, HoldsTheCheckpointItWasTakenFromAndItsRemainsButNotALaterSave) {
  TempDir dir;
  const std::string root = dir.path() + "/ckpts";
  WriteBytes(root + "/step-1/a.bin", "a");
  WriteBytes(root + "/step-1/b.bin", "b");
  WriteBytes(root + "/step-1/.complete", "");
  Snapshot snapshot = TakeSnapshot(root, OnlyCandidate(root), dir.path() + "/staging/1", 1);
  snapshot.answers = "0123abcd";
  const Snapshot read = Snapshot::FromJson(snapshot.ToJson());
  EXPECT_EQ(read.answers, "0123abcd");
  EXPECT_EQ(read.NewestMtimeNs(), snapshot.NewestMtimeNs());
  EXPECT_TRUE(read.Holds(OnlyCandidate(root)));
  std::filesystem::remove(root + "/step-1/a.bin");  // rotation, one file at a time
  EXPECT_TRUE(read.Holds(OnlyCandidate(root)));
  WriteBytes(root + "/step-1/b.bin", "bb");  // the next save, over it
  EXPECT_FALSE(read.Holds(OnlyCandidate(root)));
}

}  // namespace
}  // namespace bt::checkpoint
