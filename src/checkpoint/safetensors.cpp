#include "checkpoint/safetensors.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "common/error.h"
#include "common/fs_util.h"

namespace ptrain {

namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the reference implementation's limit

struct DtypeInfo {
  const char* name;
  at::ScalarType type;
  int64_t bytes;
};
constexpr DtypeInfo kDtypes[] = {
    {"F64", at::kDouble, 8}, {"F32", at::kFloat, 4}, {"F16", at::kHalf, 2},  {"BF16", at::kBFloat16, 2},
    {"I64", at::kLong, 8},   {"I32", at::kInt, 4},   {"I16", at::kShort, 2}, {"I8", at::kChar, 1},
    {"U8", at::kByte, 1},    {"BOOL", at::kBool, 1},
};

const DtypeInfo* dtype_by_name(const std::string& name) {
  for (const auto& d : kDtypes)
    if (name == d.name) return &d;
  return nullptr;
}

const DtypeInfo* find_dtype(at::ScalarType t) {
  for (const auto& d : kDtypes)
    if (d.type == t) return &d;
  return nullptr;
}

const DtypeInfo& dtype_by_type(at::ScalarType t) {
  for (const auto& d : kDtypes)
    if (d.type == t) return d;
  throw RuntimeError(std::string("safetensors: unsupported dtype ") + c10::toString(t));
}

}  // namespace

const char* safetensors_dtype_name(at::ScalarType t) {
  const DtypeInfo* d = find_dtype(t);
  return d ? d->name : nullptr;
}

struct SafetensorsFile::Mapping {
  void* addr = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (addr && addr != MAP_FAILED) ::munmap(addr, size);
  }
};

namespace {

RuntimeError file_error(const std::string& path, const std::string& why) {
  return RuntimeError("safetensors file '" + path + "': " + why);
}

// One header entry: its dtype, shape and byte range, checked against the data buffer's size.
SafetensorsEntry read_entry(const std::string& path, const std::string& name, const nlohmann::json& v,
                            uint64_t data_size) {
  auto fail = [&](const std::string& why) { return file_error(path, "tensor '" + name + "'" + why); };
  if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
    throw fail(" lacks dtype/shape/data_offsets");
  if (!v["dtype"].is_string()) throw fail(": dtype is not a string");
  const DtypeInfo* dt = dtype_by_name(v["dtype"].get<std::string>());
  if (!dt) throw fail(": unsupported dtype " + v["dtype"].dump());
  SafetensorsEntry e;
  e.name = name;
  e.dtype = dt->name;
  if (!v["shape"].is_array()) throw fail(": shape is not an array");
  uint64_t numel = 1;
  for (const auto& d : v["shape"]) {
    if (!d.is_number_unsigned()) throw fail(": shape has a non-integer or negative entry");
    const uint64_t n = d.get<uint64_t>();
    if (n != 0 && numel > (UINT64_MAX / 16) / n) throw fail(": shape overflows");
    numel *= n;
    e.shape.push_back(static_cast<int64_t>(n));
  }
  const auto& off = v["data_offsets"];
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
    throw fail(": data_offsets must be two non-negative integers");
  e.begin = off[0].get<uint64_t>();
  e.end = off[1].get<uint64_t>();
  if (e.begin > e.end || e.end > data_size)
    throw fail(": data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + ") out of bounds of the " +
               std::to_string(data_size) + "-byte data buffer");
  if (e.end - e.begin != numel * static_cast<uint64_t>(dt->bytes))
    throw fail(": " + std::to_string(e.end - e.begin) + " bytes do not match shape x dtype (" +
               std::to_string(numel * dt->bytes) + " bytes)");
  return e;
}

// The buffer must be covered exactly, in offset order: overlaps and holes are corruption.
void check_coverage(const std::string& path, const std::vector<SafetensorsEntry>& entries, uint64_t data_size) {
  std::vector<const SafetensorsEntry*> order;
  for (const auto& e : entries) order.push_back(&e);
  std::sort(order.begin(), order.end(),
            [](auto a, auto b) { return a->begin < b->begin || (a->begin == b->begin && a->end < b->end); });
  uint64_t cursor = 0;
  for (const auto* e : order) {
    if (e->begin < cursor) throw file_error(path, "tensor '" + e->name + "' overlaps the previous tensor's bytes");
    if (e->begin > cursor) throw file_error(path, "hole in the data buffer before tensor '" + e->name + "'");
    cursor = e->end;
  }
  if (cursor != data_size)
    throw file_error(path, "data buffer has " + std::to_string(data_size - cursor) + " trailing bytes no tensor owns");
}

}  // namespace

