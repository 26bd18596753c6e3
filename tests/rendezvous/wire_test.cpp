#include "rendezvous/wire.h"

#include <climits>
#include <optional>
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

// The reader copies bin, str and ext payloads in one piece: every size, across each
// length encoding's boundaries (fix, 8, 16 and 32-bit), must come back byte for byte, and
// as nlohmann's own reader reads it.
TEST(Wire, BytesOfEverySizeRoundTripThroughTheFastReader) {
  std::vector<size_t> sizes;
  for (size_t size = 0; size <= 300; ++size) sizes.push_back(size);
  for (size_t size : {size_t(65534), size_t(65535), size_t(65536), size_t(65537), size_t(1) << 20, (size_t(1) << 20) + 7}) {
    sizes.push_back(size);
  }
  std::mt19937 random(7);
  for (size_t size : sizes) {
    std::string bytes(size, '\0');
    for (char& byte : bytes) byte = char(random());
    const Message sent = {{"op", "set"}, {"key", bytes.substr(0, std::min<size_t>(size, 70000))}, {"value", BytesValue(bytes)}};
    const std::string frame = EncodeFrame(sent);
    FrameDecoder decoder(kMaxFrameBytes);
    decoder.Feed(frame.data(), frame.size());
    Message received;
    ASSERT_TRUE(decoder.Next(received)) << size;
    ASSERT_EQ(BytesField(received, "value"), bytes) << size;
    ASSERT_EQ(StringField(received, "key"), bytes.substr(0, std::min<size_t>(size, 70000))) << size;
    ASSERT_EQ(received, Message::from_msgpack(frame.begin() + 5, frame.end(), true, true)) << size;
    // Cut anywhere inside the value: refused, never read past the end.
    if (size > 0) {
      EXPECT_THROW(DecodeMsgpack(std::string_view(frame).substr(5, frame.size() - 6)), FrameError) << size;
    }
  }
}

// Every MessagePack type decodes to what nlohmann's strict reader makes of it.
TEST(Wire, FastReaderAgreesWithNlohmannOnEveryType) {
  auto bytes = [](std::initializer_list<int> list) {
    std::string text;
    for (int byte : list) text.push_back(char(byte));
    return text;
  };
  const std::vector<std::string> inputs = {
      bytes({0xc0}), bytes({0xc2}), bytes({0xc3}), bytes({0x00}), bytes({0x7f}), bytes({0xe0}), bytes({0xff}),
      bytes({0xcc, 0xff}), bytes({0xcd, 0xff, 0xfe}), bytes({0xce, 0xff, 0, 0, 1}), bytes({0xcf, 0xff, 0, 0, 0, 0, 0, 0, 1}),
      bytes({0xd0, 0x80}), bytes({0xd1, 0x80, 0}), bytes({0xd2, 0x80, 0, 0, 0}), bytes({0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0}),
      bytes({0xd3, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}), bytes({0xd0, 0x05}),
      bytes({0xca, 0x3f, 0xc0, 0, 0}), bytes({0xcb, 0x40, 0x09, 0x21, 0xfb, 0x54, 0x44, 0x2d, 0x18}),
      bytes({0xa0}), bytes({0xa3, 'a', 'b', 'c'}), bytes({0xd9, 2, 'h', 'i'}), bytes({0xda, 0, 1, 'x'}), bytes({0xdb, 0, 0, 0, 1, 'y'}),
      bytes({0xc4, 0}), bytes({0xc4, 2, 0, 0xff}), bytes({0xc5, 0, 1, 9}), bytes({0xc6, 0, 0, 0, 1, 9}),
      bytes({0xd4, 0x05, 0x01}), bytes({0xd5, 0xfe, 1, 2}), bytes({0xd6, 0, 1, 2, 3, 4}), bytes({0xd7, 1, 1, 2, 3, 4, 5, 6, 7, 8}),
      bytes({0xd8, 1, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}), bytes({0xc7, 1, 0x7f, 9}),
      bytes({0xc8, 0, 1, 0x80, 9}), bytes({0xc9, 0, 0, 0, 1, 3, 9}),
      bytes({0x90}), bytes({0x92, 0x01, 0xc0}), bytes({0xdc, 0, 1, 0x01}), bytes({0xdd, 0, 0, 0, 1, 0xc3}),
      bytes({0x80}), bytes({0x82, 0xa1, 'a', 0x01, 0xa1, 'a', 0x02}),  // a repeated key: the last wins
      bytes({0xde, 0, 1, 0xa1, 'k', 0x90}), bytes({0xdf, 0, 0, 0, 1, 0xa1, 'k', 0x80}),
      bytes({0x81, 0xd9, 1, 'k', 0x81, 0xa1, 'n', 0x91, 0xc4, 1, 7})};
  for (const std::string& input : inputs) {
    const Message expected = Message::from_msgpack(input, true, true);
    const Message got = DecodeMsgpack(input);
    EXPECT_EQ(got, expected) << expected.dump();
    EXPECT_EQ(got.type(), expected.type()) << expected.dump();
    if (expected.is_binary()) {
      EXPECT_EQ(got.get_binary().has_subtype(), expected.get_binary().has_subtype()) << expected.dump();
      EXPECT_EQ(got.get_binary().subtype(), expected.get_binary().subtype()) << expected.dump();
    }
  }
}

