// The three destination backends a test can reach without a network (file://, spool://),
// and the URI and rclone environment that every backend starts from.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "storage/destination.h"
#include "storage/hash.h"
#include "storage/manifest.h"
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
  destination->PublishLatest("job", "checkpoint-4");
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
  EXPECT_EQ(destination->ReadText("job/nothing"), std::nullopt);
  EXPECT_EQ(destination->List("job", kManifestSuffix), (std::vector<std::string>{"rank-1/checkpoint-4.bt-manifest.json"}));
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir.path() + "/remote")) {
    EXPECT_EQ(entry.path().filename().string().find(".bt-upload"), std::string::npos) << "temporary left: " << entry.path();
  }
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
