// The manifest: what a committed checkpoint is, read back as it was written.
#include <string>

#include <gtest/gtest.h>

#include "storage/manifest.h"

namespace bt::storage {
namespace {


TEST(Manifest, RoundTripsAndRejectsPathsThatLeaveTheRank) {
  Manifest manifest;
  manifest.job_id = "job";
  manifest.node_rank = 3;
  manifest.name = "checkpoint-9";
  manifest.layout = "huggingface";
  manifest.files = {{"model.safetensors", 12, "00112233445566778899aabbccddeeff"}};
  manifest.pointers = {{"latest", "checkpoint-9"}};
  manifest.total_bytes = 12;
  Manifest back = Manifest::FromJson(manifest.ToJson().dump(), "test");
  EXPECT_EQ(back.name, "checkpoint-9");
  EXPECT_EQ(back.node_rank, 3);
  EXPECT_EQ(back.files.at(0).xxh3_128, "00112233445566778899aabbccddeeff");
  EXPECT_EQ(back.pointers.at("latest"), "checkpoint-9");

  auto evil = manifest.ToJson();
  evil["files"][0]["path"] = "../../etc/passwd";
  EXPECT_THROW(Manifest::FromJson(evil.dump(), "test"), ManifestError);
  evil = manifest.ToJson();
  evil.erase("files");
  try {
    Manifest::FromJson(evil.dump(), "s3://b/job/rank-3/checkpoint-9.bt-manifest.json");
    FAIL();
  } catch (const ManifestError& error) {
    EXPECT_NE(std::string(error.what()).find("field files is missing"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("s3://b/job/rank-3"), std::string::npos);
  }
}

}  // namespace
}  // namespace bt::storage
