#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "io/safetensors.h"
#include "test_util.h"
#include "util/error.h"
#include "util/fs.h"

namespace fs = std::filesystem;
using phasekv::Error;

namespace {

// Each test gets its own directory so parallel ctest runs never share files.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = fs::temp_directory_path() /
            ("phasekv_safetensors_" + std::to_string(::getpid()) + "_" + std::to_string(rd()));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

void write_raw(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string le64(uint64_t n) {
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  return out;
}

// A file assembled from the spec alone: length prefix, JSON header, data bytes.
std::string raw_file(const std::string& header, const std::string& data) {
  return le64(header.size()) + header + data;
}

using phasekv::test::error_of;

bool bitwise_equal(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || !a.sizes().equals(b.sizes())) return false;
  torch::Tensor ca = a.contiguous(), cb = b.contiguous();
  // An empty tensor's data pointer may be null, and memcmp(null, null, 0) is undefined behaviour
  // (UBSan's nonnull-attribute check, found by scripts/sanitize-all.sh).
  return ca.nbytes() == cb.nbytes() &&
         (ca.nbytes() == 0 || std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0);
}

// 1.0, -2.5, 3.25, 0.5 as IEEE-754 float32, little-endian.
const std::string kFourFloats =
    std::string("\x00\x00\x80\x3f", 4) + std::string("\x00\x00\x20\xc0", 4) +
    std::string("\x00\x00\x50\x40", 4) + std::string("\x00\x00\x00\x3f", 4);

}  // namespace

TEST(Safetensors, RoundTripIsBitwiseExactWithMetadata) {
  TempDir dir;
  torch::manual_seed(0);
  phasekv::NamedTensors tensors = {
      {"f32", torch::randn({3, 4})},
      {"bf16", torch::randn({5, 2}).to(torch::kBFloat16)},
      {"i64", torch::tensor({int64_t(-1), int64_t(1) << 40, int64_t(7)}).reshape({3, 1})},
      {"f16", torch::randn({3}).to(torch::kHalf)},
      {"f64", torch::randn({2}, torch::kDouble)},
      {"i32", torch::tensor({-3, 0, 9}, torch::kInt)},
      {"scalar", torch::tensor(2.5f)},
      {"empty", torch::zeros({0, 3})},
      {"transposed", torch::arange(6, torch::kFloat).reshape({2, 3}).t()},
  };
  std::map<std::string, std::string> meta = {{"format", "pt"}, {"step", "1200"}};
  const std::string path = dir.file("model.safetensors");
  phasekv::save_safetensors(path, tensors, meta);

  phasekv::SafetensorsFile f = phasekv::load_safetensors(path);
  EXPECT_EQ(f.metadata, meta);
  ASSERT_EQ(f.tensors.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    ASSERT_TRUE(f.tensors.count(name)) << name;
    EXPECT_TRUE(bitwise_equal(f.tensors.at(name), t)) << name;
  }
  // Only the final file remains: the temporary name was renamed away.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 1);
}

TEST(Safetensors, LoadedTensorsOwnTheirMemory) {
  TempDir dir;
  const std::string path = dir.file("a.safetensors");
  phasekv::save_safetensors(path, {{"a", torch::ones({4})}, {"b", torch::ones({2, 2})}});
  phasekv::SafetensorsFile f = phasekv::load_safetensors(path);
  for (const auto& [name, t] : f.tensors) {
    EXPECT_EQ(t.storage().nbytes(), t.nbytes()) << name;
    EXPECT_EQ(t.device(), torch::kCPU) << name;
  }
}

