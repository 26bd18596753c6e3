// The job's record (launcher/report/recorder.h): one clock for every node (node 0's), a lane
// that survives its trip through the store or is refused naming the field, and node 0's
// cycles, hangs and commits placed on the axis whose 0 is the earliest launcher start.
#include "launcher/report/recorder.h"

#include <atomic>
#include <cmath>
#include <thread>

#include <gtest/gtest.h>

namespace bt::launcher::report {
namespace {

using namespace std::chrono_literals;
constexpr JobNs kSecond = 1'000'000'000;

TEST(JobClock, AFollowersTimesMoveByTheLeadersOffset) {
  JobClock clock;
  const auto now = std::chrono::steady_clock::now();
  const JobNs own = clock.At(now);
  clock.SetLeaderOffset(std::chrono::seconds(-7));  // node 0's wall clock is 7 s behind this host's
  EXPECT_EQ(clock.At(now), own - 7 * kSecond);
  EXPECT_EQ(clock.At(now + 2s) - clock.At(now), 2 * kSecond);  // steady: a wall-clock step moves nothing
  const auto wall = std::chrono::system_clock::now();
  EXPECT_EQ(clock.FromWall(wall), std::chrono::duration_cast<std::chrono::nanoseconds>(wall.time_since_epoch()).count() -
                                      7 * kSecond);
}

TEST(LaneRecord, SurvivesItsTripThroughTheStore) {
  LaneRecord lane{2, 1, "host-\xff\n2", {{"rendezvous", 10, 20}, {"run", 20, 90}}};
  const LaneRecord back = LaneRecordFromJson(LaneRecordToJson(lane));
  EXPECT_EQ(back.slot, 2);
  EXPECT_EQ(back.node, 1);
  ASSERT_EQ(back.phases.size(), 2u);
  EXPECT_EQ(back.phases[1].name, "run");
  EXPECT_EQ(back.phases[1].start, 20);
  EXPECT_EQ(back.phases[1].end, 90);
}

TEST(LaneRecord, ABadLaneNamesItsField) {
  const auto problem = [](const std::string& text) {
    try {
      LaneRecordFromJson(text);
    } catch (const std::invalid_argument& error) {
      return std::string(error.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(problem("{\"slot\": 1, \"node\": 1, \"host\": \"h\", \"phases\": [{\"name\": \"run\", \"start_ns\": 1.5, "
                    "\"end_ns\": 2}]}"),
            "phases[0].start_ns: expected an integer");
  EXPECT_EQ(problem("{\"slot\": 1, \"node\": 1, \"phases\": []}"), "host: missing");
  EXPECT_EQ(problem("{\"slot\": 1, \"no"), "not a JSON object");
  EXPECT_EQ(problem("[]"), "not a JSON object");
}

TEST(FaultKind, TheFailedNodesExitCodeNamesTheCause) {
  EXPECT_EQ(FaultKind(0), "lost");
  EXPECT_EQ(FaultKind(124), "hang");
  EXPECT_EQ(FaultKind(75), "unhealthy");
  EXPECT_EQ(FaultKind(1), "failure");
}

// Node 0's view of a job: cycle 0 failed on node 2, cycle 1 hung, cycle 2 succeeded; a lane
// of a follower that started earlier than node 0 is the axis' 0.
TEST(JobRecorder, PlacesCyclesHangsAndCommitsOnTheJobsAxis) {
  JobClock clock;
  JobRecorder recorder(clock);
  const JobNs t0 = clock.Now() - 5 * kSecond;  // the follower's start
  recorder.CycleRan(0, "");
  recorder.Committed("ckpt-1", t0 + 3 * kSecond, 0);
  recorder.CycleEnded(0);
  recorder.CycleFailed(0, t0 + 9 * kSecond, "failure", 2, "host-2", "node 2 failed: exit code 1");
  recorder.CycleRan(1, "ckpt-1");
  recorder.HangCalled(1, t0 + 10 * kSecond, t0 + 14 * kSecond);
  recorder.CycleEnded(1);
  recorder.CycleFailed(1, t0 + 14 * kSecond, "hang", 0, "host-0", "hung");
  recorder.CycleRan(2, "ckpt-1");
  recorder.CycleEnded(2);
  recorder.JobEnded("success", "exit 0");
  const std::vector<LaneRecord> lanes{{0, 0, "host-0", {{"run", t0 + 1 * kSecond, t0 + 6 * kSecond}}},
                                      {1, 1, "host-1", {{"identity", t0, t0 + kSecond}}}};
  const JobRecord record = recorder.Build(lanes, clock.Now() + kSecond, 1.2);
  ASSERT_EQ(record.cycles.size(), 3u);
  EXPECT_EQ(record.lanes[1].phases[0].start_s, 0);
  EXPECT_NEAR(record.cycles[0].end_s, 9, 1e-6);
  EXPECT_EQ(record.cycles[0].cause, "failure");
  EXPECT_EQ(record.cycles[0].node, 2);
  EXPECT_EQ(record.cycles[1].resumed_from, "ckpt-1");
  EXPECT_NEAR(*record.cycles[1].stall_start_s, 10, 1e-6);
  EXPECT_NEAR(*record.cycles[1].detected_s, 14, 1e-6);
  EXPECT_EQ(record.cycles[2].cause, "success");
  ASSERT_EQ(record.commits.size(), 1u);
  // Saved at 3 s by its folder's time, in cycle 0 which began at 5 s: a folder copied with its
  // old time, or a file server's clock behind, is taken as saved at its cycle's start (review
  // 9, F4: the whole cycle was charged as lost work).
  EXPECT_NEAR(record.commits[0].saved_s, record.cycles[0].start_s, 1e-6);
  EXPECT_GE(record.commits[0].committed_s, record.commits[0].saved_s);
  EXPECT_NEAR(record.training_end_s, record.cycles[2].end_s, 1e-6);
  const Goodput goodput = ComputeGoodput(record);
  EXPECT_NEAR(goodput.goodput_s + goodput.badput.Total(), goodput.wall_s, 1e-6);
}

// The live metrics' view (issue 31 §2): a cycle still running counts to now; its time since
// its last commit is uncommitted, not lost work, and the buckets still add up to the wall time.
TEST(JobRecorder, TheJobSoFarKeepsARunningCyclesUncommittedTimeApart) {
  JobClock clock;
  JobRecorder recorder(clock);
  const JobNs start = clock.Now() - 10 * kSecond;
  recorder.CycleRan(0, "");
  const JobNs ran = clock.Now();
  recorder.Committed("ckpt-1", ran, 0);
  const JobRecorder::SoFar so_far = recorder.JobSoFar(start, ran + 4 * kSecond);
  // 14 s and the moments between the test's own clock reads (microseconds on a loaded machine).
  const double wall = double(ran + 4 * kSecond - start) / 1e9;
  EXPECT_NEAR(so_far.goodput.wall_s, wall, 1e-9);
  EXPECT_NEAR(wall, 14, 0.01);
  EXPECT_NEAR(so_far.goodput.badput.prepare_s, 10, 0.01);
  EXPECT_NEAR(so_far.uncommitted_s, 4, 0.01);
  EXPECT_NEAR(so_far.goodput.badput.lost_work_s, 0, 1e-9);
  EXPECT_NEAR(so_far.goodput.goodput_s + so_far.goodput.badput.Total() + so_far.uncommitted_s, wall, 1e-6);
  EXPECT_EQ(so_far.commits, 1u);
  ASSERT_TRUE(so_far.latest_commit_age_s.has_value());
  EXPECT_NEAR(*so_far.latest_commit_age_s, 4, 0.01);

  // Once the cycle failed, its time after the commit is lost work, as at the job's end.
  recorder.CycleEnded(0);
  recorder.CycleFailed(0, ran + 3 * kSecond, "failure", 1, "host-1", "node 1 failed");
  const JobRecorder::SoFar failed = recorder.JobSoFar(start, ran + 4 * kSecond);
  EXPECT_EQ(failed.uncommitted_s, 0);
  EXPECT_NEAR(failed.goodput.badput.lost_work_s, 3, 0.01);
  EXPECT_NEAR(failed.goodput.goodput_s + failed.goodput.badput.Total(), wall, 1e-6);
}

// Review 11: a cycle starting while the metrics' thread read the job so far made node 0 take
// back() of an empty copy (SIGSEGV), or a failed cycle the running one. Every snapshot, taken
// while cycles start, fail and end, adds up and says "running" only of a cycle that runs.
TEST(JobRecorder, TheJobSoFarIsOneCopyWhileCyclesComeAndGo) {
  for (int round = 0; round < 200; ++round) {
    JobClock clock;
    JobRecorder recorder(clock);
    const JobNs start = clock.Now();
    std::atomic<bool> done = false;
    std::thread cycles([&] {
      for (int64_t cycle = 0; cycle < 20; ++cycle) {
        recorder.CycleRan(cycle, "");
        recorder.CycleEnded(cycle);
        recorder.CycleFailed(cycle, clock.Now(), "failure", 1, "host-1", "failed");
      }
      done = true;
    });
    while (!done) {
      const JobRecorder::SoFar so_far = recorder.JobSoFar(start, clock.Now());
      ASSERT_NEAR(so_far.goodput.goodput_s + so_far.goodput.badput.Total() + so_far.uncommitted_s, so_far.goodput.wall_s,
                  1e-6);
    }
    cycles.join();
  }
}

// A job ended by a restart's decision whose cycle never ran: the last cycle that ran keeps the
// fault the decision named, not "success".
TEST(JobRecorder, TheJobsEndNeverOverwritesAFaultADecisionNamed) {
  JobClock clock;
  JobRecorder recorder(clock);
  recorder.CycleRan(0, "");
  recorder.CycleEnded(0);
  recorder.CycleFailed(0, clock.Now(), "lost", 1, "host-1", "node 1 lost");
  recorder.JobEnded("failure", "stopped: not every node was ready");
  const JobRecord record = recorder.Build({}, clock.Now(), 1.2);
  ASSERT_EQ(record.cycles.size(), 1u);
  EXPECT_EQ(record.cycles[0].cause, "lost");
}

}  // namespace
}  // namespace bt::launcher::report

namespace bt::launcher::report {
namespace {

TEST(StepLog, KeepsAStepSeenAgainInANewCycleAndNoNegativeStep) {
  StepLog log;
  log.Note(1, 5);
  log.Note(2, 5);   // the same step again: no new sample
  log.Note(3, -1);  // no step
  log.BeginCycle(1);
  log.Note(4, 5);   // resumed at the step it had reached: a new cycle's first sample
  const std::vector<StepLogSample> samples = log.Samples();
  ASSERT_EQ(samples.size(), 2u);
  EXPECT_EQ(samples[1].cycle, 1);
}

// Past kMaxStepSamples every other sample goes, but never a cycle's first: where a restart
// went back stays known (review 10, F3).
TEST(StepLog, ThinningKeepsEveryCyclesFirstSample) {
  StepLog log;
  int64_t step = 0;
  for (size_t i = 0; i < StepLog::kMaxStepSamples - 1; ++i) log.Note(JobNs(i), ++step);
  log.BeginCycle(1);
  log.Note(JobNs(StepLog::kMaxStepSamples), step - 100);  // odd index: would go
  log.Note(JobNs(StepLog::kMaxStepSamples + 1), step);
  const std::vector<StepLogSample> samples = log.Samples();
  EXPECT_LT(samples.size(), StepLog::kMaxStepSamples);
  size_t cycle_starts = 0;
  for (size_t i = 0; i < samples.size(); ++i) cycle_starts += i > 0 && samples[i].cycle != samples[i - 1].cycle;
  EXPECT_EQ(cycle_starts, 1u);
  EXPECT_EQ(samples.back().step, step);
}

}  // namespace
}  // namespace bt::launcher::report
