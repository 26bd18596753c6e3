#include "checkpoint/snapshot.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "storage/durable_file.h"
#include "storage/file_copy.h"
#include "storage/hash.h"
#include "storage/json_bytes.h"
#include "storage/manifest.h"
#include "storage/paths.h"

namespace bt::checkpoint {
namespace {

int64_t Nanos(const timespec& time) { return int64_t(time.tv_sec) * 1'000'000'000 + time.tv_nsec; }

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
  const storage::FileDescriptor source(open(from.c_str(), O_RDONLY | O_CLOEXEC));
  if (!source.valid()) return false;
  storage::FileDescriptor target(open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (!target.valid()) return false;
  const bool cloned = ioctl(target.get(), FICLONE, source.get()) == 0 && target.Close() == 0;
  if (!cloned) unlink(to.c_str());
  return cloned;
}

StagingMethod Stage(const std::string& from, const std::string& to, uint64_t size) {
  if (size > kCopyBelowBytes) {
    if (TryReflink(from, to)) return StagingMethod::kReflink;
    if (link(from.c_str(), to.c_str()) == 0) return StagingMethod::kHardlink;
    if (errno == ENOENT) throw SnapshotChanged(from + " disappeared while it was being snapshotted");
  }
  try {
    storage::CopyFile(from, to);
  } catch (const storage::SourceMissing& error) {
    throw SnapshotChanged(error.what());
  }
  return StagingMethod::kCopy;
}

}  // namespace

storage::StagedFiles Snapshot::Staged() const {
  storage::StagedFiles staged{staging_dir, {}, total_bytes, seq};
  for (const SnapshotFile& file : files) staged.paths.push_back(file.path);
  return staged;
}

std::string Snapshot::VersionId() const { return storage::HashBytes(fingerprint.data(), fingerprint.size()); }

nlohmann::json Snapshot::ToJson() const {
  nlohmann::json files_json = nlohmann::json::array();
  for (const auto& file : files) {
    files_json.push_back({{"path", storage::BytesToJson(file.path)}, {"size", file.size}, {"mtime_ns", file.mtime_ns}, {"method", MethodName(file.method)}});
  }
  return {{"seq", seq},
          {"name", storage::BytesToJson(name)},
          {"layout", layout},
          {"is_directory", is_directory},
          {"staging_dir", storage::BytesToJson(staging_dir)},
          {"files", files_json},
          {"pointers", storage::BytesMapToJson(pointers)},
          {"total_bytes", total_bytes},
          {"fingerprint", fingerprint},
          {"answers", answers}};
}

Snapshot Snapshot::FromJson(const nlohmann::json& value) {
  Snapshot snapshot;
  snapshot.seq = value.at("seq").get<uint64_t>();
  snapshot.name = storage::BytesFromJson(value.at("name"));
  // What is read back is uploaded from staging_dir/<path>: a path that leaves it is refused.
  storage::ValidateCheckpointName(snapshot.name, "snapshot name");
  snapshot.layout = value.at("layout").get<std::string>();
  snapshot.is_directory = value.at("is_directory").get<bool>();
  snapshot.staging_dir = storage::BytesFromJson(value.at("staging_dir"));
  for (const auto& file : value.at("files")) {
    snapshot.files.push_back(SnapshotFile{storage::BytesFromJson(file.at("path")), file.at("size").get<uint64_t>(),
                                          file.at("mtime_ns").get<int64_t>(),
                                          MethodFromName(file.at("method").get<std::string>())});
    storage::ValidateCheckpointName(snapshot.files.back().path, "snapshot file");
  }
  snapshot.pointers = storage::BytesMapFromJson(value.at("pointers"));
  snapshot.total_bytes = value.at("total_bytes").get<uint64_t>();
  snapshot.fingerprint = value.at("fingerprint").get<std::string>();
  snapshot.answers = value.value("answers", "");
  return snapshot;
}

bool Snapshot::Holds(const Candidate& candidate) const {
  const std::string base = candidate.is_directory ? candidate.name : storage::ParentOf(candidate.name);
  return std::all_of(candidate.files.begin(), candidate.files.end(), [&](const FileEntry& file) {
    const std::string relative = base.empty() ? file.path : file.path.substr(base.size() + 1);
    return std::any_of(files.begin(), files.end(), [&](const SnapshotFile& kept) {
      return kept.path == relative && kept.size == file.size && kept.mtime_ns == file.mtime_ns;
    });
  });
}

int64_t Snapshot::NewestMtimeNs() const {
  int64_t newest = 0;
  for (const SnapshotFile& file : files) newest = std::max(newest, file.mtime_ns);
  return newest;
}

std::string Fingerprint(const Candidate& candidate) {
  storage::Hasher hasher;
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
  const std::string base = candidate.is_directory ? candidate.name : storage::ParentOf(candidate.name);
  try {
    storage::MakeDirectories(staging_dir);
    for (const FileEntry& file : candidate.files) {
      const std::string relative = base.empty() ? file.path : file.path.substr(base.size() + 1);
      const std::string source = storage::JoinPath(root, file.path);
      const std::string target = staging_dir + "/" + relative;
      storage::MakeDirectories(storage::ParentOf(target));
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
    storage::RemoveTree(staging_dir);
    throw;
  }
  return snapshot;
}

}  // namespace bt::checkpoint