TEST(Safetensors, WriterOutputFollowsSpecLayout) {
  TempDir dir;
  const std::string path = dir.file("layout.safetensors");
  torch::Tensor z = torch::tensor({1.0f, -2.5f, 3.25f, 0.5f}).reshape({2, 2});
  torch::Tensor a = torch::tensor({int64_t(5)});
  phasekv::save_safetensors(path, {{"z", z}, {"a", a}}, {{"k", "v"}});

  const std::string bytes = phasekv::read_file(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(static_cast<unsigned char>(bytes[i])) << (8 * i);
  EXPECT_EQ(n % 8, 0u);
  ASSERT_EQ(bytes.size(), 8 + n + 16 + 8);
  const std::string header_text = bytes.substr(8, n);
  EXPECT_EQ(header_text.front(), '{');
  EXPECT_EQ(header_text.find_last_not_of(' '), header_text.rfind('}'));

  auto header = nlohmann::json::parse(header_text);
  EXPECT_EQ(header["__metadata__"], nlohmann::json({{"k", "v"}}));
  EXPECT_EQ(header["z"]["dtype"], "F32");
  EXPECT_EQ(header["z"]["shape"], nlohmann::json({2, 2}));
  // Data section keeps the caller's order, not alphabetical order.
  EXPECT_EQ(header["z"]["data_offsets"], nlohmann::json({0, 16}));
  EXPECT_EQ(header["a"]["dtype"], "I64");
  EXPECT_EQ(header["a"]["data_offsets"], nlohmann::json({16, 24}));
  EXPECT_EQ(bytes.substr(8 + n, 16), kFourFloats);
  EXPECT_EQ(bytes.substr(8 + n + 16), std::string("\x05\0\0\0\0\0\0\0", 8));
}

TEST(Safetensors, ReadsHandWrittenFile) {
  TempDir dir;
  const std::string path = dir.file("hand.safetensors");
  // Unpadded header, unusual key order: readers must accept both.
  write_raw(path, raw_file(R"({"w":{"data_offsets":[0,16],"shape":[2,2],"dtype":"F32"},)"
                           R"("__metadata__":{"source":"hand"}})",
                           kFourFloats));
  phasekv::SafetensorsFile f = phasekv::load_safetensors(path);
  EXPECT_EQ(f.metadata, (std::map<std::string, std::string>{{"source", "hand"}}));
  ASSERT_TRUE(f.tensors.count("w"));
  const torch::Tensor& w = f.tensors.at("w");
  EXPECT_EQ(w.scalar_type(), torch::kFloat);
  EXPECT_TRUE(bitwise_equal(w, torch::tensor({1.0f, -2.5f, 3.25f, 0.5f}).reshape({2, 2})));
}

TEST(Safetensors, ReadsHandWrittenBf16File) {
  TempDir dir;
  const std::string path = dir.file("bf16.safetensors");
  // bf16 is the top half of float32: 1.0 = 0x3f80, -2.5 = 0xc020.
  write_raw(path, raw_file(R"({"b":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}})",
                           std::string("\x80\x3f\x20\xc0", 4)));
  phasekv::SafetensorsFile f = phasekv::load_safetensors(path);
  const torch::Tensor& b = f.tensors.at("b");
  EXPECT_EQ(b.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(b.to(torch::kFloat), torch::tensor({1.0f, -2.5f})));
}

TEST(Safetensors, TruncatedFileNamesTensorAndOffsets) {
  TempDir dir;
  const std::string path = dir.file("cut.safetensors");
  phasekv::save_safetensors(path,
                            {{"first", torch::ones({4})}, {"layer.0.weight", torch::ones({8, 8})}});
  std::string bytes = phasekv::read_file(path);
  const size_t cut_size = bytes.size() - 5;
  write_raw(path, bytes.substr(0, cut_size));
  std::string msg = error_of([&] { phasekv::load_safetensors(path); });
  EXPECT_CONTAINS(msg, path);
  EXPECT_CONTAINS(msg, "layer.0.weight");
  EXPECT_CONTAINS(msg, "[16, 272]");
  EXPECT_CONTAINS(msg, std::to_string(cut_size));
}

TEST(Safetensors, FileShorterThanLengthPrefix) {
  TempDir dir;
  const std::string path = dir.file("tiny.safetensors");
  write_raw(path, "abc");
  std::string msg = error_of([&] { phasekv::load_safetensors(path); });
  EXPECT_CONTAINS(msg, path);
  EXPECT_CONTAINS(msg, "3 bytes");
}

TEST(Safetensors, HeaderLengthLargerThanFile) {
  TempDir dir;
  const std::string path = dir.file("long.safetensors");
  write_raw(path, le64(1000) + "{}");
  std::string msg = error_of([&] { phasekv::load_safetensors(path); });
  EXPECT_CONTAINS(msg, path);
  EXPECT_CONTAINS(msg, "header length 1000 at byte 0 exceeds file size 10");
}

TEST(Safetensors, GarbageJsonReportsByteOffset) {
  TempDir dir;
  const std::string path = dir.file("garbage.safetensors");
  write_raw(path, raw_file("{\"a\": @}", ""));
  std::string msg = error_of([&] { phasekv::load_safetensors(path); });
  EXPECT_CONTAINS(msg, path);
  EXPECT_CONTAINS(msg, "not valid JSON");
  EXPECT_CONTAINS(msg, "file byte 14");  // 8-byte prefix + offset of "@"
}

TEST(Safetensors, UnknownDtypeListsAllowed) {
  TempDir dir;
  const std::string path = dir.file("dtype.safetensors");
  write_raw(path, raw_file(R"({"q":{"dtype":"Q4","shape":[2],"data_offsets":[0,1]}})", "x"));
  std::string msg = error_of([&] { phasekv::load_safetensors(path); });
  EXPECT_CONTAINS(msg, path);
  EXPECT_CONTAINS(msg, "'q'");
  EXPECT_CONTAINS(msg, "Q4");
  EXPECT_CONTAINS(msg, "F32, BF16, F16, F64, I64, I32");
}

// DeepSeek-V4's quantized layout: FP8 weights, E8M0 scales and MXFP4 codes are one byte each and
// load as their raw bytes (libtorch 1.13 has no float8 types); I8 and U8 round-trip.
TEST(Safetensors, ByteDtypesLoadAsRawBytes) {
  TempDir dir;
  const std::string path = dir.file("fp8.safetensors");
  write_raw(path, raw_file(R"({"w":{"dtype":"F8_E4M3","shape":[2,2],"data_offsets":[0,4]},)"
                           R"("s":{"dtype":"F8_E8M0","shape":[1,1],"data_offsets":[4,5]},)"
                           R"("e":{"dtype":"I8","shape":[1,2],"data_offsets":[5,7]},)"
                           R"("u":{"dtype":"U8","shape":[1],"data_offsets":[7,8]}})",
                           std::string("\x38\xc0\x7e\x01\x7f\xf0\x0f\xff", 8)));
  phasekv::SafetensorsFile f = phasekv::load_safetensors(path);
  EXPECT_TRUE(torch::equal(f.tensors.at("w"),
                           torch::tensor({0x38, 0xc0, 0x7e, 0x01}, torch::kByte).reshape({2, 2})));
  EXPECT_TRUE(torch::equal(f.tensors.at("s"), torch::tensor({0x7f}, torch::kByte).reshape({1, 1})));
  EXPECT_TRUE(
      torch::equal(f.tensors.at("e"), torch::tensor({-16, 15}, torch::kChar).reshape({1, 2})));
  EXPECT_TRUE(torch::equal(f.tensors.at("u"), torch::tensor({0xff}, torch::kByte)));

  const std::string saved = dir.file("bytes.safetensors");
  phasekv::save_safetensors(saved, {{"e", f.tensors.at("e")}, {"w", f.tensors.at("w")}});
  const std::string bytes = phasekv::read_file(saved);
  EXPECT_CONTAINS(bytes, R"("e":{"dtype":"I8")");
  EXPECT_CONTAINS(bytes, R"("w":{"dtype":"U8")");  // a uint8 tensor is written as U8
  phasekv::SafetensorsFile back = phasekv::load_safetensors(saved);
  EXPECT_TRUE(bitwise_equal(back.tensors.at("e"), f.tensors.at("e")));
  EXPECT_TRUE(bitwise_equal(back.tensors.at("w"), f.tensors.at("w")));

  // One byte per element: a shape that claims more is still refused.
  write_raw(path, raw_file(R"({"w":{"dtype":"F8_E4M3","shape":[3],"data_offsets":[0,2]}})", "ab"));
  std::string msg = error_of([&] { phasekv::load_safetensors(path); });
  EXPECT_CONTAINS(msg, "dtype F8_E4M3 needs 3 bytes");
  write_raw(path, raw_file(R"({"w":{"dtype":"F8_E5M2","shape":[2],"data_offsets":[0,2]}})", "ab"));
  msg = error_of([&] { phasekv::load_safetensors(path); });
  EXPECT_CONTAINS(msg, "unsupported dtype \"F8_E5M2\"");
  EXPECT_CONTAINS(msg, "I8, U8, F8_E4M3, F8_E8M0");
}

TEST(Safetensors, ShapeInconsistentWithOffsets) {
  TempDir dir;
  const std::string path = dir.file("shape.safetensors");
  write_raw(path,
            raw_file(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,16]}})", kFourFloats));
  std::string msg = error_of([&] { phasekv::load_safetensors(path); });
  EXPECT_CONTAINS(msg, "'w'");
  EXPECT_CONTAINS(msg, "24 bytes");
}

