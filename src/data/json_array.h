// The records of a file holding one JSON array — `[{...}, {...}]`, as Stanford Alpaca's
// alpaca_data.json and ShareGPT's dumps are — read a block at a time, never the whole file
// parsed at once (such dumps run to hundreds of MB on one line).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ptrain {

// A block of the array's elements: each one's text, its 1-based index in the array, and how
// many bytes of the file `bytes_total` are read so far.
using JsonArrayBlock = std::function<void(std::vector<std::string>&& elements, std::vector<int64_t>&& indices,
                                          int64_t bytes_done, int64_t bytes_total)>;

// Splits the file at `path` into its top-level elements, about `block_bytes` of them at a time
// (an element longer than that is handed over whole). The elements' own text is not parsed here
// — an element that is not valid JSON is the caller's to refuse, naming its index. A file that is
// not one array is refused with RuntimeError naming the line: no '[' first, text after the
// closing ']', an element missing before a ',' or after the last one (JSON has no trailing comma),
// a bracket closed that was never opened, or the end of the file inside the array or a string.
// (Two values without a comma between them are one element, which is not valid JSON.)
void json_array_blocks(const std::string& path, size_t block_bytes, const JsonArrayBlock& fn);

}  // namespace ptrain
