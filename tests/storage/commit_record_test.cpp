// The commit record: which version of each node's part is current. Names are bytes, bad
// records are errors naming where they came from, and `latest` without a record reads the
// layout from before versions existed.
#include "storage/commit_record.h"

#include <gtest/gtest.h>

#include "storage/destination.h"
#include "storage/manifest.h"
#include "tests/support/launcher_process.h"

namespace bt::storage {
namespace {

using testing::TempDir;

TEST(CommitRecord, RoundTripsANameOfAnyBytes) {
  CommitRecord record{"job", std::string("run 1/-ckpt-\xff\xfe"), {{0, "aa"}, {3, "bb"}}};
  CommitRecord read = CommitRecord::FromText(record.ToText(), "test");
  EXPECT_EQ(read.name, record.name);
  EXPECT_EQ(read.parts, record.parts);
  EXPECT_EQ(CommitRecordPath("job", record.name).find(record.name), std::string::npos)
      << "the name is one path segment whatever it holds";
}

TEST(CommitRecord, BadRecordsNameTheirOriginAndField) {
  const std::string good = CommitRecord{"job", "checkpoint-1", {{0, "aa"}}}.ToText();
  auto error_of = [](const std::string& text) {
    try {
      CommitRecord::FromText(text, "s3://b/job/.bt-commits/x.json");
    } catch (const ManifestError& error) {
      return std::string(error.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of("[]").find("s3://b/job/.bt-commits/x.json: the commit record is not a JSON object"), std::string::npos);
  std::string wrong_format = good;
  wrong_format.replace(wrong_format.find("commit/1"), 8, "commit/9");
  EXPECT_NE(error_of(wrong_format).find("format"), std::string::npos);
  std::string escaping = good;
  escaping.replace(escaping.find("\"aa\""), 4, "\"../../x\"");
  EXPECT_NE(error_of(escaping).find("parts.0: not a version id"), std::string::npos) << error_of(escaping);
  std::string bad_rank = good;
  bad_rank.replace(bad_rank.find("\"0\""), 3, "\"x\"");
  EXPECT_NE(error_of(bad_rank).find("parts: a key is not a node rank"), std::string::npos) << error_of(bad_rank);
  std::string bad_name = good;
  bad_name.replace(bad_name.find("checkpoint-1"), 12, "../etc");
  EXPECT_NE(error_of(bad_name).find("name"), std::string::npos) << error_of(bad_name);
}

TEST(CommitRecord, LatestWithoutARecordIsTheLayoutBeforeVersions) {
  TempDir dir;
  auto destination = OpenDestination(ParseDestination("file://" + dir.path(), "test"));
  EXPECT_EQ(ReadLatestCommit(*destination, "job"), std::nullopt);
  testing::WriteFile(dir.path() + "/job/latest", "global_step7\n");
  auto latest = ReadLatestCommit(*destination, "job");
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->name, "global_step7");
  EXPECT_EQ(PartRoot(*latest, 2), "job/rank-2");
  destination->Commit(CommitRecord{"job", "global_step7", {{0, "v7"}}}, false);
  EXPECT_EQ(PartRoot(*ReadLatestCommit(*destination, "job"), 0), "job/rank-0/.bt-versions/v7");
}

}  // namespace
}  // namespace bt::storage
