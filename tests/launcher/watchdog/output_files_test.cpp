// The job's output files as progress (watchdog::OutputFiles): what the job appends counts,
// the launchers' own lines in the same file do not, in either log format, whole or seen in
// part; a truncated file and a burst of launcher lines longer than one look.
#include "launcher/watchdog/output_files.h"

#include <fcntl.h>
#include <unistd.h>

#include <string>

#include <gtest/gtest.h>

#include "tests/support/launcher_process.h"

namespace bt::launcher::watchdog {
namespace {

using bt::testing::TempDir;

constexpr const char* kTextLine = "2026-11-26T23:01:01.123Z bt-launch[node 3] warn: watchdog: this node's job made no progress\n";
constexpr const char* kJsonLine =
    "{\"level\":\"info\",\"msg\":\"watchdog: node 0 calls the job hung\",\"node\":1,\"ts\":\"2026-11-26T23:01:01.123Z\"}\n";

// A file as the launcher's stdout would be: open for writing, appended to.
class OutputFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.path() + "/train.log";
    fd_ = open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    ASSERT_GE(fd_, 0);
  }
  void TearDown() override { close(fd_); }
  void Append(const std::string& text) { ASSERT_EQ(write(fd_, text.data(), text.size()), ssize_t(text.size())); }

  TempDir dir_;
  std::string path_;
  int fd_ = -1;
};

TEST_F(OutputFilesTest, WhatTheJobAppendsIsProgressOnce) {
  Append("written before the watch began\n");
  OutputFiles files({fd_});
  ASSERT_FALSE(files.empty());
  EXPECT_FALSE(files.JobWrote()) << "what was there before counts";
  Append("step 1 loss 0.5\n");
  EXPECT_TRUE(files.JobWrote());
  EXPECT_FALSE(files.JobWrote()) << "the same line counted twice";
}

TEST_F(OutputFilesTest, LaunchersLinesInEitherFormatAreNotTheJobs) {
  OutputFiles files({fd_});
  Append(std::string(kTextLine) + kJsonLine + "bt-launch upload-worker: bad request: x\n");
  EXPECT_FALSE(files.JobWrote());
  Append(std::string(kTextLine) + "Traceback (most recent call last):\n" + kJsonLine);
  EXPECT_TRUE(files.JobWrote()) << "a job's line between launcher lines";
}

TEST_F(OutputFilesTest, JobLinesThatOnlyResembleALaunchersCount) {
  OutputFiles files({fd_});
  Append("2026-11-26T23:01:01.123Z INFO step 7\n");
  EXPECT_TRUE(files.JobWrote());
  Append("{\"level\":\"info\",\"msg\":\"a structlog line\"}\n");
  EXPECT_TRUE(files.JobWrote());
}

// A reader may see a write in part: a launcher's line waits for its newline, a job's
// line without one (a progress bar redrawn with \r) is progress at once.
TEST_F(OutputFilesTest, ALineSeenInPartIsJudgedWhole) {
  OutputFiles files({fd_});
  const std::string line = kTextLine;
  Append(line.substr(0, 30));
  EXPECT_FALSE(files.JobWrote());
  Append(line.substr(30));
  EXPECT_FALSE(files.JobWrote()) << "the rest of a launcher's line taken for the job's";
  Append(" 10%|#         | 1/10\r 20%|##        | 2/10\r");
  EXPECT_TRUE(files.JobWrote());
  Append(kJsonLine);
  EXPECT_FALSE(files.JobWrote()) << "a launcher line after the job's unfinished one";
}

TEST_F(OutputFilesTest, ATruncatedFileIsReadFromItsStart) {
  OutputFiles files({fd_});
  Append(std::string(1000, 'x') + "\n");
  EXPECT_TRUE(files.JobWrote());
  ASSERT_EQ(ftruncate(fd_, 0), 0);  // logrotate's copytruncate
  EXPECT_FALSE(files.JobWrote());
  Append("after the rotation\n");
  EXPECT_TRUE(files.JobWrote());
}

TEST_F(OutputFilesTest, ABurstOfLauncherLinesLongerThanALookIsNotProgressButWhatFollowsIs) {
  OutputFiles files({fd_});
  std::string burst;
  while (burst.size() < 1024 * 1024) burst += kTextLine;
  Append(burst);
  for (int look = 0; look < 8; ++look) EXPECT_FALSE(files.JobWrote()) << "look " << look;
  Append("epoch 2\n");
  bool seen = false;
  for (int look = 0; look < 8 && !seen; ++look) seen = files.JobWrote();
  EXPECT_TRUE(seen);
}

TEST_F(OutputFilesTest, RebaseForgetsWhatCameBefore) {
  OutputFiles files({fd_});
  Append("cycle 0's last words\n");
  files.Rebase();
  EXPECT_FALSE(files.JobWrote());
}

TEST_F(OutputFilesTest, OneFileGivenTwiceIsWatchedOnce) {
  const int again = dup(fd_);
  OutputFiles files({fd_, again});
  Append("a line\n");
  EXPECT_TRUE(files.JobWrote());
  EXPECT_FALSE(files.JobWrote());
  close(again);
}

TEST(LeftToTheJob, OnlyARegularFileOpenForWritingThatCanBeReadBack) {
  TempDir dir;
  const std::string path = dir.Write("out", "");
  const int file = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  const int read_only = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  const int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
  int pipe_ends[2];
  ASSERT_EQ(pipe2(pipe_ends, O_CLOEXEC), 0);
  EXPECT_TRUE(LeftToTheJob(file));
  EXPECT_FALSE(LeftToTheJob(read_only));
  EXPECT_FALSE(LeftToTheJob(null)) << "/dev/null is relayed: its output is still progress";
  EXPECT_FALSE(LeftToTheJob(pipe_ends[1]));
  EXPECT_FALSE(LeftToTheJob(-1));
  EXPECT_TRUE(OutputFiles({null, pipe_ends[1]}).empty());
  for (int fd : {file, read_only, null, pipe_ends[0], pipe_ends[1]}) close(fd);
}

}  // namespace
}  // namespace bt::launcher::watchdog
