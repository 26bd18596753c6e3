// The parts between "complete" and "uploaded": hashing, snapshot, manifest, journal,
// the watcher, and the file:// and spool:// destinations.
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>

#include <gtest/gtest.h>

#include "checkpoint/destination.h"
#include "checkpoint/hash.h"
#include "checkpoint/journal.h"
#include "checkpoint/layout.h"
#include "checkpoint/manifest.h"
#include "checkpoint/snapshot.h"
#include "checkpoint/watcher.h"
#include "tests/checkpoint/fixtures.h"
#include "tests/support/launcher_process.h"

namespace bt::checkpoint {
namespace {

using testing::ReadFile;
using testing::TempDir;
using testing::WriteBytes;

Candidate OnlyCandidate(const std::string& root) {
  auto candidates = FindCandidates(ScanTree(root, ".complete"), root, ".complete");
  EXPECT_EQ(candidates.size(), 1u);
  return candidates.at(0);
}

TEST(Hash, MatchesXxhsumForKnownInputs) {
  EXPECT_EQ(HashBytes("", 0), "99aa06d3014798d86001c324468d497f");  // `xxhsum -H2` of nothing
  EXPECT_EQ(HashBytes("abc", 3), "06b05ab6733a618578af5f94892f3950");
}

TEST(Hash, StreamingEqualsOneShotAcrossChunkBoundaries) {
  std::string data(10 << 20, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = char((i * 2654435761u) >> 24);
  TempDir dir;
  WriteBytes(dir.path() + "/f", data);
  FileDigest digest = HashFile(dir.path() + "/f");
  EXPECT_EQ(digest.size, data.size());
  EXPECT_EQ(digest.xxh3_128, HashBytes(data.data(), data.size()));
  Hasher pieces;
  for (size_t at = 0; at < data.size(); at += 777777) pieces.Update(data.data() + at, std::min<size_t>(777777, data.size() - at));
  EXPECT_EQ(pieces.Hex(), digest.xxh3_128);
}

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
  std::filesystem::remove_all(root + "/checkpoint-2");  // save_total_limit rotation
  EXPECT_EQ(ReadFile(dir.path() + "/staging/1/model.bin").size(), kCopyBelowBytes + 1);
  EXPECT_EQ(ReadFile(dir.path() + "/staging/1/trainer_state.json"), "{}");
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

TEST(Manifest, RoundTripsAndRejectsPathsThatLeaveTheRank) {
  Manifest manifest;
  manifest.job_id = "job";
  manifest.node_rank = 3;
  manifest.name = "checkpoint-9";
  manifest.layout = "huggingface";
  manifest.files = {{"model.safetensors", 12, "00112233445566778899aabbccddeeff"}};
  manifest.pointers = {{"latest", "checkpoint-9"}};
  manifest.total_bytes = 12;
  Manifest back = Manifest::FromJson(manifest.ToJson().dump(), "test");
  EXPECT_EQ(back.name, "checkpoint-9");
  EXPECT_EQ(back.node_rank, 3);
  EXPECT_EQ(back.files.at(0).xxh3_128, "00112233445566778899aabbccddeeff");
  EXPECT_EQ(back.pointers.at("latest"), "checkpoint-9");

  auto evil = manifest.ToJson();
  evil["files"][0]["path"] = "../../etc/passwd";
  EXPECT_THROW(Manifest::FromJson(evil.dump(), "test"), ManifestError);
  evil = manifest.ToJson();
  evil.erase("files");
  try {
    Manifest::FromJson(evil.dump(), "s3://b/job/rank-3/checkpoint-9.bt-manifest.json");
    FAIL();
  } catch (const ManifestError& error) {
    EXPECT_NE(std::string(error.what()).find("field files is missing"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("s3://b/job/rank-3"), std::string::npos);
  }
}

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

TEST(Watcher, SeesFilesInDirectoriesCreatedFasterThanTheWatchIsAdded) {
  TempDir dir;
  TreeWatcher watcher(dir.path(), env::WatchMode::kInotify, ".complete");
  ASSERT_FALSE(watcher.polling()) << watcher.polling_reason();
  EXPECT_EQ(watcher.watch_count(), 1u);
  std::filesystem::create_directories(dir.path() + "/checkpoint-1/sub/deeper");
  WriteBytes(dir.path() + "/checkpoint-1/sub/deeper/file", "x");
  EXPECT_TRUE(watcher.ReadEvents());
  EXPECT_EQ(watcher.watch_count(), 4u);  // root, checkpoint-1, sub, deeper: watch, then walk
  WriteBytes(dir.path() + "/checkpoint-1/sub/deeper/another", "y");
  EXPECT_TRUE(watcher.ReadEvents());
  EXPECT_FALSE(watcher.ReadEvents());
  std::filesystem::create_directories(dir.path() + "/.bt-checkpoint/staging");
  watcher.ReadEvents();
  EXPECT_EQ(watcher.watch_count(), 4u) << "hidden staging directories are not watched";
}

// The kernel copies fs.inotify.max_queued_events into an inotify instance when it is
// created. Lowered only while the watcher is created, it gives that watcher alone a tiny
// queue; the system's value is back before the test makes any event.
class InotifyQueueLimit {
 public:
  explicit InotifyQueueLimit(int events) {
    original_ = ReadFile(kPath);
    std::ofstream(kPath) << events << "\n";
    lowered_ = std::stoi(ReadFile(kPath)) == events;
  }
  ~InotifyQueueLimit() { std::ofstream(kPath) << original_; }
  bool lowered() const { return lowered_; }

 private:
  static constexpr const char* kPath = "/proc/sys/fs/inotify/max_queued_events";
  std::string original_;
  bool lowered_ = false;
};

TEST(Watcher, AQueueOverflowReWalksTheTreeAndWatchesTheDirectoriesItMissed) {
  TempDir dir;
  std::unique_ptr<TreeWatcher> watcher;
  {
    InotifyQueueLimit limit(16);
    if (!limit.lowered()) GTEST_SKIP() << "SKIPPED: cannot lower fs.inotify.max_queued_events (needs root)";
    watcher = std::make_unique<TreeWatcher>(dir.path(), env::WatchMode::kInotify, ".complete");
  }
  ASSERT_FALSE(watcher->polling()) << watcher->polling_reason();
  for (int i = 0; i < 40; ++i) std::filesystem::create_directories(dir.path() + "/checkpoint-" + std::to_string(i));
  EXPECT_TRUE(watcher->ReadEvents());
  EXPECT_EQ(watcher->overflow_count(), 1u);
  EXPECT_EQ(watcher->watch_count(), 41u) << "every directory, also those whose events the kernel dropped";
  WriteBytes(dir.path() + "/checkpoint-39/trainer_state.json", "{}");
  EXPECT_TRUE(watcher->ReadEvents()) << "a write in a directory whose creation event was dropped is seen";
}

TEST(Watcher, FlagsAClosedFileThatCanEndACheckpoint) {
  TempDir dir;
  TreeWatcher watcher(dir.path(), env::WatchMode::kInotify, ".complete");
  ASSERT_FALSE(watcher.polling()) << watcher.polling_reason();
  std::filesystem::create_directories(dir.path() + "/checkpoint-1");
  EXPECT_TRUE(watcher.ReadEvents());
  EXPECT_FALSE(watcher.saw_last_write());
  WriteBytes(dir.path() + "/checkpoint-1/model.safetensors", "weights");
  EXPECT_TRUE(watcher.ReadEvents());
  EXPECT_FALSE(watcher.saw_last_write()) << "the bulk of a checkpoint is paced";
  WriteBytes(dir.path() + "/checkpoint-1/trainer_state.json", "{}");
  EXPECT_TRUE(watcher.ReadEvents());
  EXPECT_TRUE(watcher.saw_last_write());
  WriteBytes(dir.path() + "/model.pt.tmp", "zip");
  EXPECT_TRUE(watcher.ReadEvents());
  EXPECT_FALSE(watcher.saw_last_write());
  std::filesystem::rename(dir.path() + "/model.pt.tmp", dir.path() + "/model.pt");
  EXPECT_TRUE(watcher.ReadEvents());
  EXPECT_TRUE(watcher.saw_last_write()) << "a torch.save file renamed into place at the top";
}

TEST(Watcher, PollModeHasNoDescriptorAndSaysWhy) {
  TempDir dir;
  TreeWatcher watcher(dir.path(), env::WatchMode::kPoll, ".complete");
  EXPECT_TRUE(watcher.polling());
  EXPECT_EQ(watcher.fd(), -1);
  EXPECT_NE(watcher.polling_reason().find("poll"), std::string::npos);
}

Snapshot StageOne(const TempDir& dir) {
  const std::string root = dir.path() + "/ckpts";
  WriteBytes(root + "/checkpoint-4/weights/a.bin", std::string(70000, 'a'));
  WriteBytes(root + "/checkpoint-4/trainer_state.json", "{}");
  return TakeSnapshot(root, OnlyCandidate(root), dir.path() + "/staging/4", 4);
}

Manifest HeaderOf(const Snapshot& snapshot) {
  Manifest manifest;
  manifest.job_id = "job";
  manifest.name = snapshot.name;
  manifest.layout = snapshot.layout;
  return manifest;
}

TEST(FileDestination, WritesTheRemoteLayoutAndReadsItBack) {
  TempDir dir;
  Snapshot snapshot = StageOne(dir);
  auto destination = OpenDestination(ParseDestination("file://" + dir.path() + "/remote/", "test"));
  uint64_t last_done = 0;
  Manifest uploaded = destination->Upload(snapshot, HeaderOf(snapshot), "job/rank-1", [&](uint64_t done, uint64_t total) {
    EXPECT_EQ(total, snapshot.total_bytes);
    last_done = done;
  });
  EXPECT_EQ(last_done, snapshot.total_bytes);
  destination->PublishLatest("job", "checkpoint-4");
  // The digests were taken while copying: they must be those of the uploaded bytes.
  ASSERT_EQ(uploaded.files.size(), 2u);
  EXPECT_EQ(uploaded.total_bytes, snapshot.total_bytes);
  for (const auto& file : uploaded.files) {
    EXPECT_EQ(file.xxh3_128, HashFile(dir.path() + "/remote/job/rank-1/checkpoint-4/" + file.path).xxh3_128) << file.path;
  }
  Manifest stored = Manifest::FromJson(ReadFile(dir.path() + "/remote/job/rank-1/checkpoint-4.bt-manifest.json"), "test");
  EXPECT_EQ(stored.ToJson(), uploaded.ToJson());
  EXPECT_EQ(ReadFile(dir.path() + "/remote/job/rank-1/checkpoint-4/weights/a.bin").size(), 70000u);
  EXPECT_EQ(destination->ReadText("job/latest"), "checkpoint-4\n");
  EXPECT_EQ(destination->ReadText("job/nothing"), std::nullopt);
  EXPECT_EQ(destination->List("job", kManifestSuffix), (std::vector<std::string>{"rank-1/checkpoint-4.bt-manifest.json"}));
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir.path() + "/remote")) {
    EXPECT_EQ(entry.path().filename().string().find(".bt-upload"), std::string::npos) << "temporary left: " << entry.path();
  }
}

TEST(FileDestination, AnUnwritableDestinationIsAnErrorNamingThePath) {
  TempDir dir;
  Snapshot snapshot = StageOne(dir);
  WriteBytes(dir.path() + "/blocker", "a file where a directory should be");
  auto destination = OpenDestination(ParseDestination("file://" + dir.path() + "/blocker/remote", "test"));
  try {
    destination->Upload(snapshot, HeaderOf(snapshot), "job/rank-0", [](uint64_t, uint64_t) {});
    FAIL();
  } catch (const DestinationError& error) {
    EXPECT_NE(std::string(error.what()).find("/blocker"), std::string::npos) << error.what();
  }
}

TEST(SpoolDestination, HandsOffARecordAndWaitsForTheAck) {
  TempDir dir;
  Snapshot snapshot = StageOne(dir);
  std::filesystem::create_directories(dir.path() + "/spool");
  auto destination = OpenDestination(ParseDestination("spool://" + dir.path() + "/spool", "test"));
  const std::string record = dir.path() + "/spool/job--rank-0--4.json";
  std::thread sidecar([&] {
    while (!std::filesystem::exists(record)) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    auto value = nlohmann::json::parse(ReadFile(record));
    EXPECT_EQ(value["type"], "checkpoint");
    EXPECT_EQ(value["local_dir"], snapshot.staging_dir);
    EXPECT_EQ(value["remote_dir"], "job/rank-0/checkpoint-4");
    EXPECT_EQ(value["manifest"]["files"].size(), 2u);
    WriteBytes(record + ".ack", R"({"ok": true})");
  });
  destination->Upload(snapshot, HeaderOf(snapshot), "job/rank-0", [](uint64_t, uint64_t) {});
  sidecar.join();
  EXPECT_THROW(destination->ReadText("job/latest"), DestinationError);
}

TEST(DestinationUri, BadUrisNameTheirOrigin) {
  EXPECT_THROW(ParseDestination("s3:/bucket", "launcher.checkpoint.destination"), DestinationError);
  try {
    ParseDestination("ftp://host/x", "BT_CHECKPOINT_DESTINATION");
    FAIL();
  } catch (const DestinationError& error) {
    EXPECT_NE(std::string(error.what()).find("BT_CHECKPOINT_DESTINATION: unsupported scheme \"ftp\""), std::string::npos);
  }
  EXPECT_THROW(ParseDestination("file://relative/path", "x"), DestinationError);
  EXPECT_EQ(ParseDestination("s3://bucket/prefix/", "x").location, "bucket/prefix");
}

TEST(RcloneEnvironment, CredentialsGoToTheEnvironmentAndNothingElseIsInherited) {
  std::map<std::string, std::string> inherited = {{"PATH", "/usr/bin"},
                                                  {"AWS_CA_BUNDLE", "/etc/ssl/custom.pem"},
                                                  {"AWS_ACCESS_KEY_ID", "AKIAENV"},
                                                  {"AWS_SECRET_ACCESS_KEY", "envsecret"},
                                                  {"AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9000"}};
  auto environ = RcloneEnvironment("s3", std::nullopt, "", inherited);
  auto has = [&](const std::string& entry) { return std::find(environ.begin(), environ.end(), entry) != environ.end(); };
  EXPECT_TRUE(has("RCLONE_CONFIG_BTDEST_ACCESS_KEY_ID=AKIAENV"));
  EXPECT_TRUE(has("RCLONE_CONFIG_BTDEST_ENDPOINT=http://127.0.0.1:9000"));
  EXPECT_TRUE(has("RCLONE_CONFIG_BTDEST_PROVIDER=Other"));
  for (const auto& entry : environ) EXPECT_EQ(entry.find("AWS_CA_BUNDLE"), std::string::npos);

  auto from_secret = RcloneEnvironment(
      "s3", R"({"aws_access_key_id": "AKIASECRET", "aws_secret_access_key": "s", "aws_region": "eu-west-1"})", "ckpt", inherited);
  EXPECT_NE(std::find(from_secret.begin(), from_secret.end(), "RCLONE_CONFIG_BTDEST_ACCESS_KEY_ID=AKIASECRET"), from_secret.end());
  EXPECT_NE(std::find(from_secret.begin(), from_secret.end(), "RCLONE_CONFIG_BTDEST_REGION=eu-west-1"), from_secret.end());
  try {
    RcloneEnvironment("s3", "not-json-TOPSECRET", "ckpt", inherited);
    FAIL();
  } catch (const DestinationError& error) {
    EXPECT_NE(std::string(error.what()).find("secret \"ckpt\""), std::string::npos);
    EXPECT_EQ(std::string(error.what()).find("TOPSECRET"), std::string::npos) << "the value must never be shown";
  }
}

}  // namespace
}  // namespace bt::checkpoint
