// The one way bt-launch writes a file that must survive a crash: every byte written
// (EINTR retried, a short write continued), then either appended in place (journals) or
// written under a temporary name, synced and renamed (manifests, `latest`, records), so a
// reader sees the old content or the new, never a part. And the descriptor owner that
// keeps an exception between open and close from leaking the descriptor.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace bt::storage {

// Owns a file descriptor: closed when it goes out of scope.
class FileDescriptor {
 public:
  FileDescriptor() = default;
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor();
  FileDescriptor(FileDescriptor&& other) noexcept : fd_(other.Release()) {}
  FileDescriptor& operator=(FileDescriptor&& other) noexcept;
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release();
  // close(2)'s result: on NFS and FUSE a failed write may show up only here.
  int Close();

 private:
  int fd_ = -1;
};

// Writes all of `data` to `fd`. Throws std::runtime_error "cannot write <path>: <error>".
void WriteAll(int fd, std::string_view data, const std::string& path);

// The temporary name `path` is written under before its rename: in the same directory,
// unique to this process (a restarted uploader beside a dying one never shares it) and to
// the name, and short: a 255-byte name, legal itself, must not make its temporary longer
// than NAME_MAX.
std::string TemporaryNameBeside(const std::string& path);

// Creates `path`'s directory if needed, writes `text` to a temporary name beside it,
// fsyncs it, renames it over `path` and fsyncs the directory. Throws std::runtime_error
// naming the path; the temporary file is then gone.
void WriteFileAtomically(const std::string& path, std::string_view text);
// As WriteFileAtomically, but `before_rename` decides, once the new text is durable beside
// `path`, whether it replaces the old (true) or is removed (false, returned).
bool WriteFileAtomicallyIf(const std::string& path, std::string_view text, const std::function<bool()>& before_rename);

// As WriteFileAtomically, but not synced: a reader sees the old text, none, or the new text
// whole, but a crash right after may leave the file missing or empty; for a moment there is no
// file at `path` (the old one is removed first: ext4 writes a file renamed over another out at
// once). For what a later run writes again anyway (the
// job's report), where two fsyncs would cost every job's end milliseconds.
void ReplaceFile(const std::string& path, std::string_view text);

// As WriteFileAtomically, but never replaces: when `path` already exists (another writer
// got there first) it is left as it is and the answer is false.
bool WriteFileOnce(const std::string& path, std::string_view text);

// fsync of a directory, so that a rename or a new name in it is durable. Best effort: a
// directory that cannot be opened (already removed) is not an error.
void SyncDirectory(const std::string& path);

}  // namespace bt::storage
