#include "checkpoint/torch_bin.h"

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>

#include <cstring>
#include <fstream>
#include <optional>
#include <unordered_map>

#include "common/error.h"

namespace ptrain {

namespace torch_pickle {

// The storage classes torch.save names (torch.<Type>Storage) and their dtypes.
struct StorageClass {
  const char* name;
  at::ScalarType dtype;
};
constexpr StorageClass kStorages[] = {
    {"FloatStorage", at::kFloat},   {"HalfStorage", at::kHalf}, {"BFloat16Storage", at::kBFloat16},
    {"DoubleStorage", at::kDouble}, {"LongStorage", at::kLong}, {"IntStorage", at::kInt},
    {"ShortStorage", at::kShort},   {"CharStorage", at::kChar}, {"ByteStorage", at::kByte},
    {"BoolStorage", at::kBool},
};

// A pickled value, as far as a state dict needs them.
struct Value;
using Ref = Value*;  // owned by the Machine's arena: a pickle may build cycles (a list holding itself)
struct Value {
  enum class Kind { none, boolean, integer, floating, string, tuple, list, dict, global, storage, tensor } kind;
  int64_t i = 0;
  double f = 0;
  std::string s;           // string; global: "module.name"
  std::vector<Ref> items;  // tuple, list; dict: key, value, key, value, ...
  TorchBinTensor tensor;   // storage (record, dtype, numel) and tensor
  explicit Value(Kind k) : kind(k) {}
};

// Runs the pickle's opcodes (protocols 2 to 5: what torch.save writes, and framing) with a stack,
// marks and a memo; GLOBAL resolves only the names below.
class Machine {
 public:
  Machine(const std::string& what, const std::string& bytes) : what_(what), b_(bytes) {}

  Ref make(Value::Kind k) {
    if (arena_.size() >= (size_t{1} << 22)) fail("a pickle of over 4 million values");
    arena_.push_back(std::make_unique<Value>(k));
    return arena_.back().get();
  }

