// Checkpoint checksums (core/checksum.h): zlib's CRC-32, taken piecewise, recorded as JSON and checked
// with errors that name the file, both digests and the fix.
#include "core/checksum.h"

#include <nlohmann/json.hpp>

#include "core/checksum_json.h"
#include "tests/testing.h"

namespace octet {
namespace {

using testing::throws_with;

TEST(Checksum, Crc32IsTheStandardOneAndContinuesAcrossPieces) {
  EXPECT_EQ(crc32("123456789"), 0xCBF43926u);  // the CRC-32 check value (ISO-HDLC, zlib, gzip)
  EXPECT_EQ(crc32(""), 0u);
  EXPECT_EQ(crc32("56789", crc32("1234")), crc32("123456789"));
  EXPECT_NE(crc32("123456788"), crc32("123456789"));
}

TEST(Checksum, DigestsRoundTripThroughJsonAndMalformedOnesAreNamed) {
  const FileDigests digests = {{"model.safetensors", {1234, 0x0a1b2c3du}}, {"trainer.json", {5, 0xffffffffu}}};
  const nlohmann::json j = digests_to_json(digests);
  EXPECT_EQ(j["model.safetensors"]["crc32"], "0a1b2c3d");
  EXPECT_EQ(digests_from_json(nlohmann::json::parse(j.dump()), "index.json"), digests);
  EXPECT_TRUE(throws_with([] { digests_from_json(nlohmann::json::parse(R"({"a": {"bytes": 1, "crc32": "xyz"}})"),
                                                 "index.json"); },
                          {"index.json", "'a'", "not 8 lowercase hex digits"}));
  EXPECT_TRUE(throws_with([] { digests_from_json(nlohmann::json::parse(R"({"a": {"crc32": "00000000"}})"),
                                                 "index.json"); },
                          {"index.json", "'a'"}));
  EXPECT_TRUE(throws_with([] {
                            digests_from_json(nlohmann::json::parse(R"({"../a": {"bytes": 1, "crc32": "00000000"}})"),
                                              "index.json");
                          },
                          {"outside the checkpoint"}));
}

TEST(Checksum, TheVerifierNamesTheFileBothDigestsASwapAndTheFix) {
  const FileDigests digests = {{"a.bin", digest_of("alpha")}, {"b.bin", digest_of("beta")}};
  const FileVerifier files("/ckpt/step-1", "index.json", digests, "load an older checkpoint");
  EXPECT_TRUE(files.checked());
  EXPECT_TRUE(files.holds("a.bin"));
  EXPECT_FALSE(files.holds("c.bin"));
  files.verify("a.bin", digest_of("alpha"));
  EXPECT_TRUE(throws_with([&] { files.verify("a.bin", digest_of("alphA")); },
                          {"/ckpt/step-1/a.bin is corrupt", "/ckpt/step-1/index.json recorded 5 bytes, CRC-32",
                           "its bytes changed", "load an older checkpoint"}));
  EXPECT_TRUE(throws_with([&] { files.verify("a.bin", digest_of("beta")); },
                          {"a.bin", "recorded for b.bin", "swapped"}));
  EXPECT_TRUE(throws_with([&] { files.verify("c.bin", digest_of("gamma")); }, {"c.bin", "has no checksum"}));
  EXPECT_TRUE(throws_with([&] { files.require_present("a.bin"); }, {"a.bin is missing", "index.json records it"}));
  files.require_present("unrecorded.bin");  // only recorded files are required

  const FileVerifier unchecked("/ckpt/step-1", "index.json", std::nullopt, "load an older checkpoint");
  EXPECT_FALSE(unchecked.checked());
  unchecked.verify("a.bin", digest_of("anything"));  // an old checkpoint's files pass unchecked
}

}  // namespace
}  // namespace octet
