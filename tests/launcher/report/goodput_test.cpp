// Goodput (launcher/report/goodput.h): every second of the wall time in exactly one bucket,
// lost work from the last kept save to the fault, a hang's bucket from the stall to its
// detection, and what the input gets wrong clamped and said.
#include "launcher/report/goodput.h"

#include <algorithm>
#include <cmath>
#include <random>

#include <gtest/gtest.h>

#include "tests/launcher/report/synthetic_jobs.h"

namespace bt::launcher::report {
namespace {

using testing::Hung;
using testing::Ran;
using testing::Saved;
using testing::SumOfBuckets;
using testing::SyntheticJob;

constexpr double kExact = 1e-9;

void ExpectAddsUp(const Goodput& goodput) {
  EXPECT_NEAR(SumOfBuckets(goodput), goodput.wall_s, kExact);
  for (double bucket : {goodput.goodput_s, goodput.badput.prepare_s, goodput.badput.restart_s, goodput.badput.lost_work_s,
                        goodput.badput.hang_s, goodput.badput.drain_s}) {
    EXPECT_GE(bucket, 0);
  }
  double cycles_goodput = 0;
  for (const CycleShare& share : goodput.cycles) cycles_goodput += share.goodput_s;
  EXPECT_NEAR(cycles_goodput, goodput.goodput_s, kExact);
}

TEST(Goodput, OneFaultKeepsProgressUpToTheCheckpointTheRestartResumedFrom) {
  const double run1 = 10, fault = 100, run2 = 115, end = 300, wall = 305;
  const JobRecord record = SyntheticJob(3,
                                        {Ran(1, run1, fault, "failure", 1), Ran(2, run2, end, "success", -1, "ckpt-80")},
                                        {Saved("ckpt-40", 40, 42), Saved("ckpt-80", 80, 83), Saved("ckpt-200", 200, 202)},
                                        wall, end);
  const Goodput goodput = ComputeGoodput(record);
  ExpectAddsUp(goodput);
  EXPECT_DOUBLE_EQ(goodput.wall_s, wall);
  EXPECT_NEAR(goodput.badput.prepare_s, run1, kExact);
  EXPECT_NEAR(goodput.badput.lost_work_s, fault - 80, kExact);
  EXPECT_NEAR(goodput.badput.restart_s, run2 - fault, kExact);
  EXPECT_NEAR(goodput.badput.drain_s, wall - end, kExact);
  EXPECT_NEAR(goodput.goodput_s, (80 - run1) + (end - run2), kExact);
  EXPECT_NEAR(goodput.goodput_ratio, goodput.goodput_s / wall, kExact);
  ASSERT_EQ(goodput.cycles.size(), 2u);
  EXPECT_EQ(goodput.cycles[0].kept, "ckpt-80");
  EXPECT_NEAR(goodput.cycles[0].restart_s, run2 - fault, kExact);
  EXPECT_EQ(goodput.cycles[0].cycle.host, "host-1");
  EXPECT_TRUE(goodput.notes.empty()) << goodput.notes.front();
}

TEST(Goodput, HangBucketIsTheStallUntilItsDetection) {
  const double run1 = 5, save = 140, stall = 150, detected = 180, stopped = 185, run2 = 200, end = 400, wall = 402;
  const JobRecord record = SyntheticJob(3,
                                        {Hung(1, run1, stopped, 2, stall, detected), Ran(2, run2, end, "success", -1, "ckpt")},
                                        {Saved("ckpt", save, save + 1)}, wall, end);
  const Goodput goodput = ComputeGoodput(record);
  ExpectAddsUp(goodput);
  EXPECT_NEAR(goodput.badput.hang_s, detected - stall, kExact);
  EXPECT_NEAR(goodput.badput.lost_work_s, stall - save, kExact);
  // Stopping the hung job after the call belongs to the restart, with the barrier and the load.
  EXPECT_NEAR(goodput.badput.restart_s, run2 - detected, kExact);
  EXPECT_NEAR(goodput.cycles[0].hang_s, detected - stall, kExact);
}

TEST(Goodput, OneFaultAndOneHangOnThreeNodes) {
  const JobRecord record = SyntheticJob(
      3,
      {Ran(1, 8, 60, "failure", 1), Hung(2, 70, 140, 2, 120, 135, "c-50"), Ran(3, 150, 260, "success", -1, "c-110")},
      {Saved("c-20", 20, 21), Saved("c-50", 50, 51), Saved("c-90", 90, 91), Saved("c-110", 110, 112)}, 265, 260);
  const Goodput goodput = ComputeGoodput(record);
  ExpectAddsUp(goodput);
  EXPECT_NEAR(goodput.cycles[0].lost_work_s, 60 - 50, kExact);
  EXPECT_NEAR(goodput.cycles[1].lost_work_s, 120 - 110, kExact);
  EXPECT_NEAR(goodput.cycles[1].hang_s, 135 - 120, kExact);
  EXPECT_NEAR(goodput.badput.lost_work_s, (60 - 50) + (120 - 110), kExact);
  EXPECT_NEAR(goodput.goodput_s, (50 - 8) + (110 - 70) + (260 - 150), kExact);
}

TEST(Goodput, ALostNodesSaveCommittedAfterTheFaultCountsWhenTheRestartResumedFromIt) {
  // Saved before the node was lost, its last rank's upload landed after: the commit gate let
  // it through and the next cycle resumed from it.
  const JobRecord record = SyntheticJob(2, {Ran(1, 10, 100, "lost", 1), Ran(2, 120, 200, "success", -1, "late")},
                                        {Saved("early", 50, 52), Saved("late", 90, 104)}, 201, 200);
  const Goodput goodput = ComputeGoodput(record);
  ExpectAddsUp(goodput);
  EXPECT_EQ(goodput.cycles[0].kept, "late");
  EXPECT_NEAR(goodput.cycles[0].lost_work_s, 100 - 90, kExact);
}

TEST(Goodput, ARestartFromAnOlderCheckpointLosesWhatTheNewerOneHeld) {
  // "late" committed, but the decision had already named "early": the job went on from there.
  const JobRecord record = SyntheticJob(2, {Ran(1, 10, 100, "failure", 0), Ran(2, 120, 200, "success", -1, "early")},
                                        {Saved("early", 50, 52), Saved("late", 90, 118)}, 200);
  const Goodput goodput = ComputeGoodput(record);
  ExpectAddsUp(goodput);
  EXPECT_EQ(goodput.cycles[0].kept, "early");
  EXPECT_NEAR(goodput.cycles[0].lost_work_s, 100 - 50, kExact);
}

TEST(Goodput, ARestartFromACheckpointOfAnEarlierCycleLosesTheWholeRun) {
  const JobRecord record = SyntheticJob(
      2, {Ran(1, 10, 100, "failure", 0), Ran(2, 110, 150, "failure", 1, "a"), Ran(3, 160, 250, "success", -1, "a")},
      {Saved("a", 60, 61)}, 250);
  const Goodput goodput = ComputeGoodput(record);
  ExpectAddsUp(goodput);
  EXPECT_EQ(goodput.cycles[1].kept, "");
  EXPECT_NEAR(goodput.cycles[1].goodput_s, 0, kExact);
  EXPECT_NEAR(goodput.cycles[1].lost_work_s, 150 - 110, kExact);
}

TEST(Goodput, ARestartFromNothingLosesTheRunAndSaysSoWhenACheckpointWasCommitted) {
  const JobRecord record = SyntheticJob(2, {Ran(1, 10, 100, "failure", 0), Ran(2, 110, 150, "success", -1, "")},
                                        {Saved("a", 60, 61)}, 150);
  const Goodput goodput = ComputeGoodput(record);
  ExpectAddsUp(goodput);
  EXPECT_NEAR(goodput.cycles[0].lost_work_s, 100 - 10, kExact);
  ASSERT_EQ(goodput.notes.size(), 1u);
  EXPECT_NE(goodput.notes[0].find("resumed from none"), std::string::npos) << goodput.notes[0];
}

TEST(Goodput, SuccessFirstTimeIsAllGoodputButPrepareAndDrain) {
  const double run = 12.5, end = 612.25, wall = 615;
  const Goodput goodput = ComputeGoodput(SyntheticJob(2, {Ran(1, run, end, "success")}, {}, wall, end));
  ExpectAddsUp(goodput);
  EXPECT_NEAR(goodput.goodput_s, end - run, kExact);
  EXPECT_NEAR(goodput.badput.prepare_s, run, kExact);
  EXPECT_NEAR(goodput.badput.drain_s, wall - end, kExact);
  EXPECT_NEAR(goodput.badput.lost_work_s + goodput.badput.restart_s + goodput.badput.hang_s, 0, kExact);
}

TEST(Goodput, AFailureAtTheEndKeepsOnlyWhatWasCommittedBeforeTheJobEnded) {
  const double run = 10, fault = 200, wall = 230;
  const Goodput goodput = ComputeGoodput(SyntheticJob(
      2, {Ran(1, run, fault, "failure", 1)},
      {Saved("a", 100, 101), Saved("b", 150, 225), Saved("never-committed", 190, wall + 10)}, wall));
  ExpectAddsUp(goodput);
  // "b" was committed during the drain, "never-committed" after the last launcher left.
  EXPECT_EQ(goodput.cycles[0].kept, "b");
  EXPECT_NEAR(goodput.badput.lost_work_s, fault - 150, kExact);
  EXPECT_NEAR(goodput.badput.drain_s, wall - fault, kExact);
  EXPECT_NEAR(goodput.training_end_s, fault, kExact);
}

TEST(Goodput, NoCommitAtAllLosesEveryFailedRun) {
  const Goodput goodput = ComputeGoodput(
      SyntheticJob(2, {Ran(1, 10, 50, "failure", 0), Ran(2, 60, 90, "unhealthy", 1), Ran(3, 95, 130, "success")}, {}, 131, 130));
  ExpectAddsUp(goodput);
  EXPECT_NEAR(goodput.badput.lost_work_s, (50 - 10) + (90 - 60), kExact);
  EXPECT_NEAR(goodput.goodput_s, 130 - 95, kExact);
}

TEST(Goodput, ACycleThatNeverRanIsRestartTimeOfTheFaultBeforeIt) {
  Cycle never_ran = Ran(2, -1, 70, "failure", 1, "a");
  const JobRecord record = SyntheticJob(2, {Ran(1, 10, 50, "failure", 0), never_ran, Ran(3, 90, 150, "success", -1, "a")},
                                        {Saved("a", 40, 41)}, 150);
  const Goodput goodput = ComputeGoodput(record);
  ExpectAddsUp(goodput);
  ASSERT_EQ(goodput.cycles.size(), 3u);
  EXPECT_NEAR(goodput.cycles[0].restart_s, 90 - 50, kExact);
  EXPECT_NEAR(goodput.cycles[1].goodput_s + goodput.cycles[1].lost_work_s, 0, kExact);
  EXPECT_NEAR(goodput.badput.restart_s, 90 - 50, kExact);
  // Judged by what cycle 2 (the next) tried to resume from.
  EXPECT_EQ(goodput.cycles[0].kept, "a");
}

TEST(Goodput, UnsortedInputGivesTheSameFiguresAndSaysSo) {
  std::vector<Cycle> cycles = {Ran(1, 10, 50, "failure", 0), Hung(2, 60, 100, 1, 80, 95, "a"), Ran(3, 110, 200, "success", -1, "b")};
  std::vector<Commit> commits = {Saved("a", 30, 31), Saved("b", 75, 76)};
  const Goodput sorted = ComputeGoodput(SyntheticJob(2, cycles, commits, 210, 200));
  std::reverse(cycles.begin(), cycles.end());
  std::reverse(commits.begin(), commits.end());
  const Goodput shuffled = ComputeGoodput(SyntheticJob(2, cycles, commits, 210, 200));
  ExpectAddsUp(shuffled);
  EXPECT_DOUBLE_EQ(shuffled.goodput_s, sorted.goodput_s);
  EXPECT_DOUBLE_EQ(shuffled.badput.lost_work_s, sorted.badput.lost_work_s);
  EXPECT_DOUBLE_EQ(shuffled.badput.hang_s, sorted.badput.hang_s);
  EXPECT_EQ(shuffled.cycles[0].cycle.cycle, 1);
  EXPECT_FALSE(shuffled.notes.empty());
}

TEST(Goodput, OverlappingCyclesAreTakenFromThePreviousEndAndSaid) {
  const Goodput goodput = ComputeGoodput(
      SyntheticJob(2, {Ran(1, 10, 100, "failure", 0), Ran(2, 90, 150, "success", -1, "")}, {}, 150, 150));
  ExpectAddsUp(goodput);
  EXPECT_NEAR(goodput.cycles[1].cycle.start_s, 100, kExact);
  EXPECT_NEAR(goodput.goodput_s, 150 - 100, kExact);
  ASSERT_FALSE(goodput.notes.empty());
  EXPECT_NE(goodput.notes[0].find("before the previous cycle ended"), std::string::npos) << goodput.notes[0];
}

TEST(Goodput, ACycleEndingBeforeItStartsIsZeroLengthAndSaid) {
  const Goodput goodput = ComputeGoodput(
      SyntheticJob(2, {Ran(1, 10, 50, "failure", 0), Ran(2, 80, 70, "failure", 1), Ran(3, 90, 120, "success")}, {}, 125, 120));
  ExpectAddsUp(goodput);
  EXPECT_NEAR(goodput.cycles[1].cycle.end_s, goodput.cycles[1].cycle.start_s, kExact);
  EXPECT_NEAR(goodput.cycles[1].lost_work_s, 0, kExact);
  bool said = false;
  for (const std::string& note : goodput.notes) said |= note.find("cycle 2 ends at") != std::string::npos;
  EXPECT_TRUE(said);
}

TEST(Goodput, AZeroLengthJobIsAllZerosWithoutNaN) {
  const Goodput goodput = ComputeGoodput(SyntheticJob(1, {}, {}, 0));
  EXPECT_EQ(goodput.wall_s, 0);
  EXPECT_EQ(goodput.goodput_ratio, 0);
  EXPECT_EQ(SumOfBuckets(goodput), 0);
  EXPECT_FALSE(std::isnan(goodput.goodput_ratio));
}

TEST(Goodput, AJobThatNeverRanIsAllPreparation) {
  const Goodput goodput = ComputeGoodput(SyntheticJob(2, {}, {}, 42));
  ExpectAddsUp(goodput);
  EXPECT_NEAR(goodput.badput.prepare_s, 42, kExact);
}

TEST(Goodput, TimesOutsideTheJobAreClampedIntoIt) {
  JobRecord record = SyntheticJob(2, {Ran(1, 10, 500, "failure", 0)}, {Saved("a", -5, 3)}, 100);
  record.wall_end_s = 100;
  const Goodput goodput = ComputeGoodput(record);
  ExpectAddsUp(goodput);
  EXPECT_NEAR(goodput.cycles[0].cycle.end_s, 100, kExact);
  EXPECT_NEAR(goodput.badput.drain_s, 0, kExact);
}

std::string CheckpointName(unsigned number) {
  std::string name = "c";
  name += std::to_string(number);
  return name;
}

// Any job, however odd its times, adds up: random cycles, causes, hangs and commits.
TEST(Goodput, RandomJobsAlwaysAddUp) {
  std::mt19937 random(31);
  std::uniform_real_distribution<double> time(-20, 1200);
  const char* causes[] = {"failure", "lost", "hang", "unhealthy", "promotion", "success", "stopped", "odd"};
  for (int round = 0; round < 500; ++round) {
    JobRecord record;
    record.wall_end_s = std::max(0.0, time(random));
    record.training_end_s = random() % 2 ? time(random) : -1;
    const int cycles = int(random() % 6);
    for (int i = 0; i < cycles; ++i) {
      Cycle cycle = Ran(i + 1, time(random), time(random), causes[random() % 8], int(random() % 4) - 1);
      if (cycle.cause == "hang") {
        cycle.stall_start_s = time(random);
        if (random() % 2) cycle.detected_s = time(random);
      }
      if (random() % 2) cycle.resumed_from = CheckpointName(random() % 5);
      record.cycles.push_back(cycle);
    }
    for (int i = 0; i < int(random() % 8); ++i) {
      record.commits.push_back(Saved(CheckpointName(random() % 5), time(random), time(random)));
    }
    const Goodput goodput = ComputeGoodput(record);
    ASSERT_NEAR(SumOfBuckets(goodput), goodput.wall_s, kExact) << "round " << round;
    ASSERT_GE(goodput.goodput_ratio, 0);
    ASSERT_LE(goodput.goodput_ratio, 1 + kExact);
    for (const CycleShare& share : goodput.cycles) {
      ASSERT_GE(share.goodput_s, 0);
      ASSERT_GE(share.lost_work_s, 0);
      ASSERT_GE(share.hang_s, 0);
      ASSERT_GE(share.restart_s, 0);
    }
  }
}

TEST(GoodputTable, ShowsEveryBucketAndCycleWithItsShare) {
  const Goodput goodput = ComputeGoodput(SyntheticJob(
      3, {Ran(1, 10, 100, "failure", 1), Hung(2, 110, 170, 2, 150, 165, "a"), Ran(3, 180, 300, "success", -1, "b")},
      {Saved("a", 80, 81), Saved("b", 140, 141)}, 310, 300));
  const std::string table = FormatGoodputTable(goodput);
  for (const char* bucket : {"goodput", "prepare", "restart", "lost work", "hang", "drain", "wall"}) {
    EXPECT_NE(table.find(bucket), std::string::npos) << bucket << "\n" << table;
  }
  char share[32];
  std::snprintf(share, sizeof share, "%.1f%%", 100 * goodput.badput.lost_work_s / goodput.wall_s);
  EXPECT_NE(table.find(share), std::string::npos) << share << "\n" << table;
  EXPECT_NE(table.find("host-1"), std::string::npos);
  EXPECT_NE(table.find("host-2"), std::string::npos);
  EXPECT_NE(table.find("hang"), std::string::npos);
  EXPECT_EQ(testing::Count(table, "\n  1 ") + testing::Count(table, "\n  2 ") + testing::Count(table, "\n  3 "), 3u) << table;
}

TEST(FormatSeconds, PicksAUnitAReaderCounts) {
  EXPECT_EQ(FormatSeconds(1.234), "1.23 s");
  EXPECT_EQ(FormatSeconds(75.25), "75.2 s");
  EXPECT_EQ(FormatSeconds(245), "4m05s");
  EXPECT_EQ(FormatSeconds(3723), "1h02m03s");
}

}  // namespace
}  // namespace bt::launcher::report
