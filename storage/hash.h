// XXH3-128 of files and buffers, for checkpoint manifests. The vector width is chosen at
// run time (AVX2 where the CPU has it): the distro's generic build runs at about half the
// speed, which would make hashing, not the disk, pace the handoff.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace bt::storage {

// Streaming XXH3-128; Hex() is the canonical big-endian form that `xxhsum -H2` prints.
class Hasher {
 public:
  Hasher();
  ~Hasher();
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;
  void Update(const void* data, size_t size);
  std::string Hex() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

std::string HashBytes(const void* data, size_t size);

// Hashes a whole file with large sequential reads (the pages are usually still cached: the
// checkpoint was written moments ago). `each_chunk`, when given, sees every chunk as it is
// hashed, with the bytes read so far: the buffer is 4096-aligned, so a copy can write it
// with O_DIRECT. Throws std::runtime_error naming the path (or what each_chunk throws).
struct FileDigest {
  uint64_t size = 0;
  std::string xxh3_128;
};
using ChunkSink = std::function<void(const char* data, size_t size, uint64_t done)>;
FileDigest HashFile(const std::string& path, const ChunkSink& each_chunk = nullptr);

// "avx2" or "sse2": which implementation Hasher uses on this CPU.
const char* HashImplementation();

}  // namespace bt::storage
