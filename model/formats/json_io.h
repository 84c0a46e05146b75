// model/formats/json_io.h: JSON read and written for the whole trainer (safetensors headers,
// config.json, metrics.jsonl, the exported vocabulary). nlohmann-json does the work, in
// model/formats/json_io.cpp alone: its header costs about 6 s of compile a file, so the files that
// read or write JSON see only this small interface. Values behave as nlohmann-json's do
// (types, conversions, the text dump() writes, the exceptions a bad conversion throws).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace tg {
namespace jsonio {

// A parsed JSON value (or a part of one), read-only. Objects keep nlohmann::json's key order
// (sorted); a key given twice keeps its last value.
class Value {
 public:
  Value() = default;  // null
  bool is_discarded() const;  // what parse() returns for text that is not JSON
  bool is_null() const;
  bool is_boolean() const;
  bool is_number() const;
  bool is_number_integer() const;   // signed or unsigned
  bool is_number_unsigned() const;
  bool is_string() const;
  bool is_array() const;
  bool is_object() const;
  bool contains(const std::string& key) const;     // an object holding key
  Value operator[](const std::string& key) const;  // that member (null when absent)
  Value operator[](size_t i) const;                // element i of an array (null when out of range)
  size_t size() const;                              // elements or members (nlohmann's size())
  std::vector<Value> elements() const;              // an array's elements, in order
  std::vector<std::pair<std::string, Value>> items() const;  // an object's members, in key order
  // nlohmann's get<T>(): numbers convert between kinds; another type throws its type_error
  int64_t get_int64() const;
  uint64_t get_uint64() const;
  double get_double() const;
  bool get_bool() const;
  std::string get_string() const;
  bool value(const std::string& key, bool fallback) const;  // nlohmann's value(key, fallback)
  std::string dump() const;  // compact, as nlohmann writes it

 private:
  friend struct Access;
  std::shared_ptr<const nlohmann::json> root_;  // keeps the parsed document alive
  const nlohmann::json* node_ = nullptr;        // this value inside it; nullptr: null
};

// text parsed; never throws: text that is not JSON gives a value whose is_discarded() is true
Value parse(const std::string& text);

// A refusal of parse_untrusted(), its message ready for "has a bad header: <msg>".
struct Error {
  std::string msg;
};

// text parsed under the limits of untrusted input, checked as the parser goes: throws Error
// for text that is not JSON ("invalid JSON at byte N of the header (why)"), a key twice in one
// object, nesting deeper than max_depth levels, more than max_entries top-level entries.
Value parse_untrusted(const std::string& text, int max_depth, size_t max_entries);

// A JSON value to write: null, a boolean, an integer, a number, a string, an array, or an
// object whose members keep the order they were added in (nlohmann::ordered_json's).
class Out {
 public:
  Out() = default;  // null
  Out(std::nullptr_t) {}
  Out(bool b) : kind_(Kind::Bool), b_(b) {}
  Out(int i) : kind_(Kind::Int), i_(i) {}
  Out(long i) : kind_(Kind::Int), i_(i) {}
  Out(long long i) : kind_(Kind::Int), i_(i) {}
  Out(unsigned long u) : kind_(Kind::Uint), u_(u) {}
  Out(unsigned long long u) : kind_(Kind::Uint), u_(u) {}
  Out(double d) : kind_(Kind::Double), d_(d) {}
  Out(const char* s) : kind_(Kind::String), s_(s) {}
  Out(std::string s) : kind_(Kind::String), s_(std::move(s)) {}
  Out(const std::vector<uint64_t>& v);            // an array of unsigned integers
  Out(const std::vector<std::string>& v);         // an array of strings
  static Out array(std::vector<Out> elements);
  static Out object();  // empty
  // The member key of an object (a null Out becomes an empty object first, as in nlohmann):
  // the existing one, else a new null member at the end.
  Out& operator[](const std::string& key);
  const std::vector<std::string>& keys() const { return keys_; }   // an object's, in order
  const std::vector<Out>& values() const { return values_; }       // its members, or an array's elements

 private:
  friend struct Access;
  enum class Kind { Null, Bool, Int, Uint, Double, String, Array, Object };
  Kind kind_ = Kind::Null;
  bool b_ = false;
  int64_t i_ = 0;
  uint64_t u_ = 0;
  double d_ = 0;
  std::string s_;
  std::vector<std::string> keys_;
  std::vector<Out> values_;
};

// v as nlohmann's dump(indent) writes it: indent < 0 one line, else that many spaces a
// level. ascii: characters outside ASCII as \u escapes and bytes that are not UTF-8 as
// U+FFFD (else such bytes throw nlohmann's type_error, as its default does).
std::string dump(const Out& v, int indent = -1, bool ascii = false);

}  // namespace jsonio
}  // namespace tg