TEST(Safetensors, OverlapAndTrailingBytesRejected) {
  TempDir dir;
  const std::string overlap = dir.file("overlap.safetensors");
  write_raw(overlap, raw_file(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                              R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                              kFourFloats));
  std::string msg = error_of([&] { phasekv::load_safetensors(overlap); });
  EXPECT_CONTAINS(msg, "'b'");
  EXPECT_CONTAINS(msg, "overlap tensor 'a'");

  const std::string trailing = dir.file("trailing.safetensors");
  write_raw(trailing,
            raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", kFourFloats));
  msg = error_of([&] { phasekv::load_safetensors(trailing); });
  EXPECT_CONTAINS(msg, "8 unclaimed bytes");
}

TEST(Safetensors, WriterRejectsUnsupportedDtypeAndDuplicates) {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  std::string msg = error_of([&] {
    phasekv::save_safetensors(path, {{"mask", torch::ones({2}, torch::kBool)}});
  });
  EXPECT_CONTAINS(msg, "'mask'");
  EXPECT_CONTAINS(msg, "F32, BF16, F16, F64, I64, I32");
  msg = error_of([&] {
    phasekv::save_safetensors(path, {{"x", torch::ones({1})}, {"x", torch::ones({1})}});
  });
  EXPECT_CONTAINS(msg, "duplicate");
  EXPECT_FALSE(fs::exists(path));
}

TEST(Safetensors, TakeTensorConvertsBf16ToFloat) {
  phasekv::SafetensorsFile f;
  f.tensors["w"] = torch::tensor({1.5f, -2.0f}).to(torch::kBFloat16);
  torch::Tensor w = phasekv::take_tensor(f, "model.safetensors", "w", {2});
  EXPECT_EQ(w.scalar_type(), torch::kFloat);
  EXPECT_TRUE(torch::equal(w, torch::tensor({1.5f, -2.0f})));
}

TEST(Safetensors, TakeTensorWrongShapeNamesBoth) {
  phasekv::SafetensorsFile f;
  f.tensors["layers.0.wq"] = torch::zeros({2, 3});
  std::string msg = error_of([&] {
    phasekv::take_tensor(f, "ckpt/model.safetensors", "layers.0.wq", {3, 2});
  });
  EXPECT_CONTAINS(msg, "ckpt/model.safetensors");
  EXPECT_CONTAINS(msg, "'layers.0.wq'");
  EXPECT_CONTAINS(msg, "shape [2, 3], expected [3, 2]");
}

TEST(Safetensors, TakeTensorRejectsOtherDtypes) {
  phasekv::SafetensorsFile f;
  f.tensors["ids"] = torch::zeros({2}, torch::kLong);
  std::string msg = error_of([&] { phasekv::take_tensor(f, "m.safetensors", "ids", {2}); });
  EXPECT_CONTAINS(msg, "I64");
  EXPECT_CONTAINS(msg, "allowed: F32, BF16");
}

TEST(Safetensors, TakeTensorMissing) {
  phasekv::SafetensorsFile f;
  std::string msg = error_of([&] { phasekv::take_tensor(f, "m.safetensors", "embed", {4, 4}); });
  EXPECT_CONTAINS(msg, "missing tensor 'embed' in m.safetensors");
}
