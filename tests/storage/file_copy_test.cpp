// The hashing copy that file:// uploads use: exact bytes and digest at every size around the
// block and chunk boundaries, direct writes where the filesystem has them, buffered writes
// where it has not, and errors that name the path.
#include "storage/file_copy.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <linux/magic.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <vector>

#include <gtest/gtest.h>

#include "storage/hash.h"
#include "tests/support/launcher_process.h"

namespace bt::storage {
namespace {

using testing::ReadFile;
using testing::TempDir;
using testing::WriteFile;

constexpr uint64_t kBlock = 4096;

std::string Pattern(size_t size) {
  std::string data(size, '\0');
  for (size_t i = 0; i < size; ++i) data[i] = char((i * 2654435761u) >> 23);
  return data;
}

bool TakesDirectIo(const std::string& dir) {
  const std::string probe = dir + "/.direct-probe";
  int fd = open(probe.c_str(), O_WRONLY | O_CREAT | O_DIRECT, 0644);
  if (fd >= 0) close(fd);
  unlink(probe.c_str());
  return fd >= 0;
}

// tmpfs keeps every file in the page cache, written direct or not.
bool BackedByADisk(const std::string& dir) {
  struct statfs info {};
  return statfs(dir.c_str(), &info) == 0 && info.f_type != TMPFS_MAGIC;
}

// Pages of `path` in the page cache.
size_t CachedPages(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  struct stat info {};
  if (fd < 0 || fstat(fd, &info) != 0 || info.st_size == 0) {
    if (fd >= 0) close(fd);
    return 0;
  }
  void* map = mmap(nullptr, size_t(info.st_size), PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> resident((size_t(info.st_size) + page - 1) / page);
  mincore(map, size_t(info.st_size), resident.data());
  munmap(map, size_t(info.st_size));
  size_t cached = 0;
  for (unsigned char bits : resident) cached += bits & 1;
  return cached;
}

struct CopyOutcome {
  uint64_t buffered_bytes;
  size_t cached_pages;  // of the target, right after the copy
};

// Copies `data` from `dir`/source to `dir`/target and checks the bytes, the digest and the
// progress.
CopyOutcome CopyAndCheck(const std::string& dir, const std::string& data) {
  WriteFile(dir + "/source", data);
  uint64_t last_progress = 0;
  CopiedFile copied = CopyHashing(dir + "/source", dir + "/target", [&](uint64_t done) {
    EXPECT_GT(done, last_progress);
    last_progress = done;
  });
  EXPECT_EQ(fdatasync(copied.fd), 0);
  EXPECT_EQ(close(copied.fd), 0);
  EXPECT_EQ(copied.digest.size, data.size());
  EXPECT_EQ(copied.digest.xxh3_128, HashBytes(data.data(), data.size()));
  EXPECT_EQ(last_progress, data.size());
  const size_t cached_pages = CachedPages(dir + "/target");
  EXPECT_TRUE(ReadFile(dir + "/target") == data) << data.size() << " bytes differ after the copy";
  return {copied.buffered_bytes, cached_pages};
}

TEST(FileCopy, EverySizeAroundTheBlockAndChunkBoundariesIsCopiedAndHashedExactly) {
  TempDir dir;
  const bool direct = TakesDirectIo(dir.path());
  for (size_t size : {size_t(0), size_t(1), size_t(4095), size_t(4096), size_t(4097), size_t(4 << 20) - 1,
                      size_t(4 << 20), size_t(4 << 20) + 4097, size_t(9 << 20) + 123}) {
    SCOPED_TRACE(size);
    CopyOutcome outcome = CopyAndCheck(dir.path(), Pattern(size));
    if (!direct) {
      EXPECT_EQ(outcome.buffered_bytes, size);
      continue;
    }
    // Only the last partial block went through the page cache, and only it is there.
    EXPECT_EQ(outcome.buffered_bytes, size % kBlock);
    if (BackedByADisk(dir.path())) {
      EXPECT_LE(outcome.cached_pages, 1u);
    }
  }
}

TEST(FileCopy, OverwritesALongerTarget) {
  TempDir dir;
  WriteFile(dir.path() + "/target", Pattern(3 << 20));
  CopyAndCheck(dir.path(), "short");
}

TEST(FileCopy, AMissingSourceOrAnUncreatableTargetIsNamed) {
  TempDir dir;
  try {
    CopyHashing(dir.path() + "/nothing", dir.path() + "/target", nullptr);
    FAIL();
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find("cannot open " + dir.path() + "/nothing"), std::string::npos) << error.what();
  }
  WriteFile(dir.path() + "/source", "x");
  try {
    CopyHashing(dir.path() + "/source", dir.path() + "/no/such/dir/target", nullptr);
    FAIL();
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find("cannot create " + dir.path() + "/no/such/dir/target"), std::string::npos)
        << error.what();
  }
}

TEST(FileCopy, CopyFileCopiesWithProgressAndAMissingSourceIsSourceMissing) {
  TempDir dir;
  WriteFile(dir.path() + "/source", std::string(100000, 's'));
  uint64_t reported = 0;
  EXPECT_EQ(CopyFile(dir.path() + "/source", dir.path() + "/copy", [&](uint64_t done) { reported = done; }), 100000u);
  EXPECT_EQ(reported, 100000u);
  EXPECT_EQ(ReadFile(dir.path() + "/copy"), std::string(100000, 's'));
  // A rotation deleting the source: its own type, so a snapshot can call it "changed".
  EXPECT_THROW(CopyFile(dir.path() + "/gone", dir.path() + "/copy2"), SourceMissing);
  try {
    CopyFile(dir.path() + "/source", dir.path() + "/no/such/dir/copy");
    FAIL();
  } catch (const SourceMissing&) {
    FAIL() << "a missing target directory is not a missing source";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find("cannot create " + dir.path() + "/no/such/dir/copy"), std::string::npos);
  }
}

