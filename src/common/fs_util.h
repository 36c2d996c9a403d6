// Durable file writes: data reaches the disk (fsync) before a rename makes it visible, so a
// crash leaves either the old file or the new one, never a torn one.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace ptrain {

void fsync_path(const std::string& path);  // file or directory

// A file's size and CRC-32 (zlib's: the checksum gzip and `crc32` compute).
struct FileSum {
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
};
// Reads the file (its first `limit` bytes); throws RuntimeError.
FileSum file_sum(const std::string& path, uint64_t limit = UINT64_MAX);

// A whole file mapped read-only; unmapped with the object. An empty file maps nothing.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);  // throws RuntimeError naming the file
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const unsigned char* data() const { return static_cast<const unsigned char*>(addr_); }
  size_t size() const { return size_; }

 private:
  void* addr_ = nullptr;
  size_t size_ = 0;
};

// Streams bytes into PATH.tmp.<pid>; commit() fsyncs and renames it over PATH (then fsyncs
// the directory). Destroyed without commit(), it removes the temp file.
class AtomicFile {
 public:
  explicit AtomicFile(const std::string& path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  void write(const void* data, size_t size);
  void commit();
  const FileSum& sum() const { return sum_; }  // of the bytes written so far

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  FileSum sum_;
};
// Writes to PATH.tmp.<pid>, fsyncs, renames over PATH, fsyncs the directory.
void write_file_atomic(const std::string& path, const void* data, size_t size);
void write_file_atomic(const std::string& path, const std::string& text);
std::string read_text_file(const std::string& path);  // throws RuntimeError

// A file read front to back in chunks (the dataset readers' blocks): its size known up front,
// for progress. Throws RuntimeError naming the file when it cannot be opened or read.
class ChunkReader {
 public:
  explicit ChunkReader(const std::string& path);
  ~ChunkReader();
  ChunkReader(const ChunkReader&) = delete;
  ChunkReader& operator=(const ChunkReader&) = delete;
  int64_t size() const { return size_; }
  // The next `n` bytes (fewer at the end of the file) into `buf`; false, `buf` empty, at the end.
  bool next(std::string& buf, size_t n);

 private:
  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0;
};
// Recursive delete (no error if absent). Not std::filesystem::remove_all: libtorch.so exports
// its own statically linked copy of that symbol, which interposes libstdc++'s and crashes.
void remove_tree(const std::string& path);

}  // namespace ptrain
