#include "checkpoint/tree.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "storage/paths.h"

namespace bt::checkpoint {
namespace {

bool StartsWith(std::string_view text, std::string_view prefix) { return text.substr(0, prefix.size()) == prefix; }
bool EndsWith(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

int64_t Nanos(const timespec& time) { return int64_t(time.tv_sec) * 1'000'000'000 + time.tv_nsec; }

void ScanDirectory(int parent_fd, const std::string& relative, const std::string& marker, DirectoryTree& tree) {
  int fd = relative.empty() ? dup(parent_fd) : openat(parent_fd, relative.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno != ENOENT) tree.unreadable.push_back((relative.empty() ? "." : relative) + ": " + std::strerror(errno));
    return;
  }
  DIR* dir = fdopendir(fd);
  if (dir == nullptr) {
    close(fd);
    return;
  }
  std::vector<std::string> subdirectories;
  while (dirent* entry = readdir(dir)) {
    std::string_view name = entry->d_name;
    if (name == "." || name == "..") continue;
    struct stat info {};
    if (fstatat(fd, entry->d_name, &info, AT_SYMLINK_NOFOLLOW) != 0) continue;  // deleted meanwhile (rotation)
    const std::string path = storage::JoinPath(relative, std::string(name));
    if (S_ISLNK(info.st_mode)) {
      tree.symlinks.push_back(path);
    } else if (S_ISDIR(info.st_mode)) {
      if (!IsIgnoredName(name, true, marker)) subdirectories.push_back(path);
    } else if (S_ISREG(info.st_mode) && !IsIgnoredName(name, false, marker)) {
      tree.files.push_back(FileEntry{path, uint64_t(info.st_size), Nanos(info.st_mtim), Nanos(info.st_ctim), info.st_ino});
    }
  }
  closedir(dir);
  for (const std::string& subdirectory : subdirectories) {
    tree.directories.push_back(subdirectory);
    ScanDirectory(parent_fd, subdirectory, marker, tree);
  }
}

}  // namespace

bool IsIgnoredName(std::string_view name, bool is_directory, const std::string& marker) {
  if (StartsWith(name, ".tmp") || EndsWith(name, ".tmp") || EndsWith(name, ".partial") || EndsWith(name, ".part")) {
    return true;
  }
  if (StartsWith(name, "tmp-checkpoint-")) return true;  // HF Trainer's rename-into-place era
  if (!StartsWith(name, ".")) return false;
  if (is_directory) return true;
  return name != ".metadata" && name != marker;
}

DirectoryTree ScanTree(const std::string& root, const std::string& marker) {
  DirectoryTree tree;
  int fd = open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    if (errno != ENOENT) tree.unreadable.push_back(root + ": " + std::strerror(errno));
    return tree;
  }
  ScanDirectory(fd, "", marker, tree);
  close(fd);
  std::sort(tree.files.begin(), tree.files.end(), [](const FileEntry& a, const FileEntry& b) { return a.path < b.path; });
  std::sort(tree.directories.begin(), tree.directories.end());
  std::sort(tree.symlinks.begin(), tree.symlinks.end());
  return tree;
}

std::set<std::string> OpenWriters(const std::string& root) {
  std::set<std::string> writers;
  char resolved[PATH_MAX];
  const std::string canonical_root = realpath(root.c_str(), resolved) != nullptr ? resolved : root;
  const std::string prefix = canonical_root.back() == '/' ? canonical_root : canonical_root + "/";
  const std::string given_prefix = root.back() == '/' ? root : root + "/";
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return writers;
  while (dirent* process = readdir(proc)) {
    if (!std::isdigit(static_cast<unsigned char>(process->d_name[0]))) continue;
    const std::string fd_dir = std::string("/proc/") + process->d_name + "/fd";
    DIR* fds = opendir(fd_dir.c_str());
    if (fds == nullptr) continue;  // exited, or not ours to read
    while (dirent* fd_entry = readdir(fds)) {
      if (fd_entry->d_name[0] == '.') continue;
      char target[PATH_MAX];
      ssize_t length = readlink((fd_dir + "/" + fd_entry->d_name).c_str(), target, sizeof target - 1);
      if (length <= 0) continue;
      target[length] = '\0';
      if (std::strncmp(target, prefix.c_str(), prefix.size()) != 0) continue;
      std::ifstream fdinfo(std::string("/proc/") + process->d_name + "/fdinfo/" + fd_entry->d_name);
      std::string key;
      std::string flags;
      while (fdinfo >> key >> flags) {
        if (key != "flags:") continue;
        long mode = std::strtol(flags.c_str(), nullptr, 8) & O_ACCMODE;
        if (mode == O_WRONLY || mode == O_RDWR) writers.insert(given_prefix + (target + prefix.size()));
        break;
      }
    }
    closedir(fds);
  }
  closedir(proc);
  return writers;
}

}  // namespace bt::checkpoint
