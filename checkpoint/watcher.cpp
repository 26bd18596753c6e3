#include "checkpoint/watcher.h"

#include <dirent.h>
#include <sys/inotify.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include <spdlog/spdlog.h>

#include "checkpoint/layout.h"
#include "checkpoint/tree.h"

namespace bt::checkpoint {
namespace {

// Directory entries and closes: enough to see every framework's last write (close of the
// marker, or its rename into place). IN_MODIFY is left out: one event per write() would
// flood the queue during a large save.
constexpr uint32_t kWatchMask = IN_CREATE | IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE | IN_DELETE_SELF |
                                IN_MOVE_SELF | IN_ATTRIB | IN_ONLYDIR | IN_EXCL_UNLINK;

struct FilesystemKind {
  long magic;
  const char* name;
};
constexpr FilesystemKind kRemoteFilesystems[] = {
    {0x6969, "NFS"},        {0x65735546, "FUSE"}, {0xFF534D42, "CIFS"}, {0xFE534D42, "SMB2"},
    {0x517B, "SMB"},        {0x47504653, "GPFS"}, {0x0BD00BD0, "Lustre"}, {0x01021997, "9p"},
    {0x013111A8, "IBRIX"},  {0x73757245, "Coda"}, {0x6B414653, "AFS"},    {0x5346414F, "OpenAFS"},
};

}  // namespace

std::string FilesystemNeedsPolling(const std::string& path) {
  struct statfs info {};
  if (statfs(path.c_str(), &info) != 0) return "";
  for (const auto& kind : kRemoteFilesystems) {
    if (long(info.f_type) == kind.magic) {
      return std::string(kind.name) + " filesystem: inotify does not see writes made on other machines";
    }
  }
  return "";
}

TreeWatcher::TreeWatcher(std::string root, env::WatchMode mode, std::string marker)
    : root_(std::move(root)), marker_(std::move(marker)) {
  if (mode == env::WatchMode::kPoll) {
    polling_reason_ = "launcher.checkpoint.watch is \"poll\"";
    return;
  }
  if (mode == env::WatchMode::kAuto) {
    polling_reason_ = FilesystemNeedsPolling(root_);
    if (!polling_reason_.empty()) return;
  }
  inotify_fd_ = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (inotify_fd_ < 0) {
    polling_reason_ = std::string("inotify_init1: ") + std::strerror(errno);
    return;
  }
  WatchTree(root_);
}

TreeWatcher::~TreeWatcher() {
  if (inotify_fd_ >= 0) close(inotify_fd_);
}

void TreeWatcher::FallBackToPolling(const std::string& reason) {
  if (inotify_fd_ < 0) return;
  spdlog::warn("checkpoint watcher: {}; scanning {} periodically instead of inotify", reason, root_);
  close(inotify_fd_);
  inotify_fd_ = -1;
  watches_.clear();
  polling_reason_ = reason;
}

bool TreeWatcher::AddWatch(const std::string& path) {
  int wd = inotify_add_watch(inotify_fd_, path.c_str(), kWatchMask);
  if (wd >= 0) {
    watches_[wd] = path;
    return true;
  }
  if (errno == ENOSPC || errno == EMFILE || errno == ENOMEM) {
    FallBackToPolling(std::string("inotify_add_watch(") + path + "): " + std::strerror(errno) +
                      " (raise fs.inotify.max_user_watches)");
  }
  return false;  // ENOENT / ENOTDIR: gone already (rotation), nothing to watch
}

// Watch first, then list: a file created between the two shows up in the listing, one
// created after it raises an event. Duplicates are harmless, the agent rescans anyway.
void TreeWatcher::WatchTree(const std::string& path) {
  if (inotify_fd_ < 0 || !AddWatch(path)) return;
  DIR* dir = opendir(path.c_str());
  if (dir == nullptr) return;
  std::vector<std::string> subdirectories;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_type != DT_DIR && entry->d_type != DT_UNKNOWN) continue;
    std::string name = entry->d_name;
    if (name == "." || name == ".." || IsIgnoredName(name, true, marker_)) continue;
    subdirectories.push_back(path + "/" + name);
  }
  closedir(dir);
  for (const auto& subdirectory : subdirectories) WatchTree(subdirectory);
}

bool TreeWatcher::ReadEvents() {
  if (inotify_fd_ < 0) return false;
  alignas(inotify_event) char buffer[64 * 1024];
  bool changed = false;
  bool overflowed = false;
  saw_last_write_ = false;
  while (inotify_fd_ >= 0) {
    ssize_t length = read(inotify_fd_, buffer, sizeof buffer);
    if (length < 0 && errno == EINTR) continue;
    if (length <= 0) break;
    for (char* at = buffer; at < buffer + length;) {
      auto* event = reinterpret_cast<inotify_event*>(at);
      at += sizeof(inotify_event) + event->len;
      changed = true;
      if (event->mask & IN_Q_OVERFLOW) {
        overflowed = true;
        continue;
      }
      if (event->mask & IN_IGNORED) {
        watches_.erase(event->wd);
        continue;
      }
      auto watch = watches_.find(event->wd);
      if (watch == watches_.end() || event->len == 0) continue;
      if ((event->mask & (IN_CLOSE_WRITE | IN_MOVED_TO)) && !(event->mask & IN_ISDIR) &&
          CanEndACheckpoint(event->name, watch->second == root_, marker_)) {
        saw_last_write_ = true;
      }
      bool new_directory = (event->mask & IN_ISDIR) && (event->mask & (IN_CREATE | IN_MOVED_TO));
      if (new_directory && !IsIgnoredName(event->name, true, marker_)) WatchTree(watch->second + "/" + event->name);
    }
  }
  if (overflowed && inotify_fd_ >= 0) {
    ++overflows_;
    spdlog::warn("checkpoint watcher: inotify queue overflowed; re-walking {}", root_);
    WatchTree(root_);  // existing watches are kept (same wd); new directories get theirs
  }
  return changed;
}

}  // namespace bt::checkpoint
