#include "mixkv/core/read_file.hpp"

#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "mixkv/core/error.hpp"

namespace mixkv {
namespace {

std::string_view kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

std::string size_text(std::int64_t bytes) {
  if (bytes >= (std::int64_t{1} << 30)) return fmt::format("{} GiB", bytes >> 30);
  if (bytes >= (std::int64_t{1} << 20)) return fmt::format("{} MiB", bytes >> 20);
  return fmt::format("{} B", bytes);
}

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

}  // namespace

std::string read_regular_file(const std::string& path, std::int64_t max_bytes,
                              std::string_view what) {
  const std::string shown = printable(path);
  // stat() before open(): opening a FIFO for reading blocks until a writer appears.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw_invalid(fmt::format("cannot read {} {}: {}; check the path and its permissions", what,
                              shown, std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    throw_invalid(
        fmt::format("{} {} is {}; give a regular file", what, shown, kind_of(st.st_mode)));
  }
  const auto too_large = [&](std::string_view size) {
    throw_invalid(fmt::format("{} {} is {} bytes, above mixkv's limit of {} ({} bytes) for it",
                              what, shown, size, size_text(max_bytes), max_bytes));
  };
  if (st.st_size > max_bytes) too_large(std::to_string(st.st_size));
  const std::unique_ptr<std::FILE, FileCloser> file(std::fopen(path.c_str(), "rb"));
  if (!file) {
    throw_invalid(fmt::format("cannot open {} {}: {}; check its permissions", what, shown,
                              std::strerror(errno)));
  }
  // Read in chunks up to one byte past the limit: st_size may be stale (the file grows) or 0 for
  // files whose size the kernel does not know in advance.
  std::string out;
  out.reserve(static_cast<std::size_t>(st.st_size));
  char chunk[1 << 16];
  const auto cap = static_cast<std::size_t>(max_bytes) + 1;
  while (out.size() < cap) {
    const std::size_t want = std::min(sizeof chunk, cap - out.size());
    const std::size_t n = std::fread(chunk, 1, want, file.get());
    out.append(chunk, n);
    if (n < want) break;
  }
  if (std::ferror(file.get()) != 0) {
    throw_invalid(fmt::format("reading {} {} failed; check the file", what, shown));
  }
  if (static_cast<std::int64_t>(out.size()) > max_bytes)
    too_large("more than " + std::to_string(max_bytes));
  return out;
}

}  // namespace mixkv
