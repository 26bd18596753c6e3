#include "rendezvous/wire.h"

#include <random>

#include <gtest/gtest.h>

namespace bt::rendezvous {
namespace {

std::string Header(uint32_t length) {
  return {char(length >> 24), char(length >> 16), char(length >> 8), char(length)};
}

TEST(Wire, RoundTripsAMessage) {
  Message sent = {{"op", "set"}, {"id", 7}, {"key", "k"}, {"value", BytesValue(std::string("\0\xff", 2))}};
  FrameDecoder decoder(kMaxFrameBytes);
  std::string frame = EncodeFrame(sent);
  decoder.Feed(frame.data(), frame.size());
  Message received;
  ASSERT_TRUE(decoder.Next(received));
  EXPECT_EQ(StringField(received, "op"), "set");
  EXPECT_EQ(IntField(received, "id"), 7);
  EXPECT_EQ(BytesField(received, "value"), std::string("\0\xff", 2));
  EXPECT_FALSE(decoder.Next(received));
}

TEST(Wire, ReassemblesFramesFedByteByByte) {
  std::string stream = EncodeFrame({{"op", "a"}}) + EncodeFrame({{"op", "b"}});
  FrameDecoder decoder;
  std::vector<std::string> ops;
  for (char byte : stream) {
    decoder.Feed(&byte, 1);
    Message message;
    while (decoder.Next(message)) ops.push_back(StringField(message, "op"));
  }
  EXPECT_EQ(ops, (std::vector<std::string>{"a", "b"}));
}

TEST(Wire, TruncatedFrameWaitsForMore) {
  std::string frame = EncodeFrame({{"op", "hello"}});
  FrameDecoder decoder;
  decoder.Feed(frame.data(), frame.size() - 1);
  Message message;
  EXPECT_FALSE(decoder.Next(message));
  decoder.Feed(frame.data() + frame.size() - 1, 1);
  EXPECT_TRUE(decoder.Next(message));
}

TEST(Wire, OversizedFrameIsRejectedFromItsHeaderAlone) {
  FrameDecoder decoder(kMaxUnauthenticatedFrameBytes);
  std::string header = Header(kMaxUnauthenticatedFrameBytes + 1);
  decoder.Feed(header.data(), header.size());
  Message message;
  try {
    decoder.Next(message);
    FAIL();
  } catch (const FrameError& error) {
    EXPECT_NE(std::string(error.what()).find("exceeds the limit of 4096"), std::string::npos);
  }
  FrameDecoder authenticated(kMaxFrameBytes);
  std::string huge = Header(0xffffffffu);
  authenticated.Feed(huge.data(), huge.size());
  EXPECT_THROW(authenticated.Next(message), FrameError);
}

TEST(Wire, RejectsBadPayloads) {
  auto decode = [](const std::string& payload) {
    std::string frame = Header(uint32_t(payload.size())) + payload;
    FrameDecoder decoder;
    decoder.Feed(frame.data(), frame.size());
    Message message;
    return decoder.Next(message);
  };
  EXPECT_THROW(decode(""), FrameError);                              // empty
  EXPECT_THROW(decode("\x02\x80"), FrameError);                      // unknown version
  EXPECT_THROW(decode(std::string("\x01\xc1", 2)), FrameError);      // 0xc1 is never valid MessagePack
  EXPECT_THROW(decode("\x01\x93\x01\x02\x03"), FrameError);          // an array, not a map
  EXPECT_THROW(decode("\x01\x81\xa2id\x01"), FrameError);            // a map without "op"
  EXPECT_THROW(decode("\x01\x81\xa2op\x01"), FrameError);            // "op" not a string
  EXPECT_THROW(decode("\x01\x81\xa2op\xa5hel"), FrameError);         // string cut short
  EXPECT_TRUE(decode("\x01\x81\xa2op\xa2hb"));
}

TEST(Wire, FieldAccessorsNameTheField) {
  Message message = {{"op", "x"}, {"id", "seven"}};
  try {
    IntField(message, "id");
    FAIL();
  } catch (const FrameError& error) {
    EXPECT_STREQ(error.what(), "field \"id\": expected an integer");
  }
  EXPECT_THROW(BytesField(message, "value"), FrameError);
}

// A deterministic sweep of random and mutated inputs: no crash, only FrameError or
// "need more bytes". (The libFuzzer target explores further.)
TEST(Wire, RandomAndMutatedInputsNeverCrash) {
  std::mt19937 random(12345);
  const std::string valid = EncodeFrame({{"op", "join"}, {"id", 1}, {"info", {{"rank", 1}, {"host", "h"}}}});
  int decoded = 0, rejected = 0;
  for (int round = 0; round < 20000; ++round) {
    std::string input = valid;
    if (round % 2 == 0) {
      input.resize(random() % 64);
      for (char& byte : input) byte = char(random());
    } else {
      for (int flips = 1 + int(random() % 4); flips > 0; --flips) input[random() % input.size()] = char(random());
    }
    FrameDecoder decoder(kMaxFrameBytes);
    decoder.Feed(input.data(), input.size());
    try {
      Message message;
      while (decoder.Next(message)) ++decoded;
    } catch (const FrameError&) {
      ++rejected;
    }
  }
  // Both outcomes must occur: a decoder that rejected (or accepted) everything is broken.
  EXPECT_GT(decoded, 0);
  EXPECT_GT(rejected, 0);
}

}  // namespace
}  // namespace bt::rendezvous
