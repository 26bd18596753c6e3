// The one write helper every durable writer uses: whole writes, atomic replacement, no
// temporary left behind on any path, descriptors closed on every path.
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "storage/durable_file.h"
#include "tests/support/launcher_process.h"

namespace bt::storage {
namespace {

using testing::ReadFile;
using testing::TempDir;
using testing::WriteFile;

std::vector<std::string> NamesIn(const std::string& directory) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(directory)) names.push_back(entry.path().filename());
  return names;
}

size_t BaseNameLength(const std::string& path) { return std::filesystem::path(path).filename().string().size(); }

TEST(DurableFile, WriteFileAtomicallyCreatesTheDirectoryAndReplacesTheOldContentLeavingNoTemporary) {
  TempDir dir;
  const std::string path = dir.path() + "/a/b/latest";
  WriteFileAtomically(path, "checkpoint-1\n");
  EXPECT_EQ(ReadFile(path), "checkpoint-1\n");
  WriteFileAtomically(path, "checkpoint-22\n");
  EXPECT_EQ(ReadFile(path), "checkpoint-22\n");
  EXPECT_EQ(NamesIn(dir.path() + "/a/b"), std::vector<std::string>{"latest"});
}

TEST(DurableFile, AFailedWriteNamesThePathAndLeavesTheOldFileAndNoTemporary) {
  TempDir dir;
  WriteFile(dir.path() + "/blocker", "a file where a directory should be");
  try {
    WriteFileAtomically(dir.path() + "/blocker/latest", "x");
    FAIL() << "a path under a regular file was written";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find(dir.path() + "/blocker"), std::string::npos) << error.what();
  }
  // A directory in the way of the rename: the temporary must not stay behind beside it.
  std::filesystem::create_directories(dir.path() + "/target/inside");
  EXPECT_THROW(WriteFileAtomically(dir.path() + "/target", "x"), std::runtime_error);
  for (const auto& name : NamesIn(dir.path())) EXPECT_EQ(name.find(".bt-upload"), std::string::npos) << name;
}

// A name of NAME_MAX bytes is legal; its temporary must be too (review finding F2: a
// `.bt-upload-<pid>-<name>` temporary was over 255 bytes, so every attempt failed).
TEST(DurableFile, ANameOf255BytesIsWrittenThroughAShortTemporary) {
  TempDir dir;
  const std::string path = dir.path() + "/" + std::string(255, 'n');
  WriteFileAtomically(path, "x");
  EXPECT_EQ(ReadFile(path), "x");
  EXPECT_LE(BaseNameLength(TemporaryNameBeside(path)), 64u);
  EXPECT_NE(TemporaryNameBeside(path), TemporaryNameBeside(dir.path() + "/" + std::string(254, 'n')));
}

// Of two writers of one name, the first wins and the second changes nothing: a version's
// manifest, once written, may be named by a commit.
TEST(DurableFile, WriteFileOnceNeverReplaces) {
  TempDir dir;
  const std::string path = dir.path() + "/v/manifest.json";
  EXPECT_TRUE(WriteFileOnce(path, "first"));
  EXPECT_FALSE(WriteFileOnce(path, "second"));
  EXPECT_EQ(ReadFile(path), "first");
  EXPECT_EQ(NamesIn(dir.path() + "/v"), std::vector<std::string>{"manifest.json"});
}

// A blocking write to a pipe returns short only when a signal interrupts it after some of
// its bytes went in: a timer without SA_RESTART interrupts this thread every millisecond
// while a slow reader keeps the pipe full, so one write(2) alone would lose most of the data.
TEST(DurableFile, WriteAllDeliversEveryByteThroughShortWrites) {
  int pipe_fds[2];
  ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);
  const FileDescriptor read_end(pipe_fds[0]);
  FileDescriptor write_end(pipe_fds[1]);
  const std::string data(4 << 20, 'z');
  std::string received;
  sigset_t alarm;
  sigemptyset(&alarm);
  sigaddset(&alarm, SIGALRM);
  std::thread reader([&] {
    pthread_sigmask(SIG_BLOCK, &alarm, nullptr);  // the interruptions are the writer's
    char buffer[16384];
    for (ssize_t got; (got = read(read_end.get(), buffer, sizeof buffer)) > 0;) {
      received.append(buffer, size_t(got));
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  struct sigaction interrupt {};
  interrupt.sa_handler = [](int) {};
  sigemptyset(&interrupt.sa_mask);
  struct sigaction previous {};
  sigaction(SIGALRM, &interrupt, &previous);
  const itimerval every_millisecond{{0, 1000}, {0, 1000}};
  setitimer(ITIMER_REAL, &every_millisecond, nullptr);
  WriteAll(write_end.get(), data, "the pipe");
  const itimerval off{};
  setitimer(ITIMER_REAL, &off, nullptr);
  sigaction(SIGALRM, &previous, nullptr);
  write_end.Close();
  reader.join();
  EXPECT_EQ(received.size(), data.size());
  EXPECT_TRUE(received == data) << "the bytes differ";  // not printed: 4 MiB
}

TEST(DurableFile, WriteAllToAClosedPipeNamesWhatItWrote) {
  int pipe_fds[2];
  ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);
  close(pipe_fds[0]);
  const FileDescriptor write_end(pipe_fds[1]);
  signal(SIGPIPE, SIG_IGN);
  try {
    WriteAll(write_end.get(), "x", "the uploader's requests");
    FAIL();
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find("cannot write the uploader's requests"), std::string::npos) << error.what();
  }
}

TEST(DurableFile, FileDescriptorClosesWhenItGoesOutOfScopeAndWhenMovedOver) {
  int fd = -1;
  {
    const FileDescriptor file(open("/dev/null", O_RDONLY | O_CLOEXEC));
    fd = file.get();
    ASSERT_GE(fd, 0);
  }
  EXPECT_EQ(fcntl(fd, F_GETFD), -1) << "descriptor " << fd << " leaked";
  FileDescriptor first(open("/dev/null", O_RDONLY | O_CLOEXEC));
  const int first_fd = first.get();
  first = FileDescriptor(open("/dev/null", O_RDONLY | O_CLOEXEC));
  EXPECT_EQ(fcntl(first_fd, F_GETFD), -1) << "the replaced descriptor leaked";
  EXPECT_TRUE(first.valid());
}

}  // namespace
}  // namespace bt::storage
