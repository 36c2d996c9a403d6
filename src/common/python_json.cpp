#include "common/python_json.h"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "common/error.h"

namespace ptrain {

namespace {

// Python's float repr: the shortest digits that read back (std::to_chars gives them), written
// fixed where the decimal exponent e is -5 < e < 16 ("0.0001", "1e-05", "1000000000000000.0",
// "1e+16"), else as d.ddde±XX with at least two exponent digits.
std::string python_float(double x) {
  if (!std::isfinite(x))
    throw RuntimeError("a number that is not finite, which JSON cannot hold");  // not reachable from a parse
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string sci(buf, r.ptr);  // "-d.ddde±XX"
  const size_t e_at = sci.find('e');
  const int exponent = std::stoi(sci.substr(e_at + 1));
  std::string mantissa = sci.substr(0, e_at);
  const bool negative = mantissa[0] == '-';
  if (negative) mantissa.erase(0, 1);
  if (exponent < -4 || exponent >= 16) return sci;  // to_chars writes Python's exponent form
  std::string digits;
  for (char c : mantissa)
    if (c != '.') digits += c;
  std::string out;
  if (exponent < 0) {
    out = "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
  } else {
    const size_t point = static_cast<size_t>(exponent) + 1;
    if (digits.size() <= point)
      out = digits + std::string(point - digits.size(), '0') + ".0";
    else
      out = digits.substr(0, point) + "." + digits.substr(point);
  }
  return (negative ? "-" : "") + out;
}

void python_string(const std::string& s, std::string& out) {
  static const char* hex = "0123456789abcdef";
  out += '"';
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += hex[c >> 4];
          out += hex[c & 15];
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

// indent < 0: one line, ", " and ": " between items (json.dumps' default); else each item on a line
// of its own, `indent` spaces deeper per level, "," and ": " between them (json.dumps(indent=N)).
void dump(const nlohmann::ordered_json& v, std::string& out, int indent, int depth) {
  const auto item = [&](size_t i) {
    if (indent < 0) {
      if (i) out += ", ";
      return;
    }
    out += i ? ",\n" : "\n";
    out.append(static_cast<size_t>(indent) * static_cast<size_t>(depth + 1), ' ');
  };
  const auto close = [&](char c) {
    if (indent >= 0 && !v.empty()) {
      out += '\n';
      out.append(static_cast<size_t>(indent) * static_cast<size_t>(depth), ' ');
    }
    out += c;
  };
  switch (v.type()) {
    case nlohmann::json::value_t::object: {
      out += '{';
      size_t i = 0;
      for (auto it = v.begin(); it != v.end(); ++it) {
        item(i++);
        python_string(it.key(), out);
        out += ": ";
        dump(it.value(), out, indent, depth + 1);
      }
      close('}');
      return;
    }
    case nlohmann::json::value_t::array: {
      out += '[';
      for (size_t i = 0; i < v.size(); ++i) {
        item(i);
        dump(v[i], out, indent, depth + 1);
      }
      close(']');
      return;
    }
    case nlohmann::json::value_t::string:
      python_string(v.get_ref<const std::string&>(), out);
      return;
    case nlohmann::json::value_t::number_float:
      out += python_float(v.get<double>());
      return;
    case nlohmann::json::value_t::boolean:
      out += v.get<bool>() ? "true" : "false";
      return;
    case nlohmann::json::value_t::null:
      out += "null";
      return;
    default:  // integers (signed, unsigned) as written
      out += v.dump();
      return;
  }
}

// Finds the first number written as an integer that the parse read as a float.
struct WideIntegers : nlohmann::json_sax<nlohmann::ordered_json> {
  std::string found;
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t& s) override {
    if (s.find_first_of(".eE") == std::string::npos) found = s;
    return found.empty();
  }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }
};

}  // namespace

std::string wide_json_integer(const std::string& text) {
  WideIntegers sax;
  nlohmann::ordered_json::sax_parse(text, &sax);
  return sax.found;
}

std::string python_json(const nlohmann::ordered_json& value, int indent) {
  std::string out;
  dump(value, out, indent, 0);
  return out;
}

}  // namespace ptrain
