// A Parquet dataset file from anywhere (data.format = "parquet"): Arrow's reader opens it and
// decodes each row group, then ptrain turns every row — strings, numbers, lists, structs,
// dictionary-encoded columns, nulls — into the JSON record the sample builder reads. A file
// ptrain cannot read must be refused with an exception; a crash, an out-of-bounds read or
// undefined behaviour in ptrain's reader (or in Arrow on a file that passes ptrain's checks) is a
// finding. Without pyarrow in the build's venv this runs the stub that refuses every file.
#include <exception>

#include "data/parquet.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = ptrain::fuzz::as_file(data, size, "data.parquet");
  try {
    size_t bytes = 0;
    ptrain::parquet_records(path, [&](std::vector<std::string> rows, int64_t, int64_t) {
      for (const auto& r : rows) bytes += r.size();
    });
  } catch (const std::exception&) {
  }
  return 0;
}
