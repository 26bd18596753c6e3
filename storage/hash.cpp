#include "storage/hash.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <memory>
#include <cstring>
#include <stdexcept>

#include "storage/durable_file.h"
#include "storage/xxh3_impl.h"

namespace bt::storage {
namespace {

constexpr size_t kReadChunk = 4 << 20;
constexpr size_t kAlignment = 4096;  // what O_DIRECT asks of a buffer on 512-byte and 4K devices

struct FreeDeleter {
  void operator()(char* p) const { std::free(p); }
};

const detail::Xxh3Functions& Implementation() {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return detail::kXxh3Avx2;
#endif
  return detail::kXxh3Generic;
}

std::string ToHex(const uint8_t* bytes, size_t size) {
  static const char* digits = "0123456789abcdef";
  std::string hex;
  for (size_t i = 0; i < size; ++i) {
    hex += digits[bytes[i] >> 4];
    hex += digits[bytes[i] & 15];
  }
  return hex;
}

}  // namespace

struct Hasher::State {
  void* xxh3;
};

Hasher::Hasher() : state_(new State{Implementation().create()}) {}
Hasher::~Hasher() { Implementation().destroy(state_->xxh3); }
void Hasher::Update(const void* data, size_t size) { Implementation().update(state_->xxh3, data, size); }

std::string Hasher::Hex() const {
  uint8_t digest[16];
  Implementation().digest(state_->xxh3, digest);
  return ToHex(digest, sizeof digest);
}

std::string HashBytes(const void* data, size_t size) {
  Hasher hasher;
  hasher.Update(data, size);
  return hasher.Hex();
}

FileDigest HashFile(const std::string& path, const ChunkSink& each_chunk) {
  const FileDescriptor file(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!file.valid()) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
  posix_fadvise(file.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
  std::unique_ptr<char, FreeDeleter> buffer(static_cast<char*>(std::aligned_alloc(kAlignment, kReadChunk)));
  Hasher hasher;
  FileDigest digest;
  if (!buffer) throw std::runtime_error("cannot allocate a read buffer for " + path);
  while (true) {
    ssize_t got = read(file.get(), buffer.get(), kReadChunk);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw std::runtime_error("cannot read " + path + ": " + std::strerror(errno));
    if (got == 0) break;
    hasher.Update(buffer.get(), size_t(got));
    digest.size += uint64_t(got);
    if (each_chunk) each_chunk(buffer.get(), size_t(got), digest.size);
  }
  digest.xxh3_128 = hasher.Hex();
  return digest;
}

const char* HashImplementation() { return &Implementation() == &detail::kXxh3Avx2 ? "avx2" : "sse2"; }

}  // namespace bt::storage
