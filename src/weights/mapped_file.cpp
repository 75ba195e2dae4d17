#include "mixkv/weights/mapped_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "mixkv/core/error.hpp"

namespace mixkv::weights {
namespace {

// Closes the descriptor on every path out of open(); the mapping keeps the file alive itself.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

MappedFile MappedFile::open(const std::string& path) {
  Fd file{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (file.fd < 0) {
    throw_invalid(fmt::format("cannot open {}: {}; check the path and its permissions", path,
                              std::strerror(errno)));
  }
  struct stat st {};
  if (::fstat(file.fd, &st) != 0) {
    throw_invalid(fmt::format("cannot stat {}: {}", path, std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    throw_invalid(fmt::format("{} is not a regular file; point at a model file", path));
  }
  const auto size = static_cast<std::size_t>(st.st_size);
  if (size == 0) return MappedFile(nullptr, 0, path);
  void* data = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, file.fd, 0);
  if (data == MAP_FAILED) {
    throw_invalid(
        fmt::format("cannot map {} ({} bytes) into memory: {}", path, size, std::strerror(errno)));
  }
  return MappedFile(static_cast<const std::byte*>(data), size, path);
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      path_(std::move(other.path_)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    path_ = std::move(other.path_);
  }
  return *this;
}

MappedFile::~MappedFile() { release(); }

void MappedFile::release() noexcept {
  if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace mixkv::weights
