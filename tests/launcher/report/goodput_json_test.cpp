// goodput.json (launcher/report/goodput_json.h): what is written reads back the same; a
// corrupt or truncated file is an error naming the file and the field, never a crash.
#include "launcher/report/goodput_json.h"

#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <gtest/gtest.h>

#include "tests/launcher/report/synthetic_jobs.h"

namespace bt::launcher::report {
namespace {

using nlohmann::json;
using testing::Hung;
using testing::Ran;
using testing::Saved;
using testing::SyntheticJob;

constexpr const char* kOrigin = "/scratch/bt-launch/goodput.json";

Goodput AJobWithEverything() {
  JobRecord record = SyntheticJob(
      3, {Ran(1, 8, 60, "failure", 1), Hung(2, 70, 140, 2, 120, 135, "c-50"), Ran(3, 150, 260, "success", -1, "c-110")},
      {Saved("c-50", 50, 51), Saved("c-110", 110, 112)}, 265.125, 260);
  record.steps = {NodeSteps{0, {{10, 0}, {11, 1}, {12, 2}}}, NodeSteps{1, {{10, 0}, {12, 1}, {14, 2}}}};
  record.cycles[0].message = "exit code 1 \"quoted\"\nsecond line";
  return ComputeGoodput(record);
}

// The error a text gives; fails the test when it reads.
GoodputJsonError ErrorOf(const std::string& text) {
  try {
    ParseGoodputJson(text, kOrigin);
  } catch (const GoodputJsonError& error) {
    return error;
  }
  ADD_FAILURE() << "read without an error: " << text.substr(0, 200);
  return GoodputJsonError("", "", "");
}

std::string Dumped(const Goodput& goodput) { return GoodputToJson(goodput).dump(); }

TEST(GoodputJson, HasTheFieldsTheIssueNames) {
  const json document = GoodputToJson(AJobWithEverything());
  for (const char* field : {"version", "wall_s", "goodput_s", "goodput_ratio", "badput_s", "cycles", "lanes", "commits"}) {
    EXPECT_TRUE(document.contains(field)) << field;
  }
  for (const char* cause : {"prepare", "restart", "lost_work", "hang", "drain"}) {
    EXPECT_TRUE(document["badput_s"][cause].is_number()) << cause;
  }
  for (const char* field : {"cycle", "cause", "node", "host", "start_s", "end_s"}) {
    EXPECT_TRUE(document["cycles"][0].contains(field)) << field;
  }
}

TEST(GoodputJson, RoundTripsExactly) {
  const Goodput written = AJobWithEverything();
  const Goodput read = ParseGoodputJson(Dumped(written), kOrigin);
  EXPECT_EQ(GoodputToJson(read), GoodputToJson(written));
  EXPECT_EQ(read.wall_s, written.wall_s);
  EXPECT_EQ(read.badput.lost_work_s, written.badput.lost_work_s);
  ASSERT_EQ(read.cycles.size(), written.cycles.size());
  EXPECT_EQ(read.cycles[1].cycle.stall_start_s, written.cycles[1].cycle.stall_start_s);
  EXPECT_EQ(read.cycles[0].cycle.message, written.cycles[0].cycle.message);
  EXPECT_EQ(read.lanes.size(), 3u);
  ASSERT_TRUE(read.steps);
  EXPECT_EQ(read.steps->straggler_node, written.steps->straggler_node);
}

// Review 9, F5: a cycle that never reached its run may come with a null start (NaN where it
// was computed): read back as never ran, written back as null, not refused by `report`.
TEST(GoodputJson, ACycleThatNeverRanReadsBack) {
  json document = GoodputToJson(AJobWithEverything());
  document["cycles"][1]["start_s"] = nullptr;
  document["cycles"][1].erase("kept_s");
  const Goodput read = ParseGoodputJson(document.dump(), kOrigin);
  ASSERT_EQ(read.cycles.size(), 3u);
  EXPECT_TRUE(std::isnan(read.cycles[1].cycle.start_s));
  EXPECT_TRUE(GoodputToJson(read)["cycles"][1]["start_s"].is_null());
  document["cycles"][1].erase("start_s");
  EXPECT_EQ(ErrorOf(document.dump()).field(), "cycles[1].start_s");
}

// Review 9, F1: names are bytes (a checkpoint's need not be UTF-8): the file is written with
// them replaced, never an exception.
TEST(GoodputJson, ANameThatIsNotUtf8IsWrittenReplaced) {
  JobRecord record = SyntheticJob(2, {Ran(1, 1, 10, "success")}, {Saved("ep\xff-1.ckpt", 5, 6)}, 11, 10);
  const Goodput goodput = ComputeGoodput(record);
  std::string dir = "/tmp/bt-goodput-json-XXXXXX";
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  const std::string path = dir + "/goodput.json";
  std::string error;
  ASSERT_EQ(WriteGoodputJson(goodput, path, error), 0) << error;
  std::ifstream file(path);
  const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  std::filesystem::remove_all(dir);
  const Goodput read = ParseGoodputJson(text, path);
  ASSERT_EQ(read.commits.size(), 1u);
  EXPECT_EQ(read.commits[0].name, "ep\xef\xbf\xbd-1.ckpt");
}

TEST(GoodputJson, AFieldOfTheWrongTypeIsNamed) {
  json document = GoodputToJson(AJobWithEverything());
  document["cycles"][1]["start_s"] = "soon";
  const GoodputJsonError error = ErrorOf(document.dump());
  EXPECT_EQ(error.field(), "cycles[1].start_s");
  EXPECT_EQ(error.origin(), kOrigin);
  EXPECT_NE(std::string(error.what()).find(kOrigin), std::string::npos) << error.what();
  EXPECT_NE(std::string(error.what()).find("cycles[1].start_s"), std::string::npos) << error.what();
}

TEST(GoodputJson, AMissingFieldIsNamed) {
  json document = GoodputToJson(AJobWithEverything());
  document["badput_s"].erase("hang");
  EXPECT_EQ(ErrorOf(document.dump()).field(), "badput_s.hang");
  document = GoodputToJson(AJobWithEverything());
  document["lanes"][2]["phases"][3].erase("name");
  EXPECT_EQ(ErrorOf(document.dump()).field(), "lanes[2].phases[3].name");
}

TEST(GoodputJson, FiguresThatDoNotAddUpAreRefused) {
  json document = GoodputToJson(AJobWithEverything());
  document["badput_s"]["drain"] = document["badput_s"]["drain"].get<double>() + 7;
  EXPECT_EQ(ErrorOf(document.dump()).field(), "badput_s");
  document = GoodputToJson(AJobWithEverything());
  document["goodput_ratio"] = 0.999;
  EXPECT_EQ(ErrorOf(document.dump()).field(), "goodput_ratio");
}

TEST(GoodputJson, TimesOutsideTheJobAreRefused) {
  json document = GoodputToJson(AJobWithEverything());
  document["commits"][0]["committed_s"] = document["wall_s"].get<double>() + 100;
  EXPECT_EQ(ErrorOf(document.dump()).field(), "commits[0].committed_s");
  document = GoodputToJson(AJobWithEverything());
  document["cycles"][0]["end_s"] = -1;
  EXPECT_EQ(ErrorOf(document.dump()).field(), "cycles[0].end_s");
}

TEST(GoodputJson, AnotherVersionIsRefused) {
  json document = GoodputToJson(AJobWithEverything());
  document["version"] = 2;
  EXPECT_EQ(ErrorOf(document.dump()).field(), "version");
}

TEST(GoodputJson, NotAnObjectIsRefused) {
  EXPECT_NE(std::string(ErrorOf("[1, 2]").what()).find("expected an object"), std::string::npos);
  EXPECT_NE(std::string(ErrorOf("").what()).find(kOrigin), std::string::npos);
}

TEST(GoodputJson, ATruncationNamesTheFieldItBrokeIn) {
  const std::string text = Dumped(AJobWithEverything());
  const size_t inside_a_cycle = text.find("\"lost_work_s\"", text.find("\"cycles\"")) + 16;
  const GoodputJsonError error = ErrorOf(text.substr(0, inside_a_cycle));
  EXPECT_EQ(error.field(), "cycles[0].lost_work_s") << error.what();
  EXPECT_NE(std::string(error.what()).find("truncated"), std::string::npos) << error.what();
}

TEST(GoodputJson, EveryTruncationIsAnErrorNamingTheFile) {
  const std::string text = Dumped(AJobWithEverything());
  for (size_t length = 0; length < text.size(); length += 7) {
    const GoodputJsonError error = ErrorOf(text.substr(0, length));
    ASSERT_EQ(error.origin(), kOrigin) << length;
    // Once the first key is read, there is always a field to name.
    if (length > text.find(':')) {
      ASSERT_FALSE(error.field().empty()) << "cut at " << length << ": " << error.what();
    }
  }
}

TEST(GoodputJson, CorruptBytesAreAnErrorNeverACrash) {
  const std::string text = Dumped(AJobWithEverything());
  for (size_t at = 0; at < text.size(); at += 13) {
    for (char garbage : {'\0', '}', '"', 'x', '9', '['}) {
      std::string corrupt = text;
      corrupt[at] = garbage;
      try {
        ParseGoodputJson(corrupt, kOrigin);
      } catch (const GoodputJsonError& error) {
        ASSERT_EQ(error.origin(), kOrigin);
      }
    }
  }
}

}  // namespace
}  // namespace bt::launcher::report
