// The handoff journal: what a restarted launcher resumes, and what it must not take as its own.
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "checkpoint/journal.h"
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

TEST(Journal, ResumesUnfinishedAndSkipsACorruptTail) {
  TempDir dir;
  const std::string path = dir.path() + "/journal.jsonl";
  Snapshot snapshot;
  snapshot.seq = 1;
  snapshot.name = "checkpoint-1";
  snapshot.staging_dir = dir.path() + "/staging/1";
  snapshot.fingerprint = "fp1";
  {
    HandoffJournal journal(path);
    journal.SetScope("job", "file:///x");
    journal.Append(1, "checkpoint-1", HandoffState::kSnapshotted, "marker present", snapshot);  // as a handoff does
    journal.Sync();
    snapshot.seq = 2;
    snapshot.name = "checkpoint-2";
    snapshot.fingerprint = "fp2";
    journal.Record(2, "checkpoint-2", HandoffState::kSnapshotted, "", snapshot);
    journal.Record(2, "checkpoint-2", HandoffState::kUploaded);
    journal.Record(2, "checkpoint-2", HandoffState::kCommitted);
  }
  std::ofstream(path, std::ios::app) << R"({"seq": 3, "job_id": "jo)";  // the launcher died mid-append
  HandoffJournal journal(path);
  journal.SetScope("job", "file:///x");
  auto unfinished = journal.Unfinished();
  ASSERT_EQ(unfinished.size(), 1u);
  EXPECT_EQ(unfinished[0].name, "checkpoint-1");
  EXPECT_EQ(unfinished[0].snapshot->fingerprint, "fp1");
  EXPECT_TRUE(journal.Reached("checkpoint-2", "fp2", HandoffState::kCommitted));
  EXPECT_FALSE(journal.Reached("checkpoint-2", "other", HandoffState::kSnapshotted));
  EXPECT_EQ(journal.NextSeq(), 3u);
  journal.SetScope("another-job", "file:///x");  // another job on the same volume starts clean
  EXPECT_TRUE(journal.Unfinished().empty());
}

// A follower's version bound to node 0's save after it was snapshotted: the binding is
// replayed into its snapshot, so after a restart it answers that save and no other.
TEST(Journal, ABindingRecordedAfterTheSnapshotIsReplayed) {
  TempDir dir;
  const std::string path = dir.path() + "/journal.jsonl";
  Snapshot snapshot;
  snapshot.seq = 4;
  snapshot.name = "model.pt";
  snapshot.staging_dir = dir.path() + "/staging/4";
  snapshot.fingerprint = "fp4";
  {
    HandoffJournal journal(path);
    journal.SetScope("job", "file:///x");
    journal.Record(4, "model.pt", HandoffState::kSnapshotted, "torch-save", snapshot);
    journal.RecordAnswers(4, "save-of-node-0");
    journal.Record(4, "model.pt", HandoffState::kUploaded);
  }
  HandoffJournal journal(path);
  journal.SetScope("job", "file:///x");
  auto unfinished = journal.Unfinished();
  ASSERT_EQ(unfinished.size(), 1u);
  EXPECT_EQ(unfinished[0].state, HandoffState::kUploaded);
  EXPECT_EQ(unfinished[0].snapshot->answers, "save-of-node-0");
  EXPECT_TRUE(journal.Knows("model.pt"));
  EXPECT_FALSE(journal.Knows("export-1"));
  journal.SetScope("another-job", "file:///x");
  EXPECT_FALSE(journal.Knows("model.pt")) << "another job's records are not this job's";
}

// A launcher killed mid-append left a last line without its newline: the next launcher's
// first record was appended to it, and every later replay skipped both (found by the
// handoff_records fuzz target).
TEST(Journal, ARecordAppendedAfterATornLineIsReplayed) {
  TempDir dir;
  const std::string path = dir.path() + "/journal.jsonl";
  WriteBytes(path, R"({"seq": 1, "job_id": "job", "destination": "file:///x", "name": "checkpoint-1", "sta)");
  {
    HandoffJournal journal(path);
    journal.SetScope("job", "file:///x");
    journal.Record(journal.NextSeq(), "checkpoint-2", HandoffState::kCommitted);
  }
  HandoffJournal journal(path);
  journal.SetScope("job", "file:///x");
  auto entries = journal.Entries();
  ASSERT_EQ(entries.size(), 1u) << ReadFile(path);
  EXPECT_EQ(entries[0].name, "checkpoint-2");
  EXPECT_EQ(entries[0].state, HandoffState::kCommitted);
}

// The uploader reads each file at <staging_dir>/<path>: a replayed snapshot naming a path
// outside its checkpoint is no record.
TEST(Journal, ASnapshotNamingAPathOutsideItsCheckpointIsSkipped) {
  TempDir dir;
  const std::string path = dir.path() + "/journal.jsonl";
  for (const std::string bad : {"../../etc/passwd", "/etc/passwd", "a/../../b", ""}) {
    Snapshot snapshot;
    snapshot.seq = 1;
    snapshot.name = "checkpoint-1";
    snapshot.staging_dir = dir.path() + "/staging/1";
    snapshot.files = {{bad, 5, 1, StagingMethod::kCopy}};
    {
      std::filesystem::remove(path);
      HandoffJournal journal(path);
      journal.SetScope("job", "file:///x");
      journal.Record(1, "checkpoint-1", HandoffState::kSnapshotted, "", snapshot);
    }
    HandoffJournal journal(path);
    journal.SetScope("job", "file:///x");
    EXPECT_TRUE(journal.Unfinished().empty()) << bad;
  }
}

TEST(Journal, AVersionLosingFilesIsBeingDeletedAndAnotherJobsCommitStaysItsOwn) {
  TempDir dir;
  const std::string root = dir.path() + "/ckpts";
  WriteBytes(root + "/checkpoint-3/model.bin", "weights");
  WriteBytes(root + "/checkpoint-3/optimizer.pt", "moments");
  WriteBytes(root + "/checkpoint-3/trainer_state.json", "{}");
  const Candidate whole = OnlyCandidate(root);
  Snapshot snapshot = TakeSnapshot(root, whole, dir.path() + "/staging/1", 1);
  HandoffJournal journal(dir.path() + "/journal.jsonl");
  journal.SetScope("first-job", "file:///x");
  journal.Record(1, "checkpoint-3", HandoffState::kSnapshotted, "", snapshot);
  journal.Record(1, "checkpoint-3", HandoffState::kCommitted);
  EXPECT_FALSE(journal.HoldsMoreThan(whole)) << "the version itself is not being deleted";

  std::filesystem::remove(root + "/checkpoint-3/model.bin");  // rotation, one file at a time
  EXPECT_TRUE(journal.HoldsMoreThan(OnlyCandidate(root)));
  WriteBytes(root + "/checkpoint-3/optimizer.pt", "rewritten");  // not the recorded file any more
  EXPECT_FALSE(journal.HoldsMoreThan(OnlyCandidate(root)));

  journal.SetScope("second-job", "file:///x");
  EXPECT_EQ(journal.CommittedByAnotherJob("checkpoint-3", Fingerprint(whole)), "first-job");
  EXPECT_EQ(journal.CommittedByAnotherJob("checkpoint-3", "another-version"), std::nullopt);
  journal.SetScope("first-job", "file:///x");
  EXPECT_EQ(journal.CommittedByAnotherJob("checkpoint-3", Fingerprint(whole)), std::nullopt) << "its own job";
}

}  // namespace
}  // namespace bt::checkpoint
