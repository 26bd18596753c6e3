// The manifest: what a committed checkpoint is, read back as it was written.
#include <random>
#include <string>

#include <gtest/gtest.h>

#include "storage/json_bytes.h"
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

// Linux names are bytes: a file "notes-\xff.txt" made dump() throw type_error (on the
// agent's thread: the launcher aborted), and the journal's lossy form could never be found again.
TEST(Manifest, CarriesNamesThatAreNotUtf8WithoutLoss) {
  Manifest manifest;
  manifest.job_id = "job";
  manifest.name = std::string("checkpoint-\xff\xfe");
  manifest.layout = "huggingface";
  manifest.files = {{std::string("notes-\xff.txt"), 3, "00112233445566778899aabbccddeeff"},
                    {"model.safetensors", 4, "ffeeddccbbaa99887766554433221100"}};
  manifest.pointers = {{"latest", std::string("checkpoint-\xff\xfe")}};
  std::string text;
  ASSERT_NO_THROW(text = manifest.ToJson().dump(2));
  Manifest back = Manifest::FromJson(text, "test");
  EXPECT_EQ(back.name, manifest.name);
  ASSERT_EQ(back.files.size(), 2u);
  EXPECT_EQ(back.files[0].path, manifest.files[0].path);
  EXPECT_EQ(back.files[1].path, "model.safetensors");
  EXPECT_EQ(back.pointers.at("latest"), manifest.pointers.at("latest"));
  // An ordinary name stays a plain JSON string: manifests other tools read are unchanged.
  EXPECT_TRUE(manifest.ToJson()["files"][1]["path"].is_string());
}

TEST(JsonBytes, ArbitraryByteStringsRoundTrip) {
  std::mt19937 random(18);  // fixed seed: a failure reproduces
  for (int round = 0; round < 2000; ++round) {
    std::string bytes(random() % 24, '\0');
    for (char& c : bytes) c = char(random() % 256);
    std::map<std::string, std::string> map = {{bytes, bytes}, {"plain", bytes}};
    const std::string text = nlohmann::json{{"value", BytesToJson(bytes)}, {"map", BytesMapToJson(map)}}.dump();
    const auto parsed = nlohmann::json::parse(text);
    ASSERT_EQ(BytesFromJson(parsed["value"]), bytes) << "round " << round;
    ASSERT_EQ(BytesMapFromJson(parsed["map"]), map) << "round " << round;
  }
  EXPECT_TRUE(IsValidUtf8("caf\xc3\xa9"));
  EXPECT_FALSE(IsValidUtf8("\xc0\xaf"));          // overlong '/'
  EXPECT_FALSE(IsValidUtf8("\xed\xa0\x80"));      // a surrogate
  EXPECT_THROW(BytesFromJson(nlohmann::json{{"bytes_hex", "zz"}}), nlohmann::json::exception);
}

TEST(JsonBytes, FieldOrTakesTheFallbackForAFieldAbsentOrOfAnotherType) {
  const auto record = nlohmann::json::parse(R"({"host": 7, "pid": 12, "renewals": "x"})");
  EXPECT_EQ(FieldOr<std::string>(record, "host", "?"), "?");
  EXPECT_EQ(FieldOr(record, "pid", 0), 12);
  EXPECT_EQ(FieldOr(record, "renewals", uint64_t(3)), 3u);
  EXPECT_EQ(FieldOr(record, "absent", 5), 5);
  EXPECT_EQ(FieldOr(nlohmann::json::array(), "pid", 9), 9);  // not an object at all
}

// Loading writes the pointers after verifying the files: one at a file's path replaced a
// verified file while the log said "verified".
TEST(Manifest, RefusesPointersThatWouldReplaceItsFiles) {
  Manifest manifest;
  manifest.job_id = "job";
  manifest.name = "global_step10";
  manifest.layout = "deepspeed";
  manifest.files = {{"mp_rank_00_model_states.pt", 12, "00112233445566778899aabbccddeeff"}};
  manifest.pointers = {{"latest", "global_step10"}};
  EXPECT_NO_THROW(Manifest::FromJson(manifest.ToJson().dump(), "test"));
  for (const std::string pointer : {"global_step10/mp_rank_00_model_states.pt", "global_step10", "global_step10/zero"}) {
    auto evil = manifest;
    evil.pointers = {{pointer, "x"}};
    try {
      Manifest::FromJson(evil.ToJson().dump(), "s3://b/job/rank-0/global_step10.bt-manifest.json");
      ADD_FAILURE() << pointer << " was accepted";
    } catch (const ManifestError& error) {
      EXPECT_NE(std::string(error.what()).find("pointers"), std::string::npos) << error.what();
    }
  }
  Manifest single = manifest;  // a single-file checkpoint: its files sit at its parent
  single.name = "ckpt/epoch=1.ckpt";
  single.is_directory = false;
  single.files = {{"epoch=1.ckpt", 12, "00112233445566778899aabbccddeeff"}};
  single.pointers = {{"ckpt/epoch=1.ckpt", "x"}};
  EXPECT_THROW(Manifest::FromJson(single.ToJson().dump(), "test"), ManifestError);
}

}  // namespace
}  // namespace bt::storage
