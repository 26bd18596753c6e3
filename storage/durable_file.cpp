#include "storage/durable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "storage/hash.h"
#include "storage/paths.h"

namespace bt::storage {
namespace {

[[noreturn]] void ThrowErrno(const std::string& what) { throw std::runtime_error(what + ": " + std::strerror(errno)); }

}  // namespace

FileDescriptor::~FileDescriptor() {
  if (fd_ >= 0) close(fd_);
}

FileDescriptor& FileDescriptor::operator=(FileDescriptor&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = other.Release();
  }
  return *this;
}

int FileDescriptor::Release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

int FileDescriptor::Close() { return close(Release()); }

void WriteAll(int fd, std::string_view data, const std::string& path) {
  while (!data.empty()) {
    const ssize_t written = write(fd, data.data(), data.size());
    if (written < 0 && errno == EINTR) continue;
    if (written < 0) ThrowErrno("cannot write " + path);
    data.remove_prefix(size_t(written));
  }
}

std::string TemporaryNameBeside(const std::string& path) {
  const std::string name = BaseName(path);
  return JoinPath(ParentOf(path), ".bt-upload-" + std::to_string(getpid()) + "-" + HashBytes(name.data(), name.size()));
}

void WriteFileAtomically(const std::string& path, std::string_view text) {
  const std::string directory = ParentOf(path);
  MakeDirectories(directory);
  const std::string temporary = TemporaryNameBeside(path);
  FileDescriptor file(open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!file.valid()) ThrowErrno("cannot create " + temporary);
  try {
    WriteAll(file.get(), text, temporary);
    if (fsync(file.get()) != 0 || file.Close() != 0) ThrowErrno("cannot write " + temporary);
    if (rename(temporary.c_str(), path.c_str()) != 0) ThrowErrno("cannot rename " + temporary + " to " + path);
  } catch (...) {
    unlink(temporary.c_str());
    throw;
  }
  SyncDirectory(directory.empty() ? "." : directory);
}

bool WriteFileOnce(const std::string& path, std::string_view text) {
  const std::string directory = ParentOf(path);
  MakeDirectories(directory);
  const std::string temporary = TemporaryNameBeside(path);
  FileDescriptor file(open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!file.valid()) ThrowErrno("cannot create " + temporary);
  bool created = false;
  try {
    WriteAll(file.get(), text, temporary);
    if (fsync(file.get()) != 0 || file.Close() != 0) ThrowErrno("cannot write " + temporary);
    // link(2), unlike rename(2), fails when the name exists: of two writers, one wins.
    created = link(temporary.c_str(), path.c_str()) == 0;
    if (!created && errno != EEXIST) ThrowErrno("cannot link " + temporary + " to " + path);
  } catch (...) {
    unlink(temporary.c_str());
    throw;
  }
  unlink(temporary.c_str());
  if (created) SyncDirectory(directory.empty() ? "." : directory);
  return created;
}

void SyncDirectory(const std::string& path) {
  FileDescriptor directory(open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (directory.valid()) fsync(directory.get());
}

}  // namespace bt::storage
