// The three destination backends a test can reach without a network (file://, spool://),
// and the URI and rclone environment that every backend starts from.
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "storage/commit_record.h"
#include "storage/destination.h"
#include "storage/hash.h"
#include "storage/manifest.h"
#include "storage/spool.h"
#include "storage/subprocess.h"
#include "tests/support/launcher_process.h"

namespace bt::storage {
namespace {

using testing::ReadFile;
using testing::TempDir;
using testing::WriteFile;

// Two files staged as a checkpoint snapshot stages them.
StagedFiles StageOne(const TempDir& dir) {
  const std::string staged = dir.path() + "/staging/4";
  WriteFile(staged + "/weights/a.bin", std::string(70000, 'a'));
  WriteFile(staged + "/trainer_state.json", "{}");
  return StagedFiles{staged, {"trainer_state.json", "weights/a.bin"}, 70002, 4};
}

Manifest HeaderOf(const StagedFiles&) {
  Manifest manifest;
  manifest.job_id = "job";
  manifest.name = "checkpoint-4";
  manifest.layout = "huggingface";
  return manifest;
}

// The commit fence's last word (checkpoint/uploader.cpp): asked once `latest`'s new text is
// on disk, just before the rename; a no writes the record but keeps `latest` as it was, and
// leaves nothing beside it.
TEST(FileDestination, ACommitWhoseFenceSaysNoKeepsLatest) {
  TempDir dir;
  auto destination = OpenDestination(ParseDestination("file://" + dir.path() + "/remote/", "test"));
  destination->Commit(CommitRecord{"job", "checkpoint-4", {{0, "v4"}}}, true);
  int asked = 0;
  destination->Commit(CommitRecord{"job", "checkpoint-8", {{0, "v8"}}}, true, [&] { return ++asked < 2; });
  EXPECT_EQ(asked, 2) << "asked before the write and again before the rename";
  EXPECT_EQ(destination->ReadText("job/latest"), "checkpoint-4\n");
  EXPECT_TRUE(ReadCommit(*destination, "job", "checkpoint-8").has_value());
  std::vector<std::string> entries;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path() + "/remote/job")) {
    entries.push_back(entry.path().filename().string());
  }
  EXPECT_EQ(std::count_if(entries.begin(), entries.end(), [](const std::string& name) { return name.find("latest") != std::string::npos; }), 1)
      << "a temporary of `latest` was left";
  destination->Commit(CommitRecord{"job", "checkpoint-12", {{0, "v12"}}}, true, [] { return true; });
  EXPECT_EQ(destination->ReadText("job/latest"), "checkpoint-12\n");
}

TEST(FileDestination, WritesTheRemoteLayoutAndReadsItBack) {
  TempDir dir;
  StagedFiles staged = StageOne(dir);
  auto destination = OpenDestination(ParseDestination("file://" + dir.path() + "/remote/", "test"));
  uint64_t last_done = 0;
  Manifest uploaded = destination->Upload(staged, HeaderOf(staged), "job/rank-1", [&](uint64_t done, uint64_t total) {
    EXPECT_EQ(total, staged.total_bytes);
    last_done = done;
  });
  EXPECT_EQ(last_done, staged.total_bytes);
  CommitRecord commit{"job", "checkpoint-4", {{1, "v1"}}};
  destination->Commit(commit, true);
  // The digests were taken while copying: they must be those of the uploaded bytes.
  ASSERT_EQ(uploaded.files.size(), 2u);
  EXPECT_EQ(uploaded.total_bytes, staged.total_bytes);
  for (const auto& file : uploaded.files) {
    EXPECT_EQ(file.xxh3_128, HashFile(dir.path() + "/remote/job/rank-1/checkpoint-4/" + file.path).xxh3_128) << file.path;
  }
  Manifest stored = Manifest::FromJson(ReadFile(dir.path() + "/remote/job/rank-1/checkpoint-4.bt-manifest.json"), "test");
  EXPECT_EQ(stored.ToJson(), uploaded.ToJson());
  EXPECT_EQ(ReadFile(dir.path() + "/remote/job/rank-1/checkpoint-4/weights/a.bin").size(), 70000u);
  EXPECT_EQ(destination->ReadText("job/latest"), "checkpoint-4\n");
  auto latest = ReadLatestCommit(*destination, "job");
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->parts, commit.parts);
  EXPECT_EQ(PartRoot(*latest, 1), "job/rank-1/.bt-versions/v1");
  EXPECT_EQ(PartRoot(*latest, 0), std::nullopt) << "node 0 holds no part of it";
  EXPECT_EQ(destination->ReadText("job/nothing"), std::nullopt);
  EXPECT_EQ(destination->List("job", kManifestSuffix), (std::vector<std::string>{"rank-1/checkpoint-4.bt-manifest.json"}));
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir.path() + "/remote")) {
    EXPECT_EQ(entry.path().filename().string().find(".bt-upload"), std::string::npos) << "temporary left: " << entry.path();
  }
}

