// XXH3-128 as `xxhsum -H2` prints it, one-shot and streaming.
#include <string>

#include <gtest/gtest.h>

#include "storage/hash.h"
#include "tests/support/launcher_process.h"

namespace bt::storage {
namespace {

using testing::TempDir;
using testing::WriteFile;

TEST(Hash, MatchesXxhsumForKnownInputs) {
  EXPECT_EQ(HashBytes("", 0), "99aa06d3014798d86001c324468d497f");  // `xxhsum -H2` of nothing
  EXPECT_EQ(HashBytes("abc", 3), "06b05ab6733a618578af5f94892f3950");
}

TEST(Hash, StreamingEqualsOneShotAcrossChunkBoundaries) {
  std::string data(10 << 20, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = char((i * 2654435761u) >> 24);
  TempDir dir;
  WriteFile(dir.path() + "/f", data);
  FileDigest digest = HashFile(dir.path() + "/f");
  EXPECT_EQ(digest.size, data.size());
  EXPECT_EQ(digest.xxh3_128, HashBytes(data.data(), data.size()));
  Hasher pieces;
  for (size_t at = 0; at < data.size(); at += 777777) pieces.Update(data.data() + at, std::min<size_t>(777777, data.size() - at));
  EXPECT_EQ(pieces.Hex(), digest.xxh3_128);
}

}  // namespace
}  // namespace bt::storage
