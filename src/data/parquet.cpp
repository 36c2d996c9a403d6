#include "data/parquet.h"

#include "common/error.h"

#ifdef PTRAIN_PARQUET
#include <arrow/api.h>
#include <arrow/io/file.h>
#include <parquet/arrow/reader.h>

#include <functional>
#include <nlohmann/json.hpp>
#endif

namespace ptrain {

#ifdef PTRAIN_PARQUET

namespace {

using nlohmann::json;

template <class ListType>
json list_value(const arrow::Array& a, int64_t i, const std::function<json(const arrow::Array&, int64_t)>& value) {
  const auto& list = static_cast<const ListType&>(a);
  json out = json::array();
  const auto begin = list.value_offset(i), n = list.value_length(i);
  for (int64_t k = 0; k < n; ++k) out.push_back(value(*list.values(), begin + k));
  return out;
}

// The JSON value of row i of `a`; `column` names it in errors.
json value_of(const arrow::Array& a, int64_t i, const std::string& column) {
  if (a.IsNull(i)) return nullptr;
  const auto recurse = [&](const arrow::Array& child, int64_t k) { return value_of(child, k, column); };
  switch (a.type_id()) {
    case arrow::Type::STRING:
      return static_cast<const arrow::StringArray&>(a).GetString(i);
    case arrow::Type::LARGE_STRING:
      return static_cast<const arrow::LargeStringArray&>(a).GetString(i);
    case arrow::Type::STRING_VIEW:
      return std::string(static_cast<const arrow::StringViewArray&>(a).GetView(i));
    case arrow::Type::BOOL:
      return static_cast<const arrow::BooleanArray&>(a).Value(i);
    case arrow::Type::INT8:
    case arrow::Type::INT16:
    case arrow::Type::INT32:
    case arrow::Type::INT64:
    case arrow::Type::UINT8:
    case arrow::Type::UINT16:
    case arrow::Type::UINT32:
    case arrow::Type::UINT64:
    case arrow::Type::FLOAT:
    case arrow::Type::DOUBLE: {
      auto scalar = a.GetScalar(i).ValueOrDie();
      auto as_double = scalar->CastTo(arrow::float64()).ValueOrDie();
      const double v = static_cast<const arrow::DoubleScalar&>(*as_double).value;
      if (arrow::is_integer(a.type_id())) return static_cast<int64_t>(v);
      return v;
    }
    case arrow::Type::LIST:
      return list_value<arrow::ListArray>(a, i, recurse);
    case arrow::Type::LARGE_LIST:
      return list_value<arrow::LargeListArray>(a, i, recurse);
    case arrow::Type::STRUCT: {
      const auto& s = static_cast<const arrow::StructArray&>(a);
      json out = json::object();
      for (int f = 0; f < s.num_fields(); ++f)
        out[s.struct_type()->field(f)->name()] = value_of(*s.field(f), i, column);
      return out;
    }
    case arrow::Type::DICTIONARY: {
      const auto& d = static_cast<const arrow::DictionaryArray&>(a);
      return value_of(*d.dictionary(), d.GetValueIndex(i), column);
    }
    default:
      throw RuntimeError("column '" + column + "' holds " + a.type()->ToString() +
                         " values, which have no JSON equivalent (text, numbers, lists and structs do)");
  }
}

template <class T>
T ok(arrow::Result<T> r, const std::string& path) {
  if (!r.ok()) throw RuntimeError("'" + path + "' is not a readable Parquet file: " + r.status().ToString());
  return std::move(r).ValueUnsafe();
}

}  // namespace

bool parquet_supported() { return true; }

void parquet_records(const std::string& path, const ParquetBlock& block) {
  auto file = ok(arrow::io::ReadableFile::Open(path), path);
  auto reader = ok(parquet::arrow::OpenFile(file, arrow::default_memory_pool()), path);
  const int64_t total = reader->parquet_reader()->metadata()->num_rows();
  int64_t first = 0;  // rows before this group
  for (int g = 0; g < reader->num_row_groups(); ++g) {
    const std::shared_ptr<arrow::Table> table = ok(reader->ReadRowGroup(g), path);
    std::vector<json> rows(static_cast<size_t>(table->num_rows()), json::object());
    for (int c = 0; c < table->num_columns(); ++c) {
      const std::string name = table->schema()->field(c)->name();
      int64_t row = 0;
      for (const auto& chunk : table->column(c)->chunks())
        for (int64_t i = 0; i < chunk->length(); ++i, ++row) {
          try {
            rows[static_cast<size_t>(row)][name] = value_of(*chunk, i, name);
          } catch (const RuntimeError& e) {
            throw RuntimeError(path + ": row " + std::to_string(first + row + 1) + ": " + e.what());
          }
        }
    }
    std::vector<std::string> out;
    out.reserve(rows.size());
    for (auto& r : rows) {
      out.push_back(r.dump());
      r = json();  // the group's JSON values go as their text is made
    }
    block(std::move(out), first, total);
    first += table->num_rows();
  }
}

#else

bool parquet_supported() { return false; }

void parquet_records(const std::string& path, const ParquetBlock&) {
  throw RuntimeError("'" + path +
                     "': this ptrain was built without Parquet support (no pyarrow in the build's venv); run "
                     "launch/setup.sh, which installs it, and rebuild");
}

#endif

}  // namespace ptrain
