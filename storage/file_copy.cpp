#include "storage/file_copy.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string_view>
#include <vector>

#include "storage/durable_file.h"
#include "storage/hash.h"

namespace bt::storage {
namespace {

// O_DIRECT wants offsets and lengths aligned to the logical block size: 4096 covers
// 512-byte and 4K devices. HashFile's buffer is aligned the same way.
constexpr size_t kBlock = 4096;

[[noreturn]] void Throw(const std::string& what, int error) {
  throw std::runtime_error(what + ": " + std::strerror(error));
}

struct OpenTarget {
  int fd = -1;
  bool direct = false;
  uint64_t buffered_bytes = 0;
};

// EINVAL from open(O_DIRECT) is the filesystem saying it has no direct I/O.
OpenTarget Create(const std::string& to) {
  constexpr int kFlags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
  int fd = open(to.c_str(), kFlags | O_DIRECT, 0644);
  if (fd >= 0) return {fd, true, 0};
  if (errno != EINVAL) Throw("cannot create " + to, errno);
  fd = open(to.c_str(), kFlags, 0644);
  if (fd < 0) Throw("cannot create " + to, errno);
  return {fd, false, 0};
}

void LeaveDirect(OpenTarget& target, const std::string& to) {
  int flags = fcntl(target.fd, F_GETFL);
  if (flags < 0 || fcntl(target.fd, F_SETFL, flags & ~O_DIRECT) != 0) Throw("cannot clear O_DIRECT on " + to, errno);
  target.direct = false;
}

// Whole blocks go direct; the file's last partial block, or a write the filesystem refuses
// to take direct (EINVAL: an alignment it does not support), goes through the page cache.
void WriteChunk(OpenTarget& target, const char* data, size_t size, const std::string& to) {
  while (size > 0) {
    size_t length = target.direct ? size - size % kBlock : size;
    if (length == 0) {
      LeaveDirect(target, to);
      continue;
    }
    ssize_t written = write(target.fd, data, length);
    if (written < 0 && errno == EINTR) continue;
    if (written < 0 && errno == EINVAL && target.direct) {
      LeaveDirect(target, to);
      continue;
    }
    if (written < 0) Throw("cannot write " + to, errno);
    if (written == 0) Throw("cannot write " + to, ENOSPC);
    if (!target.direct) target.buffered_bytes += uint64_t(written);
    data += written;
    size -= size_t(written);
  }
}

}  // namespace

CopiedFile CopyHashing(const std::string& from, const std::string& to, const std::function<void(uint64_t)>& on_bytes) {
  OpenTarget target = Create(to);
  try {
    FileDigest digest = HashFile(from, [&](const char* data, size_t size, uint64_t done) {
      WriteChunk(target, data, size, to);
      if (on_bytes) on_bytes(done);
    });
    return {target.fd, target.buffered_bytes, std::move(digest)};
  } catch (...) {
    close(target.fd);
    throw;
  }
}

uint64_t CopyFile(const std::string& from, const std::string& to, const std::function<void(uint64_t)>& on_bytes) {
  constexpr size_t kStep = 64 << 20;
  const FileDescriptor source(open(from.c_str(), O_RDONLY | O_CLOEXEC));
  if (!source.valid()) {
    if (errno == ENOENT) throw SourceMissing(from + " disappeared while it was being copied");
    Throw("cannot open " + from, errno);
  }
  FileDescriptor target(open(to.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!target.valid()) Throw("cannot create " + to, errno);
  uint64_t done = 0;
  bool in_kernel = true;
  std::vector<char> buffer;
  for (;;) {
    ssize_t copied = -1;
    if (in_kernel) {
      copied = copy_file_range(source.get(), nullptr, target.get(), nullptr, kStep, 0);
      if (copied < 0 && errno == EINTR) continue;
      if (copied < 0 && errno != EXDEV && errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP) {
        Throw("cannot copy " + from + " to " + to, errno);
      }
      in_kernel = copied >= 0;  // else these filesystems cannot: read and write from here on
    }
    if (!in_kernel) {
      buffer.resize(kStep);
      copied = read(source.get(), buffer.data(), buffer.size());
      if (copied < 0 && errno == EINTR) continue;
      if (copied < 0) Throw("cannot read " + from, errno);
      WriteAll(target.get(), std::string_view(buffer.data(), size_t(copied)), to);
    }
    if (copied == 0) break;
    done += uint64_t(copied);
    if (on_bytes) on_bytes(done);
  }
  if (target.Close() != 0) Throw("cannot write " + to, errno);
  return done;
}

}  // namespace bt::storage
