// The upload worker through the real binary: what it writes at the destination.
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "checkpoint/snapshot.h"
#include "checkpoint/uploader.h"
#include "storage/manifest.h"
#include "tests/checkpoint/fixtures.h"
#include "tests/support/launcher_process.h"

namespace bt::checkpoint {
namespace {

using testing::OnlyCandidate;
using testing::TempDir;
using testing::WriteBytes;
namespace fs = std::filesystem;

// Waits (10 s at most) for the worker to say the snapshot is uploaded.
bool AwaitUploaded(UploaderProcess& uploader) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd readable{uploader.fd(), POLLIN, 0};
    poll(&readable, 1, 100);
    bool exited = false;
    for (const UploaderEvent& event : uploader.ReadEvents(exited)) {
      if (event.kind == UploaderEvent::Kind::kUploaded) return true;
    }
    if (exited) return false;
  }
  return false;
}

struct FileIdentity {
  ino_t inode = 0;
  int64_t mtime_ns = 0;
  bool operator==(const FileIdentity&) const = default;
};

FileIdentity IdentityOf(const std::string& path) {
  struct stat status {};
  EXPECT_EQ(stat(path.c_str(), &status), 0) << path;
  return {status.st_ino, int64_t(status.st_mtim.tv_sec) * 1000000000 + status.st_mtim.tv_nsec};
}

// Two uploaders of the same files: a launcher frozen while a replacement took its slot on
// the same volume, each snapshotting the same checkpoint (review finding F1), or an
// uploader restarted after its predecessor finished. The version is named by its files'
// fingerprint, so both upload the same one; once its manifest is there (and a commit may
// name it), the second writes nothing: neither the manifest nor a file is replaced.
TEST(Uploader, AVersionAlreadyUploadedIsNeverWrittenAgain) {
  TempDir dir;
  const std::string root = dir.path() + "/ckpts";
  WriteBytes(root + "/checkpoint-7/model.bin", std::string(kCopyBelowBytes + 1, 'm'));
  const Snapshot snapshot = TakeSnapshot(root, OnlyCandidate(root), dir.path() + "/staging/1", 1);
  const std::string snapshot_path = dir.path() + "/snapshot.json";
  std::ofstream(snapshot_path) << snapshot.ToJson().dump();
  const UploaderConfig config{"file://" + dir.path() + "/remote", "job", 1};
  const std::string version = dir.path() + "/remote/job/rank-1/.bt-versions/" + snapshot.VersionId();
  const std::string manifest = version + "/" + storage::ManifestName("checkpoint-7");
  const std::string data = version + "/checkpoint-7/model.bin";
  {
    UploaderProcess first(BT_LAUNCH_BINARY, config, {});
    first.Upload(snapshot_path);
    ASSERT_TRUE(AwaitUploaded(first));
    first.Stop(2000);
  }
  const FileIdentity manifest_before = IdentityOf(manifest);
  const FileIdentity data_before = IdentityOf(data);
  UploaderProcess second(BT_LAUNCH_BINARY, config, {});
  second.Upload(snapshot_path);
  ASSERT_TRUE(AwaitUploaded(second)) << "a version already there was not taken as uploaded";
  second.Stop(2000);
  EXPECT_EQ(IdentityOf(manifest), manifest_before) << "the manifest was written again";
  EXPECT_EQ(IdentityOf(data), data_before) << "a file of the version was written again";
}

// The worker's events until one of `kind` (10 s at most); nullopt when it never came.
std::optional<UploaderEvent> AwaitEvent(UploaderProcess& uploader, UploaderEvent::Kind kind,
                                        std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd readable{uploader.fd(), POLLIN, 0};
    poll(&readable, 1, 50);
    bool exited = false;
    for (const UploaderEvent& event : uploader.ReadEvents(exited)) {
      if (event.kind == kind) return event;
    }
    if (exited) return std::nullopt;
  }
  return std::nullopt;
}

// The commit fence (review 13, F3; review 14, F1): the worker writes a commit only on its
// launcher's go, asked before each try, and a go whose lease ran out before the worker took it
// (a frozen worker, a launcher that lost rank 0 meanwhile) writes nothing.
TEST(Uploader, ACommitIsWrittenOnlyOnAGoTakenWithinItsLease) {
  TempDir dir;
  const std::string root = dir.path() + "/ckpts";
  WriteBytes(root + "/checkpoint-7/model.bin", std::string(100, 'm'));
  const Snapshot snapshot = TakeSnapshot(root, OnlyCandidate(root), dir.path() + "/staging/1", 1);
  const std::string snapshot_path = dir.path() + "/snapshot.json";
  std::ofstream(snapshot_path) << snapshot.ToJson().dump();
  const UploaderConfig config{"file://" + dir.path() + "/remote", "job", 0};
  storage::CommitRecord record;
  record.name = "checkpoint-7";
  record.save = snapshot.VersionId();
  record.parts[0] = snapshot.VersionId();
  const std::string latest = dir.path() + "/remote/job/latest";
  UploaderProcess uploader(BT_LAUNCH_BINARY, config, {});
  uploader.Upload(snapshot_path);
  ASSERT_TRUE(AwaitUploaded(uploader));

  uploader.Commit(1, record, true);
  ASSERT_TRUE(AwaitEvent(uploader, UploaderEvent::Kind::kCommitReady));
  EXPECT_FALSE(fs::exists(latest)) << "written before the launcher said go";
  uploader.AnswerCommit(1, false);
  EXPECT_FALSE(AwaitEvent(uploader, UploaderEvent::Kind::kLatestPublished, std::chrono::milliseconds(500)));
  EXPECT_FALSE(fs::exists(latest)) << "a dropped commit was written";

  uploader.Commit(1, record, true);
  ASSERT_TRUE(AwaitEvent(uploader, UploaderEvent::Kind::kCommitReady));
  kill(uploader.pid(), SIGSTOP);
  uploader.AnswerCommit(1, true, std::chrono::milliseconds(100));
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  kill(uploader.pid(), SIGCONT);
  EXPECT_FALSE(AwaitEvent(uploader, UploaderEvent::Kind::kLatestPublished, std::chrono::milliseconds(500)));
  EXPECT_FALSE(fs::exists(latest)) << "a go taken after its lease was written";

  // Review 15, F2: the launcher asked node 0, froze past the lease, and then read node 0's
  // "yes": the lease counts from the question, so that go has run out already.
  uploader.Commit(1, record, true);
  ASSERT_TRUE(AwaitEvent(uploader, UploaderEvent::Kind::kCommitReady));
  const int64_t asked_before_a_freeze = LeaseClockNs() - 400'000'000;
  uploader.AnswerCommit(1, true, std::chrono::milliseconds(300), asked_before_a_freeze);
  // Not written, and asked again after a pause (review 16: dropped without a word, the
  // launcher waited for it until its drain's deadline).
  ASSERT_TRUE(AwaitEvent(uploader, UploaderEvent::Kind::kRetrying));
  EXPECT_FALSE(fs::exists(latest)) << "a go whose lease ran out during the question was written";
  ASSERT_TRUE(AwaitEvent(uploader, UploaderEvent::Kind::kCommitReady, std::chrono::seconds(10)));
  uploader.AnswerCommit(1, true, std::chrono::seconds(5));
  EXPECT_TRUE(AwaitEvent(uploader, UploaderEvent::Kind::kLatestPublished));
  EXPECT_TRUE(fs::exists(latest));
  uploader.Stop(2000);
}

}  // namespace
}  // namespace bt::checkpoint