  Ref run() {
    while (true) {
      const uint8_t op = u8("an opcode");
      switch (op) {
        case 0x80:
          u8("the protocol");
          break;  // PROTO
        case 0x95:
          take(8, "a frame length");
          break;  // FRAME
        case '.':
          return stack_.size() == 1 ? stack_.back()
                                    : fail("the pickle ends with " + std::to_string(stack_.size()) + " values, not 1");
        case '(':
          marks_.push_back(stack_.size());
          break;  // MARK
        case ')':
        case ']':
        case '}':  // EMPTY_TUPLE, EMPTY_LIST, EMPTY_DICT
          push(make(op == ')' ? Value::Kind::tuple : op == ']' ? Value::Kind::list : Value::Kind::dict));
          break;
        case 'N':
          push(make(Value::Kind::none));
          break;
        case 0x88:
        case 0x89: {  // NEWTRUE, NEWFALSE
          Ref v = make(Value::Kind::boolean);
          v->i = op == 0x88;
          push(v);
        } break;
        case 'K':
          push(integer(u8("BININT1")));
          break;
        case 'M':
          push(integer(le(2, "BININT2")));
          break;
        case 'J':
          push(integer(static_cast<int32_t>(le(4, "BININT"))));
          break;
        case 0x8a: {  // LONG1
          const size_t n = u8("LONG1's length");
          if (n > 8) fail("an integer of " + std::to_string(n) + " bytes");
          uint64_t v = n ? le(n, "LONG1") : 0;
          if (n && n < 8 && (v >> (8 * n - 1)) & 1) v |= ~uint64_t{0} << (8 * n);  // sign-extend
          push(integer(static_cast<int64_t>(v)));
        } break;
        case 'G': {  // BINFLOAT, big-endian
          uint64_t bits = 0;
          for (char c : take(8, "BINFLOAT")) bits = bits << 8 | static_cast<uint8_t>(c);
          Ref v = make(Value::Kind::floating);
          std::memcpy(&v->f, &bits, 8);
          push(v);
        } break;
        case 'X':
          push(string(take(le(4, "BINUNICODE's length"), "BINUNICODE")));
          break;
        case 0x8c:
          push(string(take(u8("SHORT_BINUNICODE's length"), "SHORT_BINUNICODE")));
          break;
        case 0x8d:
          push(string(take(le(8, "BINUNICODE8's length"), "BINUNICODE8")));
          break;
        case 't':
          push(tuple(pop_mark()));
          break;  // TUPLE
        case 0x85:
        case 0x86:
        case 0x87: {  // TUPLE1..3
          const size_t n = op - 0x84;
          if (stack_.size() < floor() + n) fail("a tuple of " + std::to_string(n) + " with fewer values on the stack");
          std::vector<Ref> items(stack_.end() - static_cast<ptrdiff_t>(n), stack_.end());
          stack_.resize(stack_.size() - n);
          push(tuple(std::move(items)));
        } break;
        case 'l': {  // LIST
          Ref v = make(Value::Kind::list);
          v->items = pop_mark();
          push(v);
        } break;
        case 'd': {  // DICT
          Ref v = make(Value::Kind::dict);
          v->items = pop_mark();
          if (v->items.size() % 2) fail("a dict of an odd number of keys and values");
          push(v);
        } break;
        case 'a': {  // APPEND
          Ref x = pop();
          expect(top(), Value::Kind::list, "APPEND")->items.push_back(x);
        } break;
        case 'e': {  // APPENDS
          std::vector<Ref> xs = pop_mark();
          auto& l = expect(top(), Value::Kind::list, "APPENDS")->items;
          l.insert(l.end(), xs.begin(), xs.end());
        } break;
        case 's': {  // SETITEM
          Ref v = pop(), k = pop();
          auto& d = expect(top(), Value::Kind::dict, "SETITEM")->items;
          d.push_back(k);
          d.push_back(v);
        } break;
        case 'u': {  // SETITEMS
          std::vector<Ref> kv = pop_mark();
          if (kv.size() % 2) fail("SETITEMS of an odd number of keys and values");
          auto& d = expect(top(), Value::Kind::dict, "SETITEMS")->items;
          d.insert(d.end(), kv.begin(), kv.end());
        } break;
        case 'q':
          memo_[u8("BINPUT")] = top();
          break;
        case 'r':
          memo_[le(4, "LONG_BINPUT")] = top();
          break;
        case 0x94:
          memo_[memo_.size()] = top();
          break;  // MEMOIZE
        case 'h':
          push(memo(u8("BINGET")));
          break;
        case 'j':
          push(memo(le(4, "LONG_BINGET")));
          break;
        case 'c': {  // GLOBAL
          const std::string module = line(), name = line();
          push(global(module, name));
        } break;
        case 'Q':
          push(storage(pop()));
          break;     // BINPERSID
        case 'R': {  // REDUCE
          Ref args = expect(pop(), Value::Kind::tuple, "REDUCE's arguments");
          push(call(expect(pop(), Value::Kind::global, "REDUCE"), args->items));
        } break;
        case 'b': {  // BUILD
          Ref state = pop();
          // An OrderedDict's attributes (model.state_dict()'s _metadata: the modules' versions),
          // which are not its items; anything else is an object ptrain does not build.
          if (top()->kind != Value::Kind::dict) fail("BUILD on something other than a dict");
          (void)state;
        } break;
        default: {
          char hex[8];
          std::snprintf(hex, sizeof hex, "0x%02x", op);
          fail(std::string("opcode ") + hex + " at byte " + std::to_string(pos_ - 1) +
               ", which a torch.save state dict does not hold");
        }
      }
    }
  }

 private:
  [[noreturn]] Ref fail(const std::string& why) const { throw RuntimeError(what_ + ": " + why); }

