// The watcher: inotify over the checkpoint tree, its overflow re-walk, and polling.
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "checkpoint/layout.h"
#include "checkpoint/watcher.h"
#include "tests/checkpoint/fixtures.h"
#include "tests/support/launcher_process.h"

namespace bt::checkpoint {
namespace {

using testing::ReadFile;
using testing::TempDir;
using testing::WriteBytes;

TEST(Watcher, SeesFilesInDirectoriesCreatedFasterThanTheWatchIsAdded) {
  TempDir dir;
  TreeWatcher watcher(dir.path(), env::WatchMode::kInotify, ".complete");
  ASSERT_FALSE(watcher.polling()) << watcher.polling_reason();
  EXPECT_EQ(watcher.watch_count(), 1u);
  std::filesystem::create_directories(dir.path() + "/checkpoint-1/sub/deeper");
  WriteBytes(dir.path() + "/checkpoint-1/sub/deeper/file", "x");
  EXPECT_TRUE(watcher.ReadEvents());
  EXPECT_EQ(watcher.watch_count(), 4u);  // root, checkpoint-1, sub, deeper: watch, then walk
  WriteBytes(dir.path() + "/checkpoint-1/sub/deeper/another", "y");
  EXPECT_TRUE(watcher.ReadEvents());
  EXPECT_FALSE(watcher.ReadEvents());
  std::filesystem::create_directories(dir.path() + "/.bt-checkpoint/staging");
  watcher.ReadEvents();
  EXPECT_EQ(watcher.watch_count(), 4u) << "hidden staging directories are not watched";
}

// The kernel copies fs.inotify.max_queued_events into an inotify instance when it is
// created. Lowered only while the watcher is created, it gives that watcher alone a tiny
// queue; the system's value is back before the test makes any event.
class InotifyQueueLimit {
 public:
  explicit InotifyQueueLimit(int events) {
    original_ = ReadFile(kPath);
    std::ofstream(kPath) << events << "\n";
    lowered_ = std::stoi(ReadFile(kPath)) == events;
  }
  ~InotifyQueueLimit() { std::ofstream(kPath) << original_; }
  bool lowered() const { return lowered_; }

 private:
  static constexpr const char* kPath = "/proc/sys/fs/inotify/max_queued_events";
  std::string original_;
  bool lowered_ = false;
};

TEST(Watcher, AQueueOverflowReWalksTheTreeAndWatchesTheDirectoriesItMissed) {
  TempDir dir;
  std::unique_ptr<TreeWatcher> watcher;
  {
    InotifyQueueLimit limit(16);
    if (!limit.lowered()) GTEST_SKIP() << "SKIPPED: cannot lower fs.inotify.max_queued_events (needs root)";
    watcher = std::make_unique<TreeWatcher>(dir.path(), env::WatchMode::kInotify, ".complete");
  }
  ASSERT_FALSE(watcher->polling()) << watcher->polling_reason();
  for (int i = 0; i < 40; ++i) std::filesystem::create_directories(dir.path() + "/checkpoint-" + std::to_string(i));
  EXPECT_TRUE(watcher->ReadEvents());
  EXPECT_EQ(watcher->overflow_count(), 1u);
  EXPECT_EQ(watcher->watch_count(), 41u) << "every directory, also those whose events the kernel dropped";
  WriteBytes(dir.path() + "/checkpoint-39/trainer_state.json", "{}");
  EXPECT_TRUE(watcher->ReadEvents()) << "a write in a directory whose creation event was dropped is seen";
}

TEST(Watcher, FlagsAClosedFileThatCanEndACheckpoint) {
  TempDir dir;
  TreeWatcher watcher(dir.path(), env::WatchMode::kInotify, ".complete");
  ASSERT_FALSE(watcher.polling()) << watcher.polling_reason();
  std::filesystem::create_directories(dir.path() + "/checkpoint-1");
  EXPECT_TRUE(watcher.ReadEvents());
  EXPECT_FALSE(watcher.saw_last_write());
  WriteBytes(dir.path() + "/checkpoint-1/model.safetensors", "weights");
  EXPECT_TRUE(watcher.ReadEvents());
  EXPECT_FALSE(watcher.saw_last_write()) << "the bulk of a checkpoint is paced";
  WriteBytes(dir.path() + "/checkpoint-1/trainer_state.json", "{}");
  EXPECT_TRUE(watcher.ReadEvents());
  EXPECT_TRUE(watcher.saw_last_write());
  WriteBytes(dir.path() + "/model.pt.tmp", "zip");
  EXPECT_TRUE(watcher.ReadEvents());
  EXPECT_FALSE(watcher.saw_last_write());
  std::filesystem::rename(dir.path() + "/model.pt.tmp", dir.path() + "/model.pt");
  EXPECT_TRUE(watcher.ReadEvents());
  EXPECT_TRUE(watcher.saw_last_write()) << "a torch.save file renamed into place at the top";
}

TEST(Watcher, PollModeHasNoDescriptorAndSaysWhy) {
  TempDir dir;
  TreeWatcher watcher(dir.path(), env::WatchMode::kPoll, ".complete");
  EXPECT_TRUE(watcher.polling());
  EXPECT_EQ(watcher.fd(), -1);
  EXPECT_NE(watcher.polling_reason().find("poll"), std::string::npos);
}

}  // namespace
}  // namespace bt::checkpoint
