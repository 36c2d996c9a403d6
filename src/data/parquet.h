// Parquet datasets: each row of a Parquet file as the JSON record its columns spell — a column
// per field (`messages` as a list of {role, content} structs, `conversations`, `instruction` /
// `input` / `output`, `text`, `prompt` / `completion`) — so Parquet data goes through the same
// record kinds, masking, packing and validation as JSONL (samples.h). Read with Arrow C++ and
// its Parquet reader from the `pyarrow` wheel (launch/setup.sh installs it); a build without
// it refuses Parquet files, saying so.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ptrain {

// Whether this build reads Parquet.
bool parquet_supported();

// Every row of `path` as a JSON object text, in file order, one row group at a time (only that
// group's rows are held): block(records, rows before them, rows in the file). Throws
// RuntimeError naming the file (and the row and column) for an unreadable file or a column type
// with no JSON equivalent (binary, dates, maps, ...). Columns named in `skip` are not read.
using ParquetBlock = std::function<void(std::vector<std::string>&& records, int64_t first_row, int64_t total_rows)>;
void parquet_records(const std::string& path, const ParquetBlock& block, const std::vector<std::string>& skip = {});

}  // namespace ptrain
