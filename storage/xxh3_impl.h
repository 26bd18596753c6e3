// The two compiled variants of XXH3-128 (xxh3_generic.cpp, xxh3_avx2.cpp) behind one table.
#pragma once

#include <cstddef>
#include <cstdint>

namespace bt::storage::detail {

struct Xxh3Functions {
  void* (*create)();
  void (*destroy)(void*);
  void (*update)(void*, const void*, size_t);
  void (*digest)(const void*, uint8_t out[16]);  // canonical (big-endian) bytes
};

extern const Xxh3Functions kXxh3Generic;
extern const Xxh3Functions kXxh3Avx2;

}  // namespace bt::storage::detail
