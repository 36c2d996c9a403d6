#include "common/fs_util.h"

#include <fcntl.h>
#include <ftw.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "common/error.h"

namespace ptrain {

namespace fs = std::filesystem;

static std::string sys_error(const std::string& what, const std::string& path) {
  return what + " '" + path + "': " + std::strerror(errno);
}

void fsync_path(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw RuntimeError(sys_error("cannot open for fsync", path));
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw RuntimeError(sys_error("fsync failed for", path));
}

AtomicFile::AtomicFile(const std::string& path) : path_(path), tmp_(path + ".tmp." + std::to_string(::getpid())) {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw RuntimeError(sys_error("cannot create", tmp_));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

FileSum file_sum(const std::string& path, uint64_t limit) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw RuntimeError(sys_error("cannot open", path));
  FileSum s;
  std::vector<unsigned char> buf(8 << 20);
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), static_cast<size_t>(std::min<uint64_t>(buf.size(), limit - s.bytes)));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      throw RuntimeError(sys_error("read failed for", path));
    }
    if (n == 0) break;
    s.crc32 = static_cast<uint32_t>(::crc32_z(s.crc32, buf.data(), static_cast<size_t>(n)));
    s.bytes += static_cast<uint64_t>(n);
  }
  ::close(fd);
  return s;
}

MappedFile::MappedFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw RuntimeError(sys_error("cannot open", path));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw RuntimeError(sys_error("cannot stat", path));
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) addr_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (addr_ == MAP_FAILED) {
    addr_ = nullptr;
    throw RuntimeError(sys_error("cannot map", path));
  }
}

MappedFile::~MappedFile() {
  if (addr_) ::munmap(addr_, size_);
}

void AtomicFile::write(const void* data, size_t size) {
  if (size == 0) return;  // (zlib's crc32 of a null buffer is its initial value: it would reset the sum)
  sum_.crc32 = static_cast<uint32_t>(::crc32_z(sum_.crc32, static_cast<const unsigned char*>(data), size));
  sum_.bytes += size;
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd_, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw RuntimeError(sys_error("write failed for", tmp_));
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
}

void AtomicFile::commit() {
  const int fd = fd_;
  fd_ = -1;
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(tmp_.c_str());
    throw RuntimeError(sys_error("fsync/close failed for", tmp_));
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    ::unlink(tmp_.c_str());
    throw RuntimeError(sys_error("rename failed to", path_));
  }
  fs::path parent = fs::path(path_).parent_path();
  fsync_path(parent.empty() ? "." : parent.string());
}

void write_file_atomic(const std::string& path, const void* data, size_t size) {
  AtomicFile f(path);
  f.write(data, size);
  f.commit();
}

void write_file_atomic(const std::string& path, const std::string& text) {
  write_file_atomic(path, text.data(), text.size());
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw RuntimeError("cannot read '" + path + "'");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

ChunkReader::ChunkReader(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw RuntimeError(sys_error("cannot open", path));
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    ::close(fd_);
    throw RuntimeError(sys_error("cannot read", path));
  }
  size_ = st.st_size;
}

ChunkReader::~ChunkReader() { ::close(fd_); }

bool ChunkReader::next(std::string& buf, size_t n) {
  buf.resize(n);
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::read(fd_, buf.data() + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw RuntimeError(sys_error("cannot read", path_));
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  buf.resize(got);
  return got > 0;
}

void remove_tree(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return;
  auto rm = [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); };
  if (::nftw(path.c_str(), rm, 16, FTW_DEPTH | FTW_PHYS) != 0) throw RuntimeError(sys_error("cannot remove", path));
}

}  // namespace ptrain
