// The job's own descriptions of its output files (watchdog::OutputFiles): what the job writes
// through them is progress; what the launcher logs, or anyone else appends to the same file,
// is not; neither writes over the other; pipes, devices and read-only descriptors are no files.
#include "launcher/watchdog/output_files.h"

#include <fcntl.h>
#include <unistd.h>

#include <string>

#include <gtest/gtest.h>

#include "tests/support/launcher_process.h"

namespace bt::launcher::watchdog {
namespace {

using bt::testing::ReadFile;
using bt::testing::TempDir;

void Write(int fd, const std::string& text) { ASSERT_EQ(write(fd, text.data(), text.size()), ssize_t(text.size())); }

// A file as `bt-launch run > train.log` gives it: opened for writing, not appending.
class OutputFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.path() + "/train.log";
    launcher_fd_ = open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    ASSERT_GE(launcher_fd_, 0);
  }
  void TearDown() override { close(launcher_fd_); }

  TempDir dir_;
  std::string path_;
  int launcher_fd_ = -1;
};

TEST_F(OutputFilesTest, WhatTheJobWritesIsProgressOnce) {
  OutputFiles files(launcher_fd_, -1);
  const int job = files.JobDescription(1);
  ASSERT_GE(job, 0);
  EXPECT_EQ(files.JobDescription(2), -1);
  files.Rebase();
  EXPECT_FALSE(files.JobWrote());
  Write(job, "step 1 loss 0.5\n");
  EXPECT_TRUE(files.JobWrote());
  EXPECT_FALSE(files.JobWrote()) << "the same write counted twice";
}

// The launcher's log lines, another launcher and another job appending to the same file
// move no offset of this job's.
TEST_F(OutputFilesTest, NobodyElsesWritesAreTheJobs) {
  OutputFiles files(launcher_fd_, -1);
  files.Rebase();
  const int other = open(path_.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  ASSERT_GE(other, 0);
  Write(launcher_fd_, "2026-11-26T23:01:01.123Z bt-launch[node 0] warn: watchdog: no progress\n");
  Write(other, "another job's line\n");
  EXPECT_FALSE(files.JobWrote());
  close(other);
}

// The launcher's description is switched to appending: its lines and the job's follow one
// another in the file, none written over.
TEST_F(OutputFilesTest, TheLaunchersLinesAndTheJobsAreBothKept) {
  OutputFiles files(launcher_fd_, -1);
  EXPECT_NE(fcntl(launcher_fd_, F_GETFL) & O_APPEND, 0);
  Write(launcher_fd_, "launcher 1\n");
  Write(files.JobDescription(1), "job 1\n");
  Write(launcher_fd_, "launcher 2\n");
  Write(files.JobDescription(1), "job 2\n");
  EXPECT_EQ(ReadFile(path_), "launcher 1\njob 1\nlauncher 2\njob 2\n");
}

// logrotate's copytruncate: the next write lands lower, and is still the job's progress.
TEST_F(OutputFilesTest, AWriteAfterATruncationIsProgress) {
  OutputFiles files(launcher_fd_, -1);
  Write(files.JobDescription(1), std::string(1000, 'x') + "\n");
  EXPECT_TRUE(files.JobWrote());
  ASSERT_EQ(ftruncate(launcher_fd_, 0), 0);
  EXPECT_FALSE(files.JobWrote());
  Write(files.JobDescription(1), "after the rotation\n");
  EXPECT_TRUE(files.JobWrote());
  EXPECT_EQ(ReadFile(path_), "after the rotation\n") << "no hole where the old content was";
}

TEST_F(OutputFilesTest, RebaseForgetsWhatCameBefore) {
  OutputFiles files(launcher_fd_, -1);
  Write(files.JobDescription(1), "cycle 0's last words\n");
  files.Rebase();
  EXPECT_FALSE(files.JobWrote());
}

// `> train.log 2>&1`: one description for both streams, as the shell's is one.
TEST_F(OutputFilesTest, OneFileForBothStreamsIsOneDescription) {
  const int again = dup(launcher_fd_);
  OutputFiles files(launcher_fd_, again);
  EXPECT_GE(files.JobDescription(1), 0);
  EXPECT_EQ(files.JobDescription(1), files.JobDescription(2));
  close(again);
}

// `> train.log 2> train.log`: two descriptions of the launcher's, both made to append.
TEST_F(OutputFilesTest, TwoDescriptionsOfOneFileBothAppend) {
  const int second = open(path_.c_str(), O_WRONLY | O_CLOEXEC);
  OutputFiles files(launcher_fd_, second);
  EXPECT_EQ(files.JobDescription(1), files.JobDescription(2));
  Write(launcher_fd_, "out\n");
  Write(files.JobDescription(1), "job\n");
  Write(second, "err\n");
  EXPECT_EQ(ReadFile(path_), "out\njob\nerr\n");
  close(second);
}

TEST(OutputFiles, OnlyARegularFileOpenForWritingIsOne) {
  TempDir dir;
  const std::string path = dir.Write("out", "");
  const int read_only = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  const int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
  int pipe_ends[2];
  ASSERT_EQ(pipe2(pipe_ends, O_CLOEXEC), 0);
  EXPECT_EQ(OutputFiles(read_only, null).JobDescription(1), -1);
  EXPECT_EQ(OutputFiles(read_only, null).JobDescription(2), -1) << "/dev/null is relayed: its output is still progress";
  EXPECT_EQ(OutputFiles(pipe_ends[1], -1).JobDescription(1), -1);
  OutputFiles none(-1, -1);
  EXPECT_FALSE(none.JobWrote());
  for (int fd : {read_only, null, pipe_ends[0], pipe_ends[1]}) close(fd);
}

}  // namespace
}  // namespace bt::launcher::watchdog