  std::string take(uint64_t n, const char* reading) {
    if (n > b_.size() - pos_) fail(std::string("the pickle ends inside ") + reading);
    std::string s = b_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  uint8_t u8(const char* reading) { return static_cast<uint8_t>(take(1, reading)[0]); }
  uint64_t le(size_t n, const char* reading) {
    const std::string s = take(n, reading);
    uint64_t v = 0;
    for (size_t i = n; i-- > 0;) v = v << 8 | static_cast<uint8_t>(s[i]);
    return v;
  }
  std::string line() {
    const size_t end = b_.find('\n', pos_);
    if (end == std::string::npos) fail("the pickle ends inside a GLOBAL's name");
    std::string s = b_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return s;
  }

  void push(Ref v) {
    if (stack_.size() > (1u << 20)) fail("a stack of over a million values");
    stack_.push_back(std::move(v));
  }
  Ref pop() {
    if (stack_.size() <= floor()) fail("a value taken from an empty stack");
    Ref v = stack_.back();
    stack_.pop_back();
    return v;
  }
  // The values a MARK leaves below it are out of reach until the mark is consumed, as in Python.
  size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  const Ref& top() const {
    if (stack_.size() <= floor()) fail("a value taken from an empty stack");
    return stack_.back();
  }
  std::vector<Ref> pop_mark() {
    if (marks_.empty()) fail("a MARK missing");
    const size_t at = marks_.back();
    marks_.pop_back();
    if (at > stack_.size()) fail("a MARK above the stack");
    std::vector<Ref> items(stack_.begin() + static_cast<ptrdiff_t>(at), stack_.end());
    stack_.resize(at);
    return items;
  }
  Ref memo(uint64_t id) const {
    const auto it = memo_.find(id);
    if (it == memo_.end()) fail("a memo entry read before it is written (" + std::to_string(id) + ")");
    return it->second;
  }
  Ref expect(const Ref& v, Value::Kind k, const char* where) const {
    if (v->kind != k) fail(std::string(where) + " on a value of another kind");
    return v;
  }
  Ref integer(int64_t i) {
    Ref v = make(Value::Kind::integer);
    v->i = i;
    return v;
  }
  Ref string(std::string s) {
    Ref v = make(Value::Kind::string);
    v->s = std::move(s);
    return v;
  }
  Ref tuple(std::vector<Ref> items) {
    Ref v = make(Value::Kind::tuple);
    v->items = std::move(items);
    return v;
  }

  // The names torch.save writes for a state dict; any other is refused, never resolved.
  Ref global(const std::string& module, const std::string& name) {
    const std::string full = module + "." + name;
    bool known = full == "collections.OrderedDict" || full == "torch._utils._rebuild_tensor_v2" ||
                 full == "torch._utils._rebuild_parameter";
    for (const auto& s : kStorages) known = known || (module == "torch" && name == s.name);
    if (full == "torch._utils._rebuild_tensor_v3")
      fail(
          "it holds a tensor of a dtype torch saves with _rebuild_tensor_v3 (float8, unsigned 16 to 64 bits), "
          "which ptrain does not read");
    if (!known)
      fail("its pickle names " + full +
           ", which ptrain does not run (it reads containers, numbers, strings and tensors only, as "
           "torch.load(weights_only=True) does)");
    Ref v = make(Value::Kind::global);
    v->s = full;
    return v;
  }

  // BINPERSID ("storage", torch.<Type>Storage, key, location, numel): the record data/<key>.
  Ref storage(const Ref& pid) {
    const auto& t = pid->items;
    if (pid->kind != Value::Kind::tuple || t.size() != 5 || t[0]->kind != Value::Kind::string || t[0]->s != "storage" ||
        t[1]->kind != Value::Kind::global || t[2]->kind != Value::Kind::string || t[4]->kind != Value::Kind::integer ||
        t[4]->i < 0)
      fail("a persistent id other than torch.save's (\"storage\", type, key, location, numel)");
    Ref v = make(Value::Kind::storage);
    const StorageClass* cls = nullptr;
    for (const auto& s : kStorages)
      if (t[1]->s == std::string("torch.") + s.name) cls = &s;
    if (!cls) fail("a storage of " + t[1]->s + ", which is no storage class");
    v->tensor.record = "data/" + t[2]->s;
    v->tensor.dtype = cls->dtype;
    v->tensor.storage_numel = t[4]->i;
    return v;
  }

  static std::vector<int64_t> ints(const Ref& v, const char* what, const Machine& m) {
    if (v->kind != Value::Kind::tuple) m.fail(std::string("a tensor's ") + what + " that is not a tuple");
    std::vector<int64_t> out;
    for (const auto& x : v->items) {
      if (x->kind != Value::Kind::integer || x->i < 0)
        m.fail(std::string("a tensor's ") + what + " of a negative or non-integer entry");
      out.push_back(x->i);
    }
    return out;
  }

  Ref call(const Ref& fn, const std::vector<Ref>& args) {
    if (fn->s == "collections.OrderedDict") {
      if (!args.empty()) fail("OrderedDict called with arguments");
      return make(Value::Kind::dict);
    }
    if (fn->s == "torch._utils._rebuild_parameter") {  // (tensor, requires_grad, hooks)
      if (args.size() != 3 || args[0]->kind != Value::Kind::tensor) fail("_rebuild_parameter of other arguments");
      return args[0];
    }
    if (fn->s == "torch._utils._rebuild_tensor_v2") {  // (storage, offset, size, stride, requires_grad, hooks[, meta])
      if (args.size() < 6 || args.size() > 7 || args[0]->kind != Value::Kind::storage ||
          args[1]->kind != Value::Kind::integer || args[1]->i < 0)
        fail("_rebuild_tensor_v2 of other arguments than torch.save's");
      Ref v = make(Value::Kind::tensor);
      v->tensor = args[0]->tensor;
      v->tensor.offset = args[1]->i;
      v->tensor.size = ints(args[2], "size", *this);
      v->tensor.stride = ints(args[3], "stride", *this);
      if (v->tensor.size.size() != v->tensor.stride.size() || v->tensor.size.size() > 8)
        fail("a tensor whose size and stride differ in length");
      // The last element the view reads must lie in its storage.
      int64_t last = v->tensor.offset;
      bool empty = false;
      for (size_t d = 0; d < v->tensor.size.size(); ++d) {
        const int64_t n = v->tensor.size[d], s = v->tensor.stride[d];
        if (n == 0) empty = true;
        if (n > (int64_t{1} << 40) || s > (int64_t{1} << 40)) fail("a tensor of size or stride past 2^40");
        if (n > 0) last += (n - 1) * s;
      }
      if (!empty && last >= v->tensor.storage_numel)
        fail("a tensor reading element " + std::to_string(last) + " of a storage of " +
             std::to_string(v->tensor.storage_numel));
      return v;
    }
    fail(fn->s + " used as a function");  // a storage class
  }

  const std::string& what_;
  const std::string& b_;
  size_t pos_ = 0;
  std::vector<Ref> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, Ref> memo_;
  std::vector<std::unique_ptr<Value>> arena_;
};

}  // namespace torch_pickle

std::vector<std::pair<std::string, TorchBinTensor>> read_torch_pickle(const std::string& what,
                                                                      const std::string& pickle) {
  using namespace torch_pickle;
  Machine machine(what, pickle);
  const Ref root = machine.run();
  if (root->kind != Value::Kind::dict)
    throw RuntimeError(what + ": its pickle holds no dict of tensors (a state dict is what transformers loads)");
  std::vector<std::pair<std::string, TorchBinTensor>> out;
  std::map<std::string, bool> seen;
  for (size_t i = 0; i < root->items.size(); i += 2) {
    const Ref &k = root->items[i], &v = root->items[i + 1];
    if (k->kind != Value::Kind::string) throw RuntimeError(what + ": a key of its dict is not a string");
    if (v->kind != Value::Kind::tensor)
      throw RuntimeError(what + ": '" + k->s + "' is not a tensor (a state dict holds tensors only)");
    if (seen[k->s]) throw RuntimeError(what + ": '" + k->s + "' appears twice");
    seen[k->s] = true;
    out.emplace_back(k->s, v->tensor);
  }
  return out;
}

TorchBinFile::TorchBinFile(const std::string& path) : path_(path) {
  {
    char magic[2] = {};
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) throw RuntimeError("cannot open '" + path + "'");
    const size_t n = std::fread(magic, 1, 2, f);
    std::fclose(f);
    if (n < 2 || magic[0] != 'P' || magic[1] != 'K')
      throw RuntimeError("'" + path +
                         "' is not a zip archive: torch's legacy format (torch.save before PyTorch 1.6), which "
                         "ptrain does not read; save it again with a current torch, or as safetensors");
  }
  std::string pickle;
  try {
    zip_ = std::make_unique<caffe2::serialize::PyTorchStreamReader>(path);
    if (zip_->hasRecord("byteorder")) {
      auto [data, size] = zip_->getRecord("byteorder");
      if (std::string(static_cast<const char*>(data.get()), size) != "little")
        throw RuntimeError("'" + path + "': a big-endian archive, which ptrain does not read");
    }
    auto [data, size] = zip_->getRecord("data.pkl");
    pickle.assign(static_cast<const char*>(data.get()), size);
  } catch (const c10::Error& e) {
    throw RuntimeError("'" + path + "': not a torch.save archive ptrain reads (" + e.what_without_backtrace() + ")");
  }
  for (auto& [name, view] : read_torch_pickle("'" + path + "'", pickle)) {
    const char* dtype = safetensors_dtype_name(view.dtype);
    if (!dtype)
      throw RuntimeError("'" + path + "': '" + name + "' is " + c10::toString(view.dtype) +
                         ", which ptrain does not read");
    uint64_t record_bytes = 0;
    try {
      record_bytes = zip_->hasRecord(view.record) ? zip_->getRecordSize(view.record) : 0;
    } catch (const c10::Error& e) {
      throw RuntimeError("'" + path + "': " + view.record + ": " + e.what_without_backtrace());
    }
    const uint64_t want = static_cast<uint64_t>(view.storage_numel) * c10::elementSize(view.dtype);
    if (view.storage_numel > 0 && record_bytes != want)
      throw RuntimeError("'" + path + "': '" + name + "''s storage " + view.record + " holds " +
                         std::to_string(record_bytes) + " bytes, not the " + std::to_string(want) + " its pickle says");
    SafetensorsEntry e;
    e.name = name;
    e.dtype = dtype;
    e.shape = view.size;
    index_[name] = entries_.size();
    entries_.push_back(std::move(e));
    views_.push_back(std::move(view));
  }
}

TorchBinFile::~TorchBinFile() = default;

const SafetensorsEntry& TorchBinFile::entry(const std::string& name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) throw RuntimeError("'" + path_ + "' has no tensor '" + name + "'");
  return entries_[it->second];
}

