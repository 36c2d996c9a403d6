#include "checkpoint/gguf.h"

#include <ATen/ATen.h>

#include <cstring>

#include "common/error.h"
#include "common/fs_util.h"

namespace ptrain {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF", little-endian
constexpr uint32_t kVersion = 3;
constexpr uint64_t kAlignment = 32;
constexpr int64_t kQ8Block = 32;

// GGUF value type codes.
enum : uint32_t { kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7, kString = 8, kArray = 9 };

// Little-endian bytes into a buffer (x86-64 and AArch64 are little-endian: plain copies).
struct Bytes {
  std::vector<uint8_t> b;
  template <class T>
  void put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof(T));
  }
  void put_string(const std::string& s) {
    put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
  }
};

void put_value(Bytes& out, const GgufValue& v) {
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, uint32_t>) {
          out.put<uint32_t>(kU32), out.put(x);
        } else if constexpr (std::is_same_v<T, int32_t>) {
          out.put<uint32_t>(kI32), out.put(x);
        } else if constexpr (std::is_same_v<T, float>) {
          out.put<uint32_t>(kF32), out.put(x);
        } else if constexpr (std::is_same_v<T, bool>) {
          out.put<uint32_t>(kBool), out.put<uint8_t>(x ? 1 : 0);
        } else if constexpr (std::is_same_v<T, std::string>) {
          out.put<uint32_t>(kString), out.put_string(x);
        } else {  // arrays
          using E = typename T::value_type;
          out.put<uint32_t>(kArray);
          out.put<uint32_t>(std::is_same_v<E, std::string> ? kString : std::is_same_v<E, int32_t> ? kI32 : kF32);
          out.put<uint64_t>(x.size());
          for (const auto& e : x) {
            if constexpr (std::is_same_v<E, std::string>)
              out.put_string(e);
            else
              out.put(e);
          }
        }
      },
      v);
}

uint64_t aligned(uint64_t n) { return (n + kAlignment - 1) / kAlignment * kAlignment; }

// The tensor's bytes in the file's type.
std::vector<uint8_t> encode(const at::Tensor& values, GgmlType type) {
  const at::Tensor x = values.to(at::kFloat).contiguous();
  at::Tensor stored;
  switch (type) {
    case GgmlType::f32:
      stored = x;
      break;
    case GgmlType::f16:
      stored = x.to(at::kHalf);
      break;
    case GgmlType::bf16:
      stored = x.to(at::kBFloat16);
      break;
    case GgmlType::q8_0:
      return quantize_q8_0(x);
    default:
      TORCH_CHECK(false, "GgufWriter writes F32, F16, BF16 and Q8_0, not ", ggml_type_name(type));
  }
  const auto* p = static_cast<const uint8_t*>(stored.data_ptr());
  return std::vector<uint8_t>(p, p + stored.nbytes());
}

}  // namespace

// gguf-py's quantize_q8_0, operation for operation in float32: d = max|x| / 127, id = 1 / d (0
// where d is 0), q = trunc(x * id + copysign(0.5, x * id)); d stored as float16.
std::vector<uint8_t> quantize_q8_0(const at::Tensor& x) {
  TORCH_CHECK(x.numel() % kQ8Block == 0, "Q8_0 needs a multiple of 32 elements");
  const at::Tensor blocks = x.to(at::kFloat).contiguous().view({-1, kQ8Block});
  const at::Tensor d = std::get<0>(blocks.abs().max(1, true)) / 127.0f;
  const at::Tensor id = at::where(d == 0, at::zeros_like(d), at::reciprocal(d));
  const at::Tensor scaled = blocks * id;
  const at::Tensor q = at::trunc(scaled + at::copysign(at::full_like(scaled, 0.5f), scaled)).to(at::kChar).contiguous();
  const at::Tensor d16 = d.to(at::kHalf).contiguous();
  const int64_t n = blocks.size(0);
  std::vector<uint8_t> out(static_cast<size_t>(n * (2 + kQ8Block)));
  const auto* dp = static_cast<const uint8_t*>(d16.data_ptr());
  const auto* qp = static_cast<const uint8_t*>(q.data_ptr());
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(&out[static_cast<size_t>(i * (2 + kQ8Block))], dp + 2 * i, 2);
    std::memcpy(&out[static_cast<size_t>(i * (2 + kQ8Block) + 2)], qp + i * kQ8Block, kQ8Block);
  }
  return out;
}

void GgufWriter::add(const std::string& key, GgufValue value) {
  for (const auto& [k, v] : kv_)
    if (k == key) throw RuntimeError("GGUF metadata key written twice: " + key);
  kv_.emplace_back(key, std::move(value));
}

void GgufWriter::add_tensor(const std::string& name, std::vector<int64_t> shape, GgmlType type,
                            std::function<at::Tensor()> values) {
  for (const auto& t : tensors_)
    if (t.name == name) throw RuntimeError("GGUF tensor written twice: " + name);
  if (type != GgmlType::f32 && type != GgmlType::f16 && type != GgmlType::bf16 && type != GgmlType::q8_0)
    throw RuntimeError(std::string("GgufWriter writes F32, F16, BF16 and Q8_0, not ") + ggml_type_name(type));
  if (type == GgmlType::q8_0 && (shape.empty() || shape.back() % kQ8Block != 0))
    throw RuntimeError("GGUF tensor " + name + ": Q8_0 needs rows of a multiple of 32 elements");
  if (name.size() >= 64) throw RuntimeError("GGUF tensor name longer than ggml's 63 characters: " + name);
  tensors_.push_back({name, std::move(shape), type, std::move(values)});
}

int64_t GgufWriter::tensor_bytes() const {
  int64_t total = 0;
  for (const auto& t : tensors_) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    total += ggml_type_bytes(t.type, n);
  }
  return total;
}

uint64_t GgufWriter::write(const std::string& path, const std::function<void(size_t, size_t)>& progress) const {
  Bytes head;
  head.put(kMagic);
  head.put(kVersion);
  head.put<uint64_t>(tensors_.size());
  head.put<uint64_t>(kv_.size());
  for (const auto& [k, v] : kv_) {
    head.put_string(k);
    put_value(head, v);
  }
  uint64_t offset = 0;  // within the data section
  for (const auto& t : tensors_) {
    head.put_string(t.name);
    head.put<uint32_t>(static_cast<uint32_t>(t.shape.size()));
    int64_t n = 1;
    for (auto it = t.shape.rbegin(); it != t.shape.rend(); ++it) {  // fastest dimension first
      head.put<uint64_t>(static_cast<uint64_t>(*it));
      n *= *it;
    }
    head.put<uint32_t>(static_cast<uint32_t>(t.type));
    head.put<uint64_t>(offset);
    offset = aligned(offset + static_cast<uint64_t>(ggml_type_bytes(t.type, n)));
  }
  head.b.resize(aligned(head.b.size()), 0);
  AtomicFile file(path);
  file.write(head.b.data(), head.b.size());
  const std::vector<uint8_t> zeros(kAlignment, 0);
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const auto& t = tensors_[i];
    const at::Tensor v = t.values();
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    if (v.numel() != n) throw RuntimeError("GGUF tensor " + t.name + ": values do not have the declared shape");
    const std::vector<uint8_t> bytes = encode(v, t.type);
    file.write(bytes.data(), bytes.size());
    file.write(zeros.data(), aligned(bytes.size()) - bytes.size());
    if (progress) progress(i + 1, tensors_.size());
  }
  file.commit();
  return file.sum().bytes;
}

}  // namespace ptrain
