// What is on disk under BT_CHECKPOINT_DIR, read without following symlinks, and which of
// it belongs to a checkpoint at all.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace bt::checkpoint {

struct FileEntry {
  std::string path;  // relative to the scanned root, '/'-separated
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  int64_t ctime_ns = 0;
  uint64_t inode = 0;
};

struct DirectoryTree {
  std::vector<FileEntry> files;          // regular files, sorted by path
  std::vector<std::string> directories;  // sorted; "" (the root itself) is not listed
  std::vector<std::string> symlinks;     // never followed: reported, not uploaded
  std::vector<std::string> unreadable;   // directories that could not be listed ("path: error")
};

// Names that are never part of a checkpoint: staging and temporary files (`.tmp*`, `*.tmp`,
// `*.partial`, `*.part`, HF's `tmp-checkpoint-*`) and hidden names, except the markers that
// frameworks hide (`.metadata`, the configured marker). Hidden directories are skipped whole
// (bt-launch's own `.bt-checkpoint/` among them).
bool IsIgnoredName(std::string_view name, bool is_directory, const std::string& marker);

// Scans `root` recursively with lstat. Ignored names are left out.
DirectoryTree ScanTree(const std::string& root, const std::string& marker);

// Absolute paths under `root` that some process has open for writing (from /proc/*/fd and
// fdinfo flags). The processes are the training's: no framework takes advisory locks, so this
// is the one reliable "still being written" signal besides inotify's close events. The kernel
// shows each descriptor's canonical path, so `root` is compared once resolved (it may be
// reached through a symlink) and the results are given back under `root` as passed.
std::set<std::string> OpenWriters(const std::string& root);

}  // namespace bt::checkpoint
