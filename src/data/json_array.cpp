#include "data/json_array.h"

#include <algorithm>
#include <cstdio>

#include "common/error.h"
#include "common/fs_util.h"

namespace ptrain {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// The splitter's state between blocks: where in the array it is, and inside an element, its
// bracket depth and whether it is in a string (after a backslash).
class Splitter {
 public:
  explicit Splitter(std::string path) : path_(std::move(path)) {}

  void feed(const std::string& text) {
    for (char c : text) {
      step(c);
      if (c == '\n') ++line_;
    }
  }
  void finish() {
    if (where_ == Where::before) fail("the file holds no JSON array (it is empty or only whitespace)");
    if (where_ != Where::after)
      fail(in_string_ ? "the file ends inside a string of the array (is it truncated?)"
                      : "the file ends before the array's closing ']' (is it truncated?)");
  }
  std::vector<std::string> elements;
  std::vector<int64_t> indices;
  size_t pending_bytes = 0;  // of the elements not handed over yet

 private:
  // An element runs to the ',' or ']' at its own depth outside strings: two values without a comma
  // between them are one element, which the caller's JSON parser refuses.
  enum class Where { before, element_or_end, element, in_element, after };

  [[noreturn]] void fail(const std::string& why) const {
    throw RuntimeError(path_ + ":" + std::to_string(line_) + ": " + why +
                       " (data.format = \"json\" reads one JSON array of records; a file of one record per line is "
                       "data.format = \"jsonl\")");
  }
  static std::string shown(char c) {
    if (c >= 0x20 && c < 0x7f) return std::string("'") + c + "'";
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02x", static_cast<unsigned char>(c));
    return std::string("byte ") + hex;
  }
  void close_element() {
    while (!current_.empty() && is_space(current_.back())) current_.pop_back();
    pending_bytes += current_.size();
    elements.push_back(std::move(current_));
    current_.clear();
    indices.push_back(++index_);
  }
  void step(char c) {
    switch (where_) {
      case Where::before:
        if (is_space(c)) return;
        if (c != '[') fail("expected '[' (a JSON array) first, found " + shown(c));
        where_ = Where::element_or_end;
        return;
      case Where::element_or_end:
      case Where::element:
        if (is_space(c)) return;
        if (c == ']') {
          if (where_ == Where::element) fail("a ',' before the closing ']' (JSON has no trailing comma)");
          where_ = Where::after;
          return;
        }
        if (c == ',') fail("an element is missing before ','");
        where_ = Where::in_element;
        break;  // c starts the element
      case Where::in_element:
        break;
      case Where::after:
        if (!is_space(c)) fail("text after the array's closing ']': " + shown(c));
        return;
    }
    if (in_string_) {
      current_ += c;
      if (escaped_)
        escaped_ = false;
      else if (c == '\\')
        escaped_ = true;
      else if (c == '"')
        in_string_ = false;
      return;
    }
    if (depth_ == 0 && (c == ',' || c == ']')) {
      close_element();
      where_ = c == ',' ? Where::element : Where::after;
      return;
    }
    current_ += c;
    if (c == '"') {
      in_string_ = true;
    } else if (c == '{' || c == '[') {
      ++depth_;
    } else if (c == '}' || c == ']') {
      if (depth_ == 0) fail(shown(c) + " closes a bracket element " + std::to_string(index_ + 1) + " never opened");
      --depth_;
    }
  }

  std::string path_;
  Where where_ = Where::before;
  std::string current_;
  int64_t depth_ = 0, line_ = 1, index_ = 0;
  bool in_string_ = false, escaped_ = false;
};

}  // namespace

void json_array_blocks(const std::string& path, size_t block_bytes, const JsonArrayBlock& fn) {
  ChunkReader in(path);
  Splitter split(path);
  std::string buf;
  int64_t done = 0;
  const size_t chunk = std::min<size_t>(std::max<size_t>(block_bytes, 1), size_t{1} << 20);
  while (true) {
    const bool last = !in.next(buf, chunk);
    if (last) split.finish();
    split.feed(buf);
    done += static_cast<int64_t>(buf.size());
    if (!split.elements.empty() && (last || split.pending_bytes >= block_bytes)) {
      fn(std::move(split.elements), std::move(split.indices), done, in.size());
      split.elements.clear();
      split.indices.clear();
      split.pending_bytes = 0;
    }
    if (last) break;
  }
}

}  // namespace ptrain
