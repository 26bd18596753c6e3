// Copying files. CopyHashing is how a file:// upload copies one checkpoint file: a single read of the source, whose pages
// are usually still cached (the training wrote them moments ago), hashed as it passes so the
// manifest costs no second read, and written with O_DIRECT where the filesystem takes it.
// Direct writes are on the disk when they return, so the fsync before the commit has only
// metadata left to write, and they fill no page cache that the training's data loader needs.
// Filesystems that refuse O_DIRECT (FUSE mounts, ramfs) get ordinary buffered writes.
// CopyFile is the plain copy (in the kernel where it can) that snapshots, weights staging
// and file:// downloads use.
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>

#include "storage/hash.h"

namespace bt::storage {

struct CopiedFile {
  int fd = -1;                  // the target, still open for writing: the caller syncs and closes it
  uint64_t buffered_bytes = 0;  // written through the page cache: not yet on the disk
  FileDigest digest;            // of the bytes written
};

// Creates (or truncates) `to` and copies `from` into it. `on_bytes` is called after every
// chunk with the bytes copied so far. Throws std::runtime_error naming the path and the
// call that failed; the target is then closed, and left for the caller to remove.
CopiedFile CopyHashing(const std::string& from, const std::string& to, const std::function<void(uint64_t)>& on_bytes);

// The source of a copy is gone: for a checkpoint, a rotation deleted it meanwhile.
class SourceMissing : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Copies `from` to `to` (created, mode 0644), in the kernel where it can, and returns the
// bytes copied; `on_bytes`, when given, sees the bytes so far after every 64 MiB. Throws
// SourceMissing when `from` is missing, std::runtime_error naming the path otherwise (or
// what on_bytes throws).
uint64_t CopyFile(const std::string& from, const std::string& to, const std::function<void(uint64_t)>& on_bytes = nullptr);

}  // namespace bt::storage