// Random and mutated MessagePack: the fast reader accepts exactly what nlohmann's strict
// reader accepts, and reads the same value.
TEST(Wire, FastReaderAcceptsWhatNlohmannAccepts) {
  std::mt19937 random(99);
  const Message sample = {{"op", "join"}, {"id", 1}, {"count", 70000}, {"n", -3}, {"f", 1.5}, {"ok", true}, {"none", nullptr},
                          {"info", {{"rank", 1}, {"host", "h"}, {"addresses", {"a", "b"}}}}, {"value", BytesValue("xyz")}};
  const std::vector<uint8_t> valid = Message::to_msgpack(sample);
  int accepted = 0, refused = 0;
  for (int round = 0; round < 30000; ++round) {
    std::string input(valid.begin(), valid.end());
    if (round % 3 == 0) {
      input.resize(random() % 48);
      for (char& byte : input) byte = char(random());
    } else if (round % 3 == 1) {
      for (int flips = 1 + int(random() % 3); flips > 0; --flips) input[random() % input.size()] = char(random());
    } else {
      input.resize(random() % input.size());
    }
    std::optional<Message> expected;
    try {
      expected = Message::from_msgpack(input, true, true);
    } catch (const Message::exception&) {
    }
    std::optional<Message> got;
    try {
      got = DecodeMsgpack(input);
    } catch (const FrameError&) {
    }
    ASSERT_EQ(got.has_value(), expected.has_value()) << round;
    if (got) {
      // Compared as MessagePack: a mutated float may be a NaN, which equals nothing.
      ASSERT_EQ(Message::to_msgpack(*got), Message::to_msgpack(*expected)) << round;
      ++accepted;
    } else {
      ++refused;
    }
  }
  EXPECT_GT(accepted, 100);
  EXPECT_GT(refused, 100);
}

TEST(Wire, DeepNestingIsRefusedNotACrash) {
  std::string input(100000, char(0x91));
  input.push_back(char(0xc0));
  EXPECT_THROW(DecodeMsgpack(input), FrameError);
  std::string shallow(200, char(0x91));
  shallow.push_back(char(0xc0));
  EXPECT_NO_THROW(DecodeMsgpack(shallow));
}

// The frame a woken waiter gets is built by hand around a value encoded once: for every
// id width and value size it must decode to what EncodeFrame of the same message does.
TEST(Wire, AnOkFrameAroundASharedValueDecodesAsTheMessageWould) {
  const std::vector<int64_t> ids = {0, 1, 127, 128, 255, 256, 65535, 65536, 4294967295ll, 4294967296ll,
                                    INT64_MAX, -1, -32, -33, -128, -129, -32768, -32769, INT32_MIN, INT64_MIN};
  for (size_t size : {size_t(0), size_t(1), size_t(255), size_t(256), size_t(65535), size_t(65536), size_t(300000)}) {
    std::string value(size, '\0');
    for (size_t i = 0; i < size; ++i) value[i] = char(i * 131 + size);
    const std::string shared = EncodeBin(value);
    std::string stream;
    for (int64_t id : ids) {
      AppendOkFrame(stream, id, &shared);
      AppendOkFrame(stream, id, nullptr);
    }
    FrameDecoder decoder(kMaxFrameBytes);
    decoder.Feed(stream.data(), stream.size());
    for (int64_t id : ids) {
      Message with_value, without;
      ASSERT_TRUE(decoder.Next(with_value));
      ASSERT_TRUE(decoder.Next(without));
      EXPECT_EQ(with_value, Message({{"op", "ok"}, {"id", id}, {"value", BytesValue(value)}})) << id << " " << size;
      EXPECT_EQ(BytesField(with_value, "value"), value);
      EXPECT_EQ(IntField(with_value, "id"), id);
      EXPECT_EQ(without, Message({{"op", "ok"}, {"id", id}})) << id;
    }
    Message none;
    EXPECT_FALSE(decoder.Next(none));
  }
}

}  // namespace
}  // namespace bt::rendezvous