namespace {
// Where record `name`'s bytes lie in the archive when it is stored uncompressed (as torch.save
// writes every record), or nullopt for a compressed one (a zip rewritten by another tool).
std::optional<uint64_t> stored_record_offset(caffe2::serialize::PyTorchStreamReader& zip, const std::string& path,
                                             const std::string& name) {
  unsigned char header[30] = {};  // the zip local file header: signature, ..., method at bytes 8-9
  std::ifstream f(path, std::ios::binary);
  f.seekg(static_cast<std::streamoff>(zip.getRecordHeaderOffset(name)));
  if (!f.read(reinterpret_cast<char*>(header), sizeof header) || std::memcmp(header, "PK\x03\x04", 4) != 0)
    throw RuntimeError("'" + path + "': " + name + ": no zip entry header where the directory says");
  if (header[8] != 0 || header[9] != 0) return std::nullopt;
  return zip.getRecordOffset(name);
}
}  // namespace

at::Tensor TorchBinFile::tensor(const std::string& name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) throw RuntimeError("'" + path_ + "' has no tensor '" + name + "'");
  const TorchBinTensor& v = views_[it->second];
  const auto options = at::TensorOptions().dtype(v.dtype);
  // The elements the view reads, [first, last] of its storage (read_torch_pickle checked last).
  int64_t last = v.offset;
  for (size_t d = 0; d < v.size.size(); ++d) {
    if (v.size[d] == 0) return at::empty(v.size, options);
    last += (v.size[d] - 1) * v.stride[d];
  }
  const int64_t first = v.offset, span = last - first + 1;
  try {
    // A view of part of its storage (a state dict of views into one flat buffer) reads its own
    // bytes only, where the record is stored uncompressed; otherwise the whole record is read.
    if (span < v.storage_numel) {
      if (const auto at = stored_record_offset(*zip_, path_, v.record)) {
        at::Tensor part = at::empty({span}, options);
        std::ifstream f(path_, std::ios::binary);
        f.seekg(static_cast<std::streamoff>(*at + static_cast<uint64_t>(first) * part.element_size()));
        if (!f.read(static_cast<char*>(part.data_ptr()), static_cast<std::streamsize>(part.nbytes())))
          throw RuntimeError("'" + path_ + "': " + v.record + ": the file ends inside the record");
        return part.as_strided(v.size, v.stride, 0);
      }
    }
    at::Tensor storage = at::empty({v.storage_numel}, options);
    zip_->getRecord(v.record, storage.data_ptr(), storage.nbytes());
    return storage.as_strided(v.size, v.stride, v.offset);
  } catch (const c10::Error& e) {
    throw RuntimeError("'" + path_ + "': " + v.record + ": " + e.what_without_backtrace());
  }
}

}  // namespace ptrain