// A file of a checkpoint may have a name of NAME_MAX bytes (review finding F2: its upload's
// temporary name was longer, so it could never be uploaded and the drain failed 74).
TEST(FileDestination, UploadsAFileWhoseNameHas255Bytes) {
  TempDir dir;
  const std::string name(255, 'w');
  WriteFile(dir.path() + "/staging/4/" + name, "long");
  StagedFiles staged{dir.path() + "/staging/4", {name}, 4, 4};
  auto destination = OpenDestination(ParseDestination("file://" + dir.path() + "/remote/", "test"));
  destination->Upload(staged, HeaderOf(staged), "job/rank-1", [](uint64_t, uint64_t) {});
  EXPECT_EQ(ReadFile(dir.path() + "/remote/job/rank-1/checkpoint-4/" + name), "long");
}

// One descriptor per file until the batch ended: with the usual soft limit of 1024, a
// 1,500-file checkpoint failed with EMFILE on every retry. Here the limit leaves room for
// 100 more descriptors and the checkpoint has 600 files.
TEST(FileDestination, UploadsManyFilesWithinABoundedNumberOfDescriptors) {
  TempDir dir;
  constexpr int kFiles = 600;
  const std::string staged_dir = dir.path() + "/staging/9";
  StagedFiles staged{staged_dir, {}, 0, 9};
  for (int index = 0; index < kFiles; ++index) {
    const std::string path = "shards/part-" + std::to_string(index);
    WriteFile(staged_dir + "/" + path, std::to_string(index));
    staged.paths.push_back(path);
    staged.total_bytes += std::to_string(index).size();
  }
  size_t open_now = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) ++open_now;
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  rlimit tight = saved;
  tight.rlim_cur = open_now + 100;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &tight), 0);
  auto destination = OpenDestination(ParseDestination("file://" + dir.path() + "/remote", "test"));
  std::string error;
  try {
    destination->Upload(staged, HeaderOf(staged), "job/rank-0", [](uint64_t, uint64_t) {});
  } catch (const DestinationError& failure) {
    error = failure.what();
  }
  setrlimit(RLIMIT_NOFILE, &saved);
  ASSERT_EQ(error, "");
  EXPECT_EQ(ReadFile(dir.path() + "/remote/job/rank-0/checkpoint-4/shards/part-599"), "599");
}

TEST(FileDestination, AnUnwritableDestinationIsAnErrorNamingThePath) {
  TempDir dir;
  StagedFiles staged = StageOne(dir);
  WriteFile(dir.path() + "/blocker", "a file where a directory should be");
  auto destination = OpenDestination(ParseDestination("file://" + dir.path() + "/blocker/remote", "test"));
  try {
    destination->Upload(staged, HeaderOf(staged), "job/rank-0", [](uint64_t, uint64_t) {});
    FAIL();
  } catch (const DestinationError& error) {
    EXPECT_NE(std::string(error.what()).find("/blocker"), std::string::npos) << error.what();
  }
}

