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
  // Found by fuzz.checkpoint_records in CI: a format of another type was nlohmann's
  // type_error, not a ManifestError, and ended a restart's decision with an internal error.
  EXPECT_NE(error_of(R"({"format": 1})").find("format is not"), std::string::npos) << error_of(R"({"format": 1})");
  EXPECT_NE(error_of(R"({"format": null})").find("format is not"), std::string::npos);
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

// Defect 25: the record carries its save, so that a record mixing two cycles' parts, or
// lacking a rank, can be told from a good one.
CommitRecord SavedRecord() {
  CommitRecord record{"job", "checkpoint-7", {{0, "aa"}, {2, "cc"}}};
  record.save = "aa";
  record.cycle = 3;
  record.rank_count = 3;
  record.no_part = {1};
  record.part_cycles = {{0, 3}, {2, 3}};
  return record;
}

TEST(CommitRecord, CarriesItsSaveAndEveryRanksAnswer) {
  const CommitRecord record = SavedRecord();
  const std::string text = record.ToText();
  EXPECT_NE(text.find(kCommitFormatWithSave), std::string::npos) << text;
  CommitRecord read = CommitRecord::FromText(text, "test");
  EXPECT_EQ(read.save, "aa");
  EXPECT_EQ(read.cycle, 3);
  EXPECT_EQ(read.rank_count, 3);
  EXPECT_EQ(read.no_part, std::set<int>{1});
  EXPECT_EQ(read.part_cycles, record.part_cycles);
  EXPECT_EQ(read.parts, record.parts);
  EXPECT_TRUE(CommitRecordProblems(read).empty());
}

TEST(CommitRecord, ARecordMixingCyclesOrLackingARankHasProblems) {
  CommitRecord mixed = SavedRecord();
  mixed.part_cycles[2] = 2;  // node 2's part of the cycle before
  auto problems = CommitRecordProblems(CommitRecord::FromText(mixed.ToText(), "test"));
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("rank 2's part was written in cycle 2"), std::string::npos) << problems[0];

  CommitRecord short_one = SavedRecord();
  short_one.no_part.clear();  // rank 1 neither has a part nor said it holds none
  problems = CommitRecordProblems(CommitRecord::FromText(short_one.ToText(), "test"));
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("rank 1 has neither a part nor"), std::string::npos) << problems[0];
}

// Records written before the save was carried are read as they always were, and cannot be
// checked for it (no problem is made up).
TEST(CommitRecord, ARecordOfFormatOneIsStillRead) {
  const std::string old_text = R"({"format": "bt-checkpoint-commit/1", "job_id": "job", "name": "checkpoint-1",
                                   "parts": {"0": "aa", "1": "bb"}})";
  CommitRecord read = CommitRecord::FromText(old_text, "test");
  EXPECT_EQ(read.parts, (std::map<int, std::string>{{0, "aa"}, {1, "bb"}}));
  EXPECT_EQ(read.rank_count, 0);
  EXPECT_TRUE(CommitRecordProblems(read).empty());
  const CommitRecord without_save{"job", "checkpoint-1", {{0, "aa"}}};
  EXPECT_NE(without_save.ToText().find(kCommitFormat), std::string::npos)
      << "a record that does not know its save is written as format 1";
}

TEST(CommitRecord, ABadSaveFieldNamesItsOrigin) {
  std::string text = SavedRecord().ToText();
  const std::string ranks = "\"ranks\": 3";
  ASSERT_NE(text.find(ranks), std::string::npos) << text;
  text.replace(text.find(ranks), ranks.size(), "\"ranks\": 0");
  try {
    CommitRecord::FromText(text, "s3://b/job/.bt-commits/x.json");
    FAIL() << "read";
  } catch (const ManifestError& error) {
    EXPECT_NE(std::string(error.what()).find("s3://b/job/.bt-commits/x.json: ranks"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace bt::storage
