// Parquet datasets: each row of a Parquet file as the JSON record its columns spell — a column
// per field (`messages` as a list of {role, content} structs, `conversations`, `instruction` /
// `input` / `output`, `text`, `prompt` / `completion`) — so Parquet data goes through the same
// record kinds, masking, packing and validation as JSONL (samples.h). Read with Arrow C++ and
// its Parquet reader from the `pyarrow` wheel (launch/setup.sh installs it); a build without
// it refuses Parquet files, saying so.
#pragma once
#include <string>
#include <vector>

namespace ptrain {

// Whether this build reads Parquet.
bool parquet_supported();

// Every row of `path` as a JSON object text, in file order. Throws RuntimeError naming the file
// (and the row and column) for an unreadable file or a column type with no JSON equivalent
// (binary, dates, maps, ...).
std::vector<std::string> parquet_records(const std::string& path);

}  // namespace ptrain
