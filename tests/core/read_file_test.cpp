// read_regular_file: the one way mixkv reads an input file. Devices, FIFOs and directories are
// refused without reading (or blocking), and a file over its kind's limit is refused.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "mixkv/core/error.hpp"
#include "mixkv/core/read_file.hpp"
#include "test_support.hpp"

namespace mixkv {
namespace {

std::filesystem::path scratch(const std::string& name) {
  const auto dir =
      std::filesystem::temp_directory_path() /
      ("mixkv_read_file_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()));
  std::filesystem::create_directories(dir);
  return dir / name;
}

TEST(ReadRegularFile, ReadsAWholeFileWithinItsLimit) {
  const auto path = scratch("ten.txt");
  std::ofstream(path, std::ios::binary) << std::string("0123456789");
  EXPECT_EQ(read_regular_file(path.string(), 10, "test file"), "0123456789");
  testing::expect_error([&] { read_regular_file(path.string(), 9, "test file"); },
                        ErrorCode::kInvalidInput, {"test file", "ten.txt", "10 bytes", "limit"});
  std::filesystem::remove(path);
}

TEST(ReadRegularFile, RefusesDevicesDirectoriesAndFifosWithoutReading) {
  testing::expect_error([] { read_regular_file("/dev/zero", 1 << 20, "config file"); },
                        ErrorCode::kInvalidInput, {"config file /dev/zero", "character device"});
  const auto dir = scratch("a_directory");
  std::filesystem::create_directories(dir);
  testing::expect_error([&] { read_regular_file(dir.string(), 1 << 20, "trace file"); },
                        ErrorCode::kInvalidInput, {"trace file", "is a directory"});
  // Opening a FIFO for reading would block until a writer comes: it must be refused first.
  const auto fifo = scratch("a_fifo");
  std::filesystem::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  testing::expect_error([&] { read_regular_file(fifo.string(), 1 << 20, "model file"); },
                        ErrorCode::kInvalidInput, {"model file", "FIFO"});
  std::filesystem::remove_all(dir.parent_path());
}

TEST(ReadRegularFile, MissingFilesAndControlCharactersInPathsAreNamedSafely) {
  testing::expect_error([] { read_regular_file("/nonexistent/x.json", 100, "model file"); },
                        ErrorCode::kInvalidInput, {"/nonexistent/x.json", "check the path"});
  try {
    read_regular_file("/nonexistent/\x1b[31mred", 100, "model file");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string_view(e.what()).find('\x1b'), std::string_view::npos) << e.what();
    EXPECT_NE(std::string_view(e.what()).find("\\x1b[31mred"), std::string_view::npos);
  }
}

TEST(Printable, EscapesControlCharactersOnly) {
  EXPECT_EQ(printable("plain text, UTF-8 \xc3\xa9"), "plain text, UTF-8 \xc3\xa9");
  EXPECT_EQ(printable(std::string("a\nb\tc\x7f\0", 7)), "a\\x0ab\\x09c\\x7f\\x00");
}

}  // namespace
}  // namespace mixkv
