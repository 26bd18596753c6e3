// allow_patterns / ignore_patterns with huggingface_hub's semantics (filter_repo_objects).
#include <gtest/gtest.h>

#include "launcher/phases/weights.h"

namespace bt::launcher {
namespace {

TEST(WeightsPatterns, FollowHuggingFaceHub) {
  EXPECT_TRUE(WeightsPathSelected("model.safetensors", {}, {}));
  EXPECT_TRUE(WeightsPathSelected("config.json", {"*.json"}, {}));
  EXPECT_TRUE(WeightsPathSelected("tokenizer/vocab.json", {"*.json"}, {})) << "fnmatch's * crosses '/'";
  EXPECT_FALSE(WeightsPathSelected("model.bin", {"*.json", "*.safetensors"}, {}));
  EXPECT_TRUE(WeightsPathSelected("onnx/model.onnx", {"onnx/"}, {})) << "a trailing '/' means the whole folder";
  EXPECT_FALSE(WeightsPathSelected("onnx.txt", {"onnx/"}, {}));
  EXPECT_FALSE(WeightsPathSelected("original/consolidated.pth", {}, {"original/"}));
  EXPECT_FALSE(WeightsPathSelected("pytorch_model.bin", {"*"}, {"*.bin"})) << "ignore wins over allow";
  EXPECT_TRUE(WeightsPathSelected("model-00001-of-00002.safetensors", {"model-0000[1-2]-*"}, {}));
  EXPECT_FALSE(WeightsPathSelected("Config.JSON", {"*.json"}, {})) << "case-sensitive, as on POSIX";
}

}  // namespace
}  // namespace bt::launcher
