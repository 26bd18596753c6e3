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

namespace {

// `text` in a temporary beside `path` (its directory created), written whole and synced;
// its name, or an error naming it (the temporary then gone).
std::string WriteTemporary(const std::string& path, std::string_view text, bool durable) {
  MakeDirectories(ParentOf(path));
  const std::string temporary = TemporaryNameBeside(path);
  FileDescriptor file(open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!file.valid()) ThrowErrno("cannot create " + temporary);
  try {
    WriteAll(file.get(), text, temporary);
    if ((durable && fsync(file.get()) != 0) || file.Close() != 0) ThrowErrno("cannot write " + temporary);
  } catch (...) {
    unlink(temporary.c_str());
    throw;
  }
  return temporary;
}

std::string WriteDurableTemporary(const std::string& path, std::string_view text) {
  return WriteTemporary(path, text, true);
}

void RenameOver(const std::string& temporary, const std::string& path) {
  if (rename(temporary.c_str(), path.c_str()) == 0) return;
  const int error = errno;
  unlink(temporary.c_str());
  errno = error;
  ThrowErrno("cannot rename " + temporary + " to " + path);
}

void SyncParentOf(const std::string& path) {
  const std::string directory = ParentOf(path);
  SyncDirectory(directory.empty() ? "." : directory);
}

}  // namespace

void WriteFileAtomically(const std::string& path, std::string_view text) {
  RenameOver(WriteDurableTemporary(path, text), path);
  SyncParentOf(path);
}

bool WriteFileAtomicallyIf(const std::string& path, std::string_view text, const std::function<bool()>& before_rename) {
  const std::string temporary = WriteDurableTemporary(path, text);
  if (!before_rename()) {
    unlink(temporary.c_str());
    return false;
  }
  RenameOver(temporary, path);
  SyncParentOf(path);
  return true;
}

void ReplaceFile(const std::string& path, std::string_view text) {
  const std::string temporary = WriteTemporary(path, text, false);
  // ext4 (auto_da_alloc) writes out a file renamed over another at once: 0.25 ms a file here.
  unlink(path.c_str());
  RenameOver(temporary, path);
}

bool WriteFileOnce(const std::string& path, std::string_view text) {
  const std::string temporary = WriteDurableTemporary(path, text);
  // link(2), unlike rename(2), fails when the name exists: of two writers, one wins.
  const bool created = link(temporary.c_str(), path.c_str()) == 0;
  const int error = errno;
  unlink(temporary.c_str());
  if (!created && error != EEXIST) {
    errno = error;
    ThrowErrno("cannot link " + temporary + " to " + path);
  }
  if (created) SyncParentOf(path);
  return created;
}

void SyncDirectory(const std::string& path) {
  FileDescriptor directory(open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (directory.valid()) fsync(directory.get());
}

}  // namespace bt::storage
