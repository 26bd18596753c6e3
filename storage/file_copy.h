// How a file:// upload copies one checkpoint file: a single read of the source, whose pages
// are usually still cached (the training wrote them moments ago), hashed as it passes so the
// manifest costs no second read, and written with O_DIRECT where the filesystem takes it.
// Direct writes are on the disk when they return, so the fsync before the commit has only
// metadata left to write, and they fill no page cache that the training's data loader needs.
// Filesystems that refuse O_DIRECT (FUSE mounts, ramfs) get ordinary buffered writes.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "checkpoint/hash.h"

namespace bt::checkpoint {

struct CopiedFile {
  int fd = -1;                  // the target, still open for writing: the caller syncs and closes it
  uint64_t buffered_bytes = 0;  // written through the page cache: not yet on the disk
  FileDigest digest;            // of the bytes written
};

// Creates (or truncates) `to` and copies `from` into it. `on_bytes` is called after every
// chunk with the bytes copied so far. Throws std::runtime_error naming the path and the
// call that failed; the target is then closed, and left for the caller to remove.
CopiedFile CopyHashing(const std::string& from, const std::string& to, const std::function<void(uint64_t)>& on_bytes);

}  // namespace bt::checkpoint
