// Durable file writes: data reaches the disk (fsync) before a rename makes it visible, so a
// crash leaves either the old file or the new one, never a torn one.
#pragma once
#include <cstddef>
#include <string>

namespace ptrain {

void fsync_path(const std::string& path);  // file or directory

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

 private:
  std::string path_, tmp_;
  int fd_ = -1;
};
// Writes to PATH.tmp.<pid>, fsyncs, renames over PATH, fsyncs the directory.
void write_file_atomic(const std::string& path, const void* data, size_t size);
void write_file_atomic(const std::string& path, const std::string& text);
std::string read_text_file(const std::string& path);  // throws RuntimeError
// Recursive delete (no error if absent). Not std::filesystem::remove_all: libtorch.so exports
// its own statically linked copy of that symbol, which interposes libstdc++'s and crashes.
void remove_tree(const std::string& path);

}  // namespace ptrain