TEST(SpoolDestination, HandsOffARecordAndWaitsForTheAck) {
  TempDir dir;
  StagedFiles staged = StageOne(dir);
  std::filesystem::create_directories(dir.path() + "/spool");
  auto destination = OpenDestination(ParseDestination("spool://" + dir.path() + "/spool", "test"));
  const std::string record = dir.path() + "/spool/job--rank-0--4.json";
  std::thread sidecar([&] {
    while (!std::filesystem::exists(record)) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    auto value = nlohmann::json::parse(ReadFile(record));
    EXPECT_EQ(value["type"], "checkpoint");
    EXPECT_EQ(value["local_dir"], staged.dir);
    EXPECT_EQ(value["remote_dir"], "job/rank-0/checkpoint-4");
    EXPECT_EQ(value["manifest"]["files"].size(), 2u);
    WriteFile(record + ".ack", R"({"ok": true})");
  });
  destination->Upload(staged, HeaderOf(staged), "job/rank-0", [](uint64_t, uint64_t) {});
  sidecar.join();
  EXPECT_THROW(destination->ReadText("job/latest"), DestinationError);
}

// An ack that is not a JSON object (here an error ack read before the sidecar finished
// writing it) was taken for a success: the checkpoint counted as uploaded.
TEST(SpoolDestination, AnAckThatIsNoJsonObjectIsAnErrorNamingIt) {
  TempDir dir;
  StagedFiles staged = StageOne(dir);
  std::filesystem::create_directories(dir.path() + "/spool");
  auto destination = OpenDestination(ParseDestination("spool://" + dir.path() + "/spool", "test"));
  const std::string ack = dir.path() + "/spool/job--rank-0--4.json.ack";
  for (const std::string answer : {R"({"error": "AccessDen)", "", "ok", "[]"}) {
    std::thread sidecar([&] {
      while (!std::filesystem::exists(dir.path() + "/spool/job--rank-0--4.json")) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      WriteFile(ack, answer);
    });
    try {
      destination->Upload(staged, HeaderOf(staged), "job/rank-0", [](uint64_t, uint64_t) {});
      ADD_FAILURE() << "taken for a success: \"" << answer << "\"";
    } catch (const DestinationError& error) {
      EXPECT_NE(std::string(error.what()).find(ack + " is not a JSON object"), std::string::npos) << error.what();
    }
    sidecar.join();
    EXPECT_FALSE(std::filesystem::exists(ack)) << "the retry would read the same answer";
    std::filesystem::remove(dir.path() + "/spool/job--rank-0--4.json");
  }
}

TEST(ReadSpoolAck, SuccessFailureOrAnErrorNamingTheFile) {
  EXPECT_EQ(ReadSpoolAck("{}\n", "a.ack"), std::nullopt);
  EXPECT_EQ(ReadSpoolAck(R"({"ok": true})", "a.ack"), std::nullopt);
  EXPECT_EQ(ReadSpoolAck(R"({"error": "AccessDenied"})", "a.ack"), "AccessDenied");
  EXPECT_EQ(ReadSpoolAck(R"({"error": {"code": 403}})", "a.ack"), R"({"code":403})");
  try {
    ReadSpoolAck("\xff\xfe", "/spool/a.ack");
    FAIL();
  } catch (const DestinationError& error) {
    EXPECT_NE(std::string(error.what()).find("/spool/a.ack is not a JSON object"), std::string::npos) << error.what();
  }
}

// rclone's --files-from-raw reads one name a line: a file named "a\nb" was left out of the
// upload while the manifest listed it and `latest` was committed.
TEST(UncarriableName, NewlinesAreRefusedWhereTheyWouldBeLost) {
  const DestinationSpec s3 = ParseDestination("s3://bucket/prefix", "test");
  const DestinationSpec file = ParseDestination("file:///tmp/remote", "test");
  const std::vector<std::string> ordinary = {"checkpoint-1/model.bin", "checkpoint-1/with space.txt"};
  EXPECT_FALSE(UncarriableName(s3, "checkpoint-1", ordinary));
  for (const std::string odd : {"checkpoint-1/a\nb", "checkpoint-1/a\rb"}) {
    auto problem = UncarriableName(s3, "checkpoint-1", {"checkpoint-1/model.bin", odd});
    ASSERT_TRUE(problem) << odd;
    EXPECT_NE(problem->find(odd), std::string::npos) << *problem;
    EXPECT_FALSE(UncarriableName(file, "checkpoint-1", {odd})) << "file:// writes any name";
  }
  // `latest` is one line on every destination.
  EXPECT_TRUE(UncarriableName(file, "checkpoint-\n1", ordinary));
  EXPECT_TRUE(UncarriableName(s3, "checkpoint-\r1", ordinary));
}