// Runs `body` in a child with a private mount namespace where `fstype` (with `options`) is
// mounted on `dir`; the child's exit status is body's result. Skips where mounts are not allowed.
void InPrivateMount(const std::string& dir, const char* fstype, const char* options, const std::function<int()>& body) {
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (unshare(CLONE_NEWNS) != 0 || mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        mount("none", dir.c_str(), fstype, 0, options) != 0) {
      _exit(77);
    }
    _exit(body());
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 77) GTEST_SKIP() << "SKIPPED: cannot mount " << fstype << " in a private mount namespace";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "see the child's output above";
}

TEST(FileCopy, AFilesystemWithoutDirectIoGetsBufferedWrites) {
  TempDir dir;
  const std::string data = Pattern((5 << 20) + 7);
  // ramfs refuses open(O_DIRECT) with EINVAL, as FUSE mounts without direct_io do.
  InPrivateMount(dir.path(), "ramfs", nullptr, [&] {
    if (TakesDirectIo(dir.path())) return 2;
    if (CopyAndCheck(dir.path(), data).buffered_bytes != data.size()) return 3;
    return ::testing::Test::HasFailure() ? 1 : 0;
  });
}

TEST(FileCopy, AFullFilesystemIsAnErrorNamingTheTarget) {
  TempDir source;
  WriteFile(source.path() + "/model.bin", Pattern(1 << 20));
  TempDir dir;
  InPrivateMount(dir.path(), "tmpfs", "size=256k", [&] {
    try {
      CopyHashing(source.path() + "/model.bin", dir.path() + "/target", nullptr);
    } catch (const std::runtime_error& error) {
      const std::string what = error.what();
      std::fprintf(stderr, "%s\n", what.c_str());
      return what.find("cannot write " + dir.path() + "/target: No space left on device") == std::string::npos ? 1 : 0;
    }
    return 4;
  });
}

}  // namespace
}  // namespace bt::storage
