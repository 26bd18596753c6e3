#include "checkpoint/snapshot.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "checkpoint/hash.h"

namespace bt::checkpoint {
namespace {

int64_t Nanos(const timespec& time) { return int64_t(time.tv_sec) * 1'000'000'000 + time.tv_nsec; }

[[noreturn]] void ThrowErrno(const std::string& what) { throw std::runtime_error(what + ": " + std::strerror(errno)); }

const char* MethodName(StagingMethod method) {
  switch (method) {
    case StagingMethod::kReflink: return "reflink";
    case StagingMethod::kHardlink: return "hardlink";
    case StagingMethod::kCopy: return "copy";
  }
  return "copy";
}

StagingMethod MethodFromName(const std::string& name) {
  if (name == "reflink") return StagingMethod::kReflink;
  if (name == "hardlink") return StagingMethod::kHardlink;
  return StagingMethod::kCopy;
}

// FICLONE shares the blocks copy-on-write (XFS, btrfs): as cheap as a link, and immune to
// in-place rewrites. EOPNOTSUPP/EXDEV/EINVAL elsewhere (ext4, overlayfs).
bool TryReflink(const std::string& from, const std::string& to) {
  int source = open(from.c_str(), O_RDONLY | O_CLOEXEC);
  if (source < 0) return false;
  int target = open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (target < 0) {
    close(source);
    return false;
  }
  bool cloned = ioctl(target, FICLONE, source) == 0;
  close(source);
  close(target);
  if (!cloned) unlink(to.c_str());
  return cloned;
}

struct ClosesOnExit {
  int fd;
  ~ClosesOnExit() {
    if (fd >= 0) close(fd);
  }
  int Close() {
    const int result = close(fd);
    fd = -1;
    return result;
  }
};

void WriteAll(int fd, const char* data, size_t size, const std::string& path) {
  while (size > 0) {
    const ssize_t written = write(fd, data, size);
    if (written < 0 && errno == EINTR) continue;
    if (written < 0) ThrowErrno("cannot write " + path);
    data += written;
    size -= size_t(written);
  }
}

StagingMethod Stage(const std::string& from, const std::string& to, uint64_t size) {
  if (size > kCopyBelowBytes) {
    if (TryReflink(from, to)) return StagingMethod::kReflink;
    if (link(from.c_str(), to.c_str()) == 0) return StagingMethod::kHardlink;
    if (errno == ENOENT) throw SnapshotChanged(from + " disappeared while it was being snapshotted");
  }
  CopyFile(from, to);
  return StagingMethod::kCopy;
}

}  // namespace

nlohmann::json Snapshot::ToJson() const {
  nlohmann::json files_json = nlohmann::json::array();
  for (const auto& file : files) {
    files_json.push_back({{"path", file.path}, {"size", file.size}, {"mtime_ns", file.mtime_ns}, {"method", MethodName(file.method)}});
  }
  return {{"seq", seq},
          {"name", name},
          {"layout", layout},
          {"is_directory", is_directory},
          {"staging_dir", staging_dir},
          {"files", files_json},
          {"pointers", pointers},
          {"total_bytes", total_bytes},
          {"fingerprint", fingerprint}};
}

Snapshot Snapshot::FromJson(const nlohmann::json& value) {
  Snapshot snapshot;
  snapshot.seq = value.at("seq").get<uint64_t>();
  snapshot.name = value.at("name").get<std::string>();
  snapshot.layout = value.at("layout").get<std::string>();
  snapshot.is_directory = value.at("is_directory").get<bool>();
  snapshot.staging_dir = value.at("staging_dir").get<std::string>();
  for (const auto& file : value.at("files")) {
    snapshot.files.push_back(SnapshotFile{file.at("path").get<std::string>(), file.at("size").get<uint64_t>(),
                                          file.at("mtime_ns").get<int64_t>(),
                                          MethodFromName(file.at("method").get<std::string>())});
  }
  snapshot.pointers = value.at("pointers").get<std::map<std::string, std::string>>();
  snapshot.total_bytes = value.at("total_bytes").get<uint64_t>();
  snapshot.fingerprint = value.at("fingerprint").get<std::string>();
  return snapshot;
}

std::string Fingerprint(const Candidate& candidate) {
  Hasher hasher;
  for (const FileEntry& file : candidate.files) {
    hasher.Update(file.path.data(), file.path.size() + 1);
    const int64_t identity[3] = {int64_t(file.size), file.mtime_ns, int64_t(file.inode)};
    hasher.Update(identity, sizeof identity);
  }
  return hasher.Hex();
}

Snapshot TakeSnapshot(const std::string& root, const Candidate& candidate, const std::string& staging_dir, uint64_t seq) {
  Snapshot snapshot;
  snapshot.seq = seq;
  snapshot.name = candidate.name;
  snapshot.layout = LayoutName(candidate.layout);
  snapshot.is_directory = candidate.is_directory;
  snapshot.staging_dir = staging_dir;
  snapshot.pointers = candidate.pointers;
  snapshot.fingerprint = Fingerprint(candidate);
  const std::string base = candidate.is_directory ? candidate.name : ParentOf(candidate.name);
  try {
    MakeDirectories(staging_dir);
    for (const FileEntry& file : candidate.files) {
      const std::string relative = base.empty() ? file.path : file.path.substr(base.size() + 1);
      const std::string source = JoinPath(root, file.path);
      const std::string target = staging_dir + "/" + relative;
      MakeDirectories(ParentOf(target));
      StagingMethod method = Stage(source, target, file.size);
      // Stable means: what was staged is what the scan saw, same inode, size and mtime.
      struct stat after {};
      if (stat(source.c_str(), &after) != 0) throw SnapshotChanged(source + " disappeared while it was being snapshotted");
      if (uint64_t(after.st_size) != file.size || Nanos(after.st_mtim) != file.mtime_ns || after.st_ino != file.inode) {
        throw SnapshotChanged(source + " changed while it was being snapshotted");
      }
      snapshot.files.push_back(SnapshotFile{relative, file.size, file.mtime_ns, method});
      snapshot.total_bytes += file.size;
    }
  } catch (...) {
    RemoveTree(staging_dir);
    throw;
  }
  return snapshot;
}

uint64_t CopyFile(const std::string& from, const std::string& to, const std::function<void(uint64_t)>& on_bytes) {
  constexpr size_t kStep = 64 << 20;
  const int source = open(from.c_str(), O_RDONLY | O_CLOEXEC);
  if (source < 0) {
    if (errno == ENOENT) throw SnapshotChanged(from + " disappeared while it was being copied");
    ThrowErrno("cannot open " + from);
  }
  const ClosesOnExit close_source{source};
  const int target = open(to.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (target < 0) ThrowErrno("cannot create " + to);
  ClosesOnExit close_target{target};
  uint64_t done = 0;
  bool in_kernel = true;
  std::vector<char> buffer;
  for (;;) {
    ssize_t copied = -1;
    if (in_kernel) {
      copied = copy_file_range(source, nullptr, target, nullptr, kStep, 0);
      if (copied < 0 && errno == EINTR) continue;
      if (copied < 0 && errno != EXDEV && errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP) {
        ThrowErrno("cannot copy " + from + " to " + to);
      }
      in_kernel = copied >= 0;  // else these filesystems cannot: read and write from here on
    }
    if (!in_kernel) {
      buffer.resize(kStep);
      copied = read(source, buffer.data(), buffer.size());
      if (copied < 0 && errno == EINTR) continue;
      if (copied < 0) ThrowErrno("cannot read " + from);
      WriteAll(target, buffer.data(), size_t(copied), to);
    }
    if (copied == 0) break;
    done += uint64_t(copied);
    if (on_bytes) on_bytes(done);
  }
  if (close_target.Close() != 0) ThrowErrno("cannot write " + to);
  return done;
}

void MakeDirectories(const std::string& path) {
  if (path.empty()) return;
  std::error_code error;
  std::filesystem::create_directories(path, error);
  if (error) throw std::runtime_error("cannot create directory " + path + ": " + error.message());
}

void RemoveTree(const std::string& path) {
  std::error_code ignored;
  std::filesystem::remove_all(path, ignored);
}

}  // namespace bt::checkpoint
