// Tells the checkpoint agent that something under BT_CHECKPOINT_DIR changed. inotify with
// one watch per directory where it works; a periodic scan where it cannot (NFS, FUSE, or
// out of watches). Either way the agent also rescans on a timer: events only make it fast.
#pragma once

#include <chrono>
#include <map>
#include <string>

#include "env/job_config.h"

namespace bt::checkpoint {

class TreeWatcher {
 public:
  // Starts watching `root` (created by the caller). Never throws for lack of inotify: it
  // falls back to polling and says why in polling_reason().
  TreeWatcher(std::string root, env::WatchMode mode, std::string marker);
  ~TreeWatcher();
  TreeWatcher(const TreeWatcher&) = delete;
  TreeWatcher& operator=(const TreeWatcher&) = delete;

  // Readable when events are pending; -1 when polling.
  int fd() const { return inotify_fd_; }
  bool polling() const { return inotify_fd_ < 0; }
  const std::string& polling_reason() const { return polling_reason_; }

  // Reads every pending event, adding watches for new directories (watch first, then walk
  // the directory, so files created before the watch existed are not missed). Returns
  // whether anything changed; an overflow counts as a change and re-walks the whole tree.
  bool ReadEvents();

  // Whether the last ReadEvents() saw a file closed or renamed into place that can end a
  // checkpoint (CanEndACheckpoint).
  bool saw_last_write() const { return saw_last_write_; }

  size_t watch_count() const { return watches_.size(); }
  size_t overflow_count() const { return overflows_; }

 private:
  void WatchTree(const std::string& path);
  bool AddWatch(const std::string& path);
  void FallBackToPolling(const std::string& reason);

  std::string root_;
  std::string marker_;
  int inotify_fd_ = -1;
  std::map<int, std::string> watches_;  // watch descriptor → absolute directory path
  std::string polling_reason_;
  size_t overflows_ = 0;
  bool saw_last_write_ = false;
};

// Why `path` cannot be watched with inotify (a network or FUSE filesystem), or "".
std::string FilesystemNeedsPolling(const std::string& path);

}  // namespace bt::checkpoint
