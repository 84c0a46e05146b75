// model/formats/json_io.cpp: the one translation unit that includes nlohmann-json (see model/formats/json_io.h).
#include "json_io.h"

#include <set>
#include <vector>

#include <nlohmann/json.hpp>

#include "../../data/errors.h"

namespace tg {
namespace jsonio {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

struct Access {
  static Value make(std::shared_ptr<const json> root, const json* node) {
    Value v;
    v.root_ = std::move(root);
    v.node_ = node;
    return v;
  }
  static Value child(const Value& parent, const json* node) { return make(parent.root_, node); }
  static const json& node(const Value& v) {
    static const json null_value;
    return v.node_ ? *v.node_ : null_value;
  }
  static ordered_json to_nlohmann(const Out& v) {
    switch (v.kind_) {
      case Out::Kind::Null: return ordered_json(nullptr);
      case Out::Kind::Bool: return ordered_json(v.b_);
      case Out::Kind::Int: return ordered_json(v.i_);
      case Out::Kind::Uint: return ordered_json(v.u_);
      case Out::Kind::Double: return ordered_json(v.d_);
      case Out::Kind::String: return ordered_json(v.s_);
      case Out::Kind::Array: {
        ordered_json a = ordered_json::array();
        for (const Out& e : v.values_) a.push_back(to_nlohmann(e));
        return a;
      }
      case Out::Kind::Object: {
        ordered_json o = ordered_json::object();
        for (size_t i = 0; i < v.keys_.size(); ++i) o[v.keys_[i]] = to_nlohmann(v.values_[i]);
        return o;
      }
    }
    return ordered_json(nullptr);
  }
};

namespace {
const json& J(const Value& v) { return Access::node(v); }
}  // namespace

bool Value::is_discarded() const { return J(*this).is_discarded(); }
bool Value::is_null() const { return J(*this).is_null(); }
bool Value::is_boolean() const { return J(*this).is_boolean(); }
bool Value::is_number() const { return J(*this).is_number(); }
bool Value::is_number_integer() const { return J(*this).is_number_integer(); }
bool Value::is_number_unsigned() const { return J(*this).is_number_unsigned(); }
bool Value::is_string() const { return J(*this).is_string(); }
bool Value::is_array() const { return J(*this).is_array(); }
bool Value::is_object() const { return J(*this).is_object(); }

bool Value::contains(const std::string& key) const { return J(*this).contains(key); }

Value Value::operator[](const std::string& key) const {
  const json& j = J(*this);
  if (!j.is_object()) return Value();
  auto it = j.find(key);
  return it == j.end() ? Value() : Access::child(*this, &*it);
}

Value Value::operator[](size_t i) const {
  const json& j = J(*this);
  return j.is_array() && i < j.size() ? Access::child(*this, &j[i]) : Value();
}

size_t Value::size() const { return J(*this).size(); }

std::vector<Value> Value::elements() const {
  std::vector<Value> out;
  const json& j = J(*this);
  if (j.is_array())
    for (const json& e : j) out.push_back(Access::child(*this, &e));
  return out;
}

std::vector<std::pair<std::string, Value>> Value::items() const {
  std::vector<std::pair<std::string, Value>> out;
  const json& j = J(*this);
  if (j.is_object())
    for (const auto& kv : j.items()) out.emplace_back(kv.key(), Access::child(*this, &kv.value()));
  return out;
}

int64_t Value::get_int64() const { return J(*this).get<int64_t>(); }
uint64_t Value::get_uint64() const { return J(*this).get<uint64_t>(); }
double Value::get_double() const { return J(*this).get<double>(); }
bool Value::get_bool() const { return J(*this).get<bool>(); }
std::string Value::get_string() const { return J(*this).get<std::string>(); }
bool Value::value(const std::string& key, bool fallback) const { return J(*this).value(key, fallback); }
std::string Value::dump() const { return J(*this).dump(); }

Value parse(const std::string& text) {
  auto root = std::make_shared<const json>(json::parse(text, nullptr, /*allow_exceptions=*/false));
  const json* node = root.get();
  return Access::make(std::move(root), node);
}

namespace {

// nlohmann's DOM builder with the limits checked as each event arrives. sax_parse is a template
// on the handler's type, so these members are the ones it calls. (The parser_callback_t form of
// json::parse checks the same things but rescans an object's members at each member's end:
// quadratic, 20 s for a header of 65,536 empty objects; this is linear.)
struct LimitedDom : nlohmann::detail::json_sax_dom_parser<json> {
  using Base = nlohmann::detail::json_sax_dom_parser<json>;
  int max_depth;
  size_t max_entries;
  int depth = 0;                            // containers open
  std::vector<std::set<std::string>> keys;  // of each object still open, innermost last
  size_t entries = 0;
  LimitedDom(json& root, int max_depth_, size_t max_entries_)
      : Base(root, true), max_depth(max_depth_), max_entries(max_entries_) {}
  void open() {
    if (depth >= max_depth) throw Error{"nesting deeper than " + std::to_string(max_depth) + " levels"};
    ++depth;
  }
  bool start_object(std::size_t n) {
    open();
    keys.emplace_back();
    return Base::start_object(n);
  }
  bool end_object() {
    --depth;
    keys.pop_back();
    return Base::end_object();
  }
  bool start_array(std::size_t n) {
    open();
    return Base::start_array(n);
  }
  bool end_array() {
    --depth;
    return Base::end_array();
  }
  bool key(json::string_t& k) {
    if (!keys.back().insert(k).second) throw Error{"duplicate key \"" + printable(k) + "\""};
    if (depth == 1 && ++entries > max_entries) throw Error{"more than " + std::to_string(max_entries) + " entries"};
    return Base::key(k);
  }
};

}  // namespace

Value parse_untrusted(const std::string& text, int max_depth, size_t max_entries) {
  try {
    auto root = std::make_shared<json>();
    LimitedDom dom(*root, max_depth, max_entries);
    json::sax_parse(text, &dom);
    const json* node = root.get();
    return Access::make(std::move(root), node);
  } catch (const json::parse_error& e) {
    // e.what(): "[json.exception.parse_error.101] parse error at line 1, column 2: <why>"
    std::string why = e.what();
    const size_t colon = why.find(": ");
    why = colon == std::string::npos ? why : why.substr(colon + 2);
    throw Error{"invalid JSON at byte " + std::to_string(e.byte ? e.byte - 1 : 0) + " of the header (" +
                printable(why, 160) + ")"};
  } catch (const json::exception& e) {
    throw Error{"invalid JSON (" + printable(e.what(), 160) + ")"};
  }
}

Out::Out(const std::vector<uint64_t>& v) : kind_(Kind::Array) {
  for (uint64_t x : v) values_.emplace_back(x);
}

Out::Out(const std::vector<std::string>& v) : kind_(Kind::Array) {
  for (const std::string& s : v) values_.emplace_back(s);
}

Out Out::array(std::vector<Out> elements) {
  Out a;
  a.kind_ = Kind::Array;
  a.values_ = std::move(elements);
  return a;
}

Out Out::object() {
  Out o;
  o.kind_ = Kind::Object;
  return o;
}

Out& Out::operator[](const std::string& key) {
  if (kind_ == Kind::Null) kind_ = Kind::Object;
  if (kind_ != Kind::Object) throw std::logic_error("jsonio::Out: operator[] with a key on a value that is not an object");
  for (size_t i = 0; i < keys_.size(); ++i)
    if (keys_[i] == key) return values_[i];
  keys_.push_back(key);
  values_.emplace_back();
  return values_.back();
}

std::string dump(const Out& v, int indent, bool ascii) {
  const ordered_json j = Access::to_nlohmann(v);
  return ascii ? j.dump(indent, ' ', true, ordered_json::error_handler_t::replace) : j.dump(indent);
}

}  // namespace jsonio
}  // namespace tg