bool ProcessIsGone(pid_t pid) {
  const std::string stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  if (stat.empty()) return true;
  const auto state_at = stat.rfind(')') + 2;
  return state_at < stat.size() && (stat[state_at] == 'Z' || stat[state_at] == 'X');
}

// The uploader SIGKILLed at the drain deadline left its rclone running, reparented to init,
// with the S3 keys in its environment. A helper started by RunProcess dies with its caller.
TEST(RunProcess, AHelperDoesNotOutliveTheProcessThatRanIt) {
  TempDir dir;
  const std::string pid_file = dir.path() + "/helper.pid";
  const pid_t caller = fork();
  ASSERT_GE(caller, 0);
  if (caller == 0) {
    RunProcess({"sh", "-c", "echo $$ > " + pid_file + ".tmp && mv " + pid_file + ".tmp " + pid_file + " && exec sleep 30"},
               {"PATH=/usr/bin:/bin"}, [](const std::string&) {});
    _exit(0);
  }
  pid_t helper = -1;
  for (int tries = 0; tries < 100 && helper < 0; ++tries) {
    const std::string text = ReadFile(pid_file);
    if (!text.empty()) helper = std::stoi(text);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  kill(caller, SIGKILL);
  waitpid(caller, nullptr, 0);
  ASSERT_GT(helper, 0) << "the helper never started";
  bool gone = false;
  for (int tries = 0; tries < 40 && !gone; ++tries) {
    gone = ProcessIsGone(helper);
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (!gone) kill(helper, SIGKILL);
  EXPECT_TRUE(gone) << "the helper outlived the process that ran it";
}

TEST(RunProcess, AProgramThatCannotBeStartedIs127) {
  ProcessResult result = RunProcess({"/nonexistent/bt-no-such-program"}, {}, [](const std::string&) {});
  EXPECT_EQ(result.exit_code, 127);
  EXPECT_NE(result.spawn_error.find("No such file"), std::string::npos) << result.spawn_error;
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

TEST(DestinationUri, CredentialsInTheUriAreMaskedInEveryMessage) {
  EXPECT_EQ(MaskCredentials("s3://AKIAEXAMPLE:wJalrXUtnFEMI@bucket/prefix"), "s3://***@bucket/prefix");
  EXPECT_EQ(MaskCredentials("gs://token@bucket"), "gs://***@bucket");
  EXPECT_EQ(MaskCredentials("s3://bucket/a@b"), "s3://bucket/a@b");  // an '@' in the path is no credential
  EXPECT_EQ(MaskCredentials("file:///data/x@y"), "file:///data/x@y");
  EXPECT_EQ(MaskCredentials("KEY:SECRET@bucket"), "***@bucket");  // not even a URI
  // AWS secret keys hold '/' and '+': the whole secret is masked, however many it has.
  EXPECT_EQ(MaskCredentials("s3://AKIAX:abc/def+gh/SECRET@bucket/x"), "s3://***@bucket/x");
  EXPECT_EQ(MaskCredentials("s3://AKIAX:se@cr/et@bucket/x"), "s3://***@bucket/x");
  EXPECT_THROW(ParseDestination("s3://AKIAX:abc/SECRET@bucket/x", "test"), DestinationError);
  for (const std::string uri : {"s3://AKIAEXAMPLE:wJalrXUtnFEMI@bucket/prefix", "s3:/AKIAEXAMPLE:wJalrXUtnFEMI@bucket"}) {
    try {
      ParseDestination(uri, "launcher.checkpoint.destination");
      FAIL() << "accepted " << uri;
    } catch (const DestinationError& error) {
      EXPECT_EQ(std::string(error.what()).find("wJalrXUtnFEMI"), std::string::npos) << error.what();
      EXPECT_NE(std::string(error.what()).find("launcher.checkpoint.destination"), std::string::npos) << error.what();
    }
  }
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
}  // namespace bt::storage
