#include "data/parquet.h"

#include <algorithm>

#include "common/error.h"

#ifdef PTRAIN_PARQUET
#include <arrow/api.h>
#include <arrow/io/file.h>
#include <parquet/arrow/reader.h>
#include <parquet/metadata.h>
#include <parquet/schema.h>

#include <functional>
#include <nlohmann/json.hpp>
#endif

namespace ptrain {

#ifdef PTRAIN_PARQUET

namespace {

// Struct fields keep their schema's order (a chat's tools render with their keys as stored).
using ojson = nlohmann::ordered_json;

template <class ListType>
ojson list_value(const arrow::Array& a, int64_t i, const std::function<ojson(const arrow::Array&, int64_t)>& value) {
  const auto& list = static_cast<const ListType&>(a);
  ojson out = ojson::array();
  const auto begin = list.value_offset(i), n = list.value_length(i);
  for (int64_t k = 0; k < n; ++k) out.push_back(value(*list.values(), begin + k));
  return out;
}

// The JSON value of row i of `a`; `column` names it in errors.
ojson value_of(const arrow::Array& a, int64_t i, const std::string& column) {
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
    // Numbers exactly as stored (a uint64 above 2^63 stays unsigned; no trip through double).
    case arrow::Type::INT8:
      return static_cast<const arrow::Int8Array&>(a).Value(i);
    case arrow::Type::INT16:
      return static_cast<const arrow::Int16Array&>(a).Value(i);
    case arrow::Type::INT32:
      return static_cast<const arrow::Int32Array&>(a).Value(i);
    case arrow::Type::INT64:
      return static_cast<const arrow::Int64Array&>(a).Value(i);
    case arrow::Type::UINT8:
      return static_cast<const arrow::UInt8Array&>(a).Value(i);
    case arrow::Type::UINT16:
      return static_cast<const arrow::UInt16Array&>(a).Value(i);
    case arrow::Type::UINT32:
      return static_cast<const arrow::UInt32Array&>(a).Value(i);
    case arrow::Type::UINT64:
      return static_cast<const arrow::UInt64Array&>(a).Value(i);
    case arrow::Type::FLOAT:
      return static_cast<const arrow::FloatArray&>(a).Value(i);
    case arrow::Type::DOUBLE:
      return static_cast<const arrow::DoubleArray&>(a).Value(i);
    case arrow::Type::LIST:
      return list_value<arrow::ListArray>(a, i, recurse);
    case arrow::Type::LARGE_LIST:
      return list_value<arrow::LargeListArray>(a, i, recurse);
    case arrow::Type::STRUCT: {
      const auto& s = static_cast<const arrow::StructArray&>(a);
      ojson out = ojson::object();
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
                         " values, which have no JSON equivalent (text, numbers, lists and structs do); list it in "
                         "data.ignore_fields to leave it out");
  }
}

template <class T>
T ok(arrow::Result<T> r, const std::string& path) {
  if (!r.ok()) throw RuntimeError("'" + path + "' is not a readable Parquet file: " + r.status().ToString());
  return std::move(r).ValueUnsafe();
}

// A row group of more rows than this is refused before Arrow sizes its arrays for them (a file
// from anywhere may claim billions of rows in a few bytes; pyarrow writes up to 1 Mi rows a group).
constexpr int64_t kMaxGroupRows = int64_t{1} << 26;

// The footer's row counts must agree before any group is read: the groups' rows add up to the
// file's, and no group claims more rows than one of its columns holds values (every row of a
// column has at least one value or null).
void check_row_counts(const parquet::FileMetaData& meta, const std::string& path) {
  int64_t sum = 0;
  for (int g = 0; g < meta.num_row_groups(); ++g) {
    const auto group = meta.RowGroup(g);
    const int64_t rows = group->num_rows();
    const std::string where = path + ": row group " + std::to_string(g + 1) + " ";
    if (rows < 0 || rows > kMaxGroupRows)
      throw RuntimeError(where + "claims " + std::to_string(rows) + " rows; ptrain reads row groups of up to " +
                         std::to_string(kMaxGroupRows) +
                         " rows (rewrite the file with smaller ones, e.g. pyarrow's write_table(row_group_size=...))");
    for (int c = 0; c < group->num_columns(); ++c)
      if (group->ColumnChunk(c)->num_values() < rows)
        throw RuntimeError(where + "claims " + std::to_string(rows) + " rows but its column '" +
                           group->ColumnChunk(c)->path_in_schema()->ToDotString() + "' holds " +
                           std::to_string(group->ColumnChunk(c)->num_values()) + " values: the file is damaged");
    sum += rows;
  }
  if (sum != meta.num_rows())
    throw RuntimeError(path + ": the row groups hold " + std::to_string(sum) + " rows but the file claims " +
                       std::to_string(meta.num_rows()) + ": the file is damaged");
}

}  // namespace

bool parquet_supported() { return true; }

void parquet_records(const std::string& path, const ParquetBlock& block, const std::vector<std::string>& skip) {
  auto file = ok(arrow::io::ReadableFile::Open(path), path);
  auto reader = ok(parquet::arrow::OpenFile(file, arrow::default_memory_pool()), path);
  check_row_counts(*reader->parquet_reader()->metadata(), path);
  const int64_t total = reader->parquet_reader()->metadata()->num_rows();
  int64_t first = 0;  // rows before this group
  for (int g = 0; g < reader->num_row_groups(); ++g) {
    const std::shared_ptr<arrow::Table> table = ok(reader->ReadRowGroup(g), path);
    // What Arrow decoded from a damaged file may hold dictionary indices out of range (found by
    // fuzz_parquet: a string read from outside its buffer), offsets past the data, invalid UTF-8:
    // every buffer is checked before a value is read.
    if (const arrow::Status valid = table->ValidateFull(); !valid.ok())
      throw RuntimeError(path + ": row group " + std::to_string(g + 1) + " is damaged: " + valid.ToString());
    std::vector<ojson> rows(static_cast<size_t>(table->num_rows()), ojson::object());
    for (int c = 0; c < table->num_columns(); ++c) {
      const std::string name = table->schema()->field(c)->name();
      if (std::find(skip.begin(), skip.end(), name) != skip.end()) continue;
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
      r = ojson();  // the group's JSON values go as their text is made
    }
    block(std::move(out), first, total);
    first += table->num_rows();
  }
}

#else

bool parquet_supported() { return false; }

void parquet_records(const std::string& path, const ParquetBlock&, const std::vector<std::string>&) {
  throw RuntimeError("'" + path +
                     "': this ptrain was built without Parquet support (no pyarrow in the build's venv); run "
                     "launch/setup.sh, which installs it, and rebuild");
}

#endif

}  // namespace ptrain