void SafetensorsFile::map_file() {
  int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw file_error(path_, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw file_error(path_, "cannot stat");
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    throw file_error(path_,
                     "truncated: " + std::to_string(file_size) + " bytes, shorter than the 8-byte header length");
  }
  map_->size = file_size;
  map_->addr = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map_->addr == MAP_FAILED) throw file_error(path_, std::string("mmap failed: ") + std::strerror(errno));
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path), map_(std::make_shared<Mapping>()) {
  map_file();
  const uint64_t file_size = map_->size;
  const auto* bytes = static_cast<const unsigned char*>(map_->addr);
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes, 8);
  if (header_len > kMaxHeaderBytes)
    throw file_error(path, "header length " + std::to_string(header_len) + " exceeds the 100 MiB limit");
  if (header_len > file_size - 8)
    throw file_error(path, "truncated: header length " + std::to_string(header_len) + " runs past the end of the " +
                               std::to_string(file_size) + "-byte file");
  const uint64_t data_size = file_size - 8 - header_len;
  data_ = bytes + 8 + header_len;
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes + 8, bytes + 8 + header_len);
  } catch (const nlohmann::json::exception& e) {
    throw file_error(path, std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) throw file_error(path, "header is not a JSON object");
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() != "__metadata__") {
      entries_.push_back(read_entry(path, it.key(), *it, data_size));
      continue;
    }
    if (!it->is_object()) throw file_error(path, "__metadata__ is not an object");
    for (auto m = it->begin(); m != it->end(); ++m) {
      if (!m->is_string()) throw file_error(path, "__metadata__ value '" + m.key() + "' is not a string");
      metadata_[m.key()] = m->get<std::string>();
    }
  }
  check_coverage(path, entries_, data_size);
  for (size_t i = 0; i < entries_.size(); ++i) index_[entries_[i].name] = i;
}

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) throw RuntimeError("safetensors file '" + path_ + "' has no tensor '" + name + "'");
  return entries_[it->second];
}

at::Tensor SafetensorsFile::tensor(const std::string& name) const {
  const auto& e = entry(name);
  const DtypeInfo* dt = dtype_by_name(e.dtype);
  auto* ptr = const_cast<unsigned char*>(data_ + e.begin);
  auto keep = map_;
  // When the last view of these bytes goes, their whole pages leave the process's memory
  // (MADV_DONTNEED on a read-only private file mapping: a later read faults them in from the
  // file again), so a load that copies tensor after tensor peaks at the copies, not at the copies
  // plus every page of the file it has read.
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t lo = (reinterpret_cast<uintptr_t>(ptr) + page - 1) / page * page;
  const uintptr_t hi = (reinterpret_cast<uintptr_t>(ptr) + (e.end - e.begin)) / page * page;
  at::Tensor t = at::from_blob(
      ptr, e.shape,
      [keep, lo, hi](void*) {
        if (hi > lo) ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
      },
      at::TensorOptions().dtype(dt->type));
  // Kernels may assume element alignment; copy the rare misaligned tensor.
  if (reinterpret_cast<uintptr_t>(ptr) % dt->bytes != 0) t = t.clone();
  return t;
}

FileSum write_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                          const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<at::Tensor> cpu;
  uint64_t offset = 0;
  std::set<std::string> seen;
  for (const auto& [name, t] : tensors) {
    if (!seen.insert(name).second) throw RuntimeError("write_safetensors: duplicate tensor name '" + name + "'");
    at::Tensor c = t.detach().to(at::kCPU).contiguous();
    const auto& dt = dtype_by_type(c.scalar_type());
    const uint64_t n = static_cast<uint64_t>(c.numel()) * dt.bytes;
    header[name] = {{"dtype", dt.name}, {"shape", c.sizes().vec()}, {"data_offsets", {offset, offset + n}}};
    offset += n;
    cpu.push_back(c);
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // keep the data buffer 8-byte aligned
  const uint64_t header_len = json.size();
  AtomicFile out(path);  // streamed: a multi-GB shard is never copied into one buffer
  out.write(&header_len, 8);
  out.write(json.data(), json.size());
  for (const auto& c : cpu) out.write(c.data_ptr(), c.numel() * c.element_size());
  out.commit();
  return out.sum();
}

}  // namespace ptrain
