#include "io/torch_save.h"

#include "core/error.h"
#include "core/json.h"

#include <caffe2/serialize/in_memory_adapter.h>
#include <caffe2/serialize/inline_container.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>

namespace convnets {
namespace {

// A value of the restricted pickle machine. Lists and dicts are shared
// (the memo refers to the same object that APPEND and SETITEMS fill).
struct Value;
using ValuePtr = std::shared_ptr<Value>;
struct Value {
  enum class Kind { None, Bool, Int, Float, String, Bytes, List, Tuple, Dict, Global, Tensor, Storage };
  Kind kind = Kind::None;
  bool b = false;
  std::int64_t i = 0;
  double f = 0;
  std::string s;                                    // String, Bytes; Global: "module.name"
  std::vector<ValuePtr> items;                      // List, Tuple
  std::vector<std::pair<ValuePtr, ValuePtr>> dict;  // Dict, in insertion order
  at::Tensor tensor;                                // Tensor; Storage: its bytes as a 1-D tensor of its dtype
  std::string cls;                                  // Dict: collections.OrderedDict or argparse.Namespace

  Value() = default;
  Value(const Value&) = delete;
  Value& operator=(const Value&) = delete;
  // A pickle can nest a million lists in one another; destroying them member
  // by member would recurse a million frames deep and overflow the stack.
  // The last owner of a child takes it over here instead, one level at a time.
  ~Value() {
    std::vector<ValuePtr> pending;
    const auto release = [&pending](Value& v) {
      const auto take = [&pending](ValuePtr& child) {
        if (child && child.use_count() == 1) pending.push_back(std::move(child));
        child.reset();
      };
      for (auto& item : v.items) take(item);
      for (auto& [key, value] : v.dict) {
        take(key);
        take(value);
      }
      v.items.clear();
      v.dict.clear();
    };
    release(*this);
    while (!pending.empty()) {
      ValuePtr last = std::move(pending.back());
      pending.pop_back();
      release(*last);  // `last` then goes with no children left
    }
  }
};

ValuePtr make(Value::Kind k) {
  auto v = std::make_shared<Value>();
  v->kind = k;
  return v;
}

// Classes a checkpoint may name, and what each one rebuilds. Everything else
// is refused by name before anything of it is used.
const std::map<std::string, at::ScalarType>& storage_types() {
  static const std::map<std::string, at::ScalarType> types{
      {"torch.FloatStorage", at::kFloat},    {"torch.DoubleStorage", at::kDouble}, {"torch.HalfStorage", at::kHalf},
      {"torch.BFloat16Storage", at::kBFloat16}, {"torch.LongStorage", at::kLong}, {"torch.IntStorage", at::kInt},
      {"torch.ShortStorage", at::kShort},    {"torch.CharStorage", at::kChar},     {"torch.ByteStorage", at::kByte},
      {"torch.BoolStorage", at::kBool}};
  return types;
}
const std::set<std::string>& callables() {
  static const std::set<std::string> names{"collections.OrderedDict", "argparse.Namespace",
                                            "torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_parameter"};
  return names;
}

class Unpickler {
 public:
  Unpickler(const std::string& data, std::string name, std::function<ValuePtr(const ValuePtr&)> persistent)
      : d_(data), name_(std::move(name)), persistent_(std::move(persistent)) {}

  ValuePtr load() {
    for (;;) {
      const std::uint8_t op = u8();
      switch (op) {
        case 0x80: u8(); break;          // PROTO
        case 0x95: bytes(8); break;      // FRAME: a length, the frame follows in place
        case '.':                        // STOP
          if (stack_.size() != 1 || !marks_.empty()) fail("the pickle ends with " + std::to_string(stack_.size()) + " values on its stack");
          return stack_.back();
        case '(': marks_.push_back(stack_.size()); break;  // MARK
        case 'N': push(make(Value::Kind::None)); break;
        case 0x88: case 0x89: { auto v = make(Value::Kind::Bool); v->b = op == 0x88; push(v); break; }
        case 'J': push_int(static_cast<std::int32_t>(le(4))); break;
        case 'K': push_int(static_cast<std::int64_t>(le(1))); break;
        case 'M': push_int(static_cast<std::int64_t>(le(2))); break;
        case 0x8a: push_long(le(1)); break;  // LONG1
        case 0x8b: push_long(le(4)); break;  // LONG4
        case 'G': {                          // BINFLOAT: big-endian double
          const std::string b = bytes(8);
          std::uint64_t bits = 0;
          for (unsigned char c : b) bits = (bits << 8) | c;
          auto v = make(Value::Kind::Float);
          std::memcpy(&v->f, &bits, sizeof bits);
          push(v);
          break;
        }
        case 'X': push_text(Value::Kind::String, le(4)); break;     // BINUNICODE
        case 0x8c: push_text(Value::Kind::String, le(1)); break;    // SHORT_BINUNICODE
        case 0x8d: push_text(Value::Kind::String, le(8)); break;    // BINUNICODE8
        case 'T': push_text(Value::Kind::String, le(4)); break;     // BINSTRING (Python 2 str)
        case 'U': push_text(Value::Kind::String, le(1)); break;     // SHORT_BINSTRING
        case 'B': push_text(Value::Kind::Bytes, le(4)); break;      // BINBYTES
        case 'C': push_text(Value::Kind::Bytes, le(1)); break;      // SHORT_BINBYTES
        case 0x8e: push_text(Value::Kind::Bytes, le(8)); break;     // BINBYTES8
        case '}': { auto v = make(Value::Kind::Dict); v->cls = "dict"; push(v); break; }
        case ']': push(make(Value::Kind::List)); break;
        case ')': push(make(Value::Kind::Tuple)); break;
        case 't': { auto v = make(Value::Kind::Tuple); v->items = pop_mark(); push(v); break; }
        case 0x85: case 0x86: case 0x87: {  // TUPLE1..3
          const std::size_t n = op - 0x84u;
          auto v = make(Value::Kind::Tuple);
          v->items = pop_n(n);
          push(v);
          break;
        }
        case 'a': { auto x = pop(); list(top())->items.push_back(x); break; }  // APPEND
        case 'e': { auto xs = pop_mark(); auto& l = list(top())->items; l.insert(l.end(), xs.begin(), xs.end()); break; }
        case 's': { auto v = pop(); auto k = pop(); set_item(top(), k, v); break; }  // SETITEM
        case 'u': {  // SETITEMS
          auto xs = pop_mark();
          if (xs.size() % 2) fail("SETITEMS with an odd number of values");
          for (std::size_t k = 0; k < xs.size(); k += 2) set_item(top(), xs[k], xs[k + 1]);
          break;
        }
        case 'q': memo_[le(1)] = top(); break;    // BINPUT
        case 'r': memo_[le(4)] = top(); break;    // LONG_BINPUT
        case 0x94: memo_[memo_.size()] = top(); break;  // MEMOIZE
        case 'h': push(memo(le(1))); break;       // BINGET
        case 'j': push(memo(le(4))); break;       // LONG_BINGET
        case '0': pop(); break;                   // POP
        case '2': push(top()); break;             // DUP
        case 'c': {                               // GLOBAL "module\nname\n"
          const std::string module = line(), attr = line();
          push(global(module + "." + attr));
          break;
        }
        case 0x93: {  // STACK_GLOBAL
          const auto attr = pop(), module = pop();
          if (module->kind != Value::Kind::String || attr->kind != Value::Kind::String) fail("STACK_GLOBAL of non-strings");
          push(global(module->s + "." + attr->s));
          break;
        }
        case 'R': case 0x81: {  // REDUCE, NEWOBJ: callable(*args)
          const auto args = pop(), fn = pop();
          push(call(fn, args));
          break;
        }
        case 'b': { const auto state = pop(); build(top(), state); break; }  // BUILD
        case 'Q': push(persistent_(pop())); break;                           // BINPERSID
        default: {
          char hex[8];
          std::snprintf(hex, sizeof hex, "0x%02x", op);
          fail(std::string("pickle opcode ") + hex + " is not one a state dict uses");
        }
      }
    }
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw Error(name_ + ": " + what + " (at byte " + std::to_string(pos_) + " of data.pkl)");
  }

 private:
  std::uint8_t u8() {
    if (pos_ >= d_.size()) fail("the pickle is truncated");
    return static_cast<std::uint8_t>(d_[pos_++]);
  }
  std::uint64_t le(int n) {
    std::uint64_t v = 0;
    for (int k = 0; k < n; ++k) v |= static_cast<std::uint64_t>(u8()) << (8 * k);
    return v;
  }
  std::string bytes(std::uint64_t n) {
    if (n > d_.size() - pos_) fail("the pickle is truncated");
    std::string out = d_.substr(pos_, n);
    pos_ += n;
    return out;
  }
  std::string line() {
    const auto end = d_.find('\n', pos_);
    if (end == std::string::npos || end - pos_ > 256) fail("a GLOBAL name without its end");
    std::string out = d_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return out;
  }
  void push(ValuePtr v) {
    if (stack_.size() > (1u << 20)) fail("the pickle's stack grows past a million values");
    stack_.push_back(std::move(v));
  }
  void push_int(std::int64_t i) {
    auto v = make(Value::Kind::Int);
    v->i = i;
    push(v);
  }
  void push_long(std::uint64_t n) {
    if (n > 8) fail("an integer of " + std::to_string(n) + " bytes");
    const std::string b = bytes(n);
    std::uint64_t u = 0;
    for (std::size_t k = 0; k < n; ++k) u |= static_cast<std::uint64_t>(static_cast<unsigned char>(b[k])) << (8 * k);
    if (n > 0 && n < 8 && (static_cast<unsigned char>(b[n - 1]) & 0x80)) u |= ~std::uint64_t{0} << (8 * n);  // sign
    push_int(static_cast<std::int64_t>(u));
  }
  void push_text(Value::Kind k, std::uint64_t n) {
    auto v = make(k);
    v->s = bytes(n);
    push(v);
  }
  ValuePtr top() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) fail("the pickle's stack is empty");
    return stack_.back();
  }
  ValuePtr pop() {
    auto v = top();
    stack_.pop_back();
    return v;
  }
  std::vector<ValuePtr> pop_n(std::size_t n) {
    const std::size_t floor = marks_.empty() ? 0 : marks_.back();
    if (stack_.size() < floor + n) fail("the pickle's stack is empty");
    std::vector<ValuePtr> out(stack_.end() - static_cast<std::ptrdiff_t>(n), stack_.end());
    stack_.resize(stack_.size() - n);
    return out;
  }
  std::vector<ValuePtr> pop_mark() {
    if (marks_.empty()) fail("a MARK is missing");
    const std::size_t at = marks_.back();
    marks_.pop_back();
    std::vector<ValuePtr> out(stack_.begin() + static_cast<std::ptrdiff_t>(at), stack_.end());
    stack_.resize(at);
    return out;
  }
  ValuePtr memo(std::uint64_t k) {
    const auto it = memo_.find(k);
    if (it == memo_.end()) fail("memo entry " + std::to_string(k) + " was never stored");
    return it->second;
  }
  ValuePtr list(const ValuePtr& v) {
    if (v->kind != Value::Kind::List) fail("APPEND to something not a list");
    return v;
  }
  void set_item(const ValuePtr& d, const ValuePtr& k, const ValuePtr& v) {
    if (d->kind != Value::Kind::Dict) fail("SETITEM on something not a dict");
    if (d->dict.size() >= (1u << 22)) fail("a dict of more than 4 million entries");
    d->dict.emplace_back(k, v);
  }
  ValuePtr global(const std::string& qualified) {
    if (!callables().count(qualified) && !storage_types().count(qualified)) {
      fail("the class " + qualified + " is not one convnets reads (tensors, storages, dict, OrderedDict, list, tuple, "
           "numbers, strings, None, argparse.Namespace); nothing of it was run");
    }
    auto v = make(Value::Kind::Global);
    v->s = qualified;
    return v;
  }
  const std::vector<ValuePtr>& args_of(const ValuePtr& args, std::size_t at_least, const std::string& fn) {
    if (args->kind != Value::Kind::Tuple || args->items.size() < at_least)
      fail(fn + " called with " + std::to_string(args->items.size()) + " arguments");
    return args->items;
  }
  std::vector<std::int64_t> ints(const ValuePtr& v, const std::string& what) {
    if (v->kind != Value::Kind::Tuple && v->kind != Value::Kind::List) fail(what + " is not a tuple");
    std::vector<std::int64_t> out;
    for (const auto& x : v->items) {
      if (x->kind != Value::Kind::Int) fail(what + " holds a non-integer");
      out.push_back(x->i);
    }
    return out;
  }
  ValuePtr call(const ValuePtr& fn, const ValuePtr& args) {
    if (fn->kind != Value::Kind::Global) fail("REDUCE of something not a class");
    if (fn->s == "collections.OrderedDict" || fn->s == "argparse.Namespace") {
      auto v = make(Value::Kind::Dict);
      v->cls = fn->s;
      if (args->kind == Value::Kind::Tuple && !args->items.empty()) fail(fn->s + " built from arguments");
      return v;
    }
    if (fn->s == "torch._utils._rebuild_parameter") {
      const auto& a = args_of(args, 1, fn->s);
      if (a[0]->kind != Value::Kind::Tensor) fail("a Parameter of something not a tensor");
      return a[0];
    }
    if (fn->s == "torch._utils._rebuild_tensor_v2") {
      const auto& a = args_of(args, 4, fn->s);
      if (a[0]->kind != Value::Kind::Storage) fail("a tensor without a storage");
      if (a[1]->kind != Value::Kind::Int) fail("a tensor's storage offset is not an integer");
      const auto size = ints(a[2], "a tensor's size"), stride = ints(a[3], "a tensor's stride");
      if (size.size() != stride.size() || size.size() > 8) fail("a tensor's size and stride disagree");
      // The furthest element the view reaches must lie inside its storage.
      const std::int64_t numel = a[0]->tensor.numel(), offset = a[1]->i;
      std::int64_t last = offset, count = 1;
      for (std::size_t k = 0; k < size.size(); ++k) {
        if (size[k] < 0 || stride[k] < 0) fail("a tensor of negative size or stride");
        if (size[k] == 0) count = 0;
      }
      // An empty view (torch.zeros(0, 2)) reads nothing, whatever its other sizes: they need only leave its shape
      // countable. A view that reads must reach no further than its storage.
      std::int64_t cells = 1;
      for (std::size_t k = 0; k < size.size(); ++k) {
        std::int64_t reach = 0;
        if (count == 0) {
          if (size[k] > 0 && (__builtin_mul_overflow(cells, size[k], &cells) || cells > (std::int64_t{1} << 40)))
            fail("a tensor of impossible size");
        } else if (size[k] > numel + 1 || __builtin_mul_overflow(size[k] - 1, stride[k], &reach) ||
                   __builtin_add_overflow(last, reach, &last)) {
          fail("a tensor view reaches past its storage");
        }
      }
      if (offset < 0 || (count > 0 && last >= numel)) fail("a tensor view reaches past its storage");
      auto v = make(Value::Kind::Tensor);
      v->tensor = count == 0 ? at::empty(size, a[0]->tensor.options())
                             : a[0]->tensor.as_strided(size, stride, offset).contiguous();
      return v;
    }
    fail("a " + fn->s + " called");
  }
  void build(const ValuePtr& obj, const ValuePtr& state) {
    if (obj->kind == Value::Kind::Dict && obj->cls == "argparse.Namespace") {
      if (state->kind != Value::Kind::Dict) fail("argparse.Namespace with a state that is not a dict");
      obj->dict.insert(obj->dict.end(), state->dict.begin(), state->dict.end());
      return;
    }
    // A state dict's own attributes (OrderedDict._metadata: module versions),
    // and a Parameter's or tensor's (hooks), are not weights.
    if (obj->kind == Value::Kind::Dict || obj->kind == Value::Kind::Tensor) return;
    fail("BUILD of something not an object");
  }

  const std::string& d_;
  std::string name_;
  std::function<ValuePtr(const ValuePtr&)> persistent_;
  std::size_t pos_ = 0;
  std::vector<ValuePtr> stack_;
  std::vector<std::size_t> marks_;
  std::map<std::uint64_t, ValuePtr> memo_;
};

bool all_tensors(const Value& d) {
  if (d.kind != Value::Kind::Dict || d.dict.empty()) return false;
  for (const auto& [k, v] : d.dict) {
    if (k->kind != Value::Kind::String || v->kind != Value::Kind::Tensor) return false;
  }
  return true;
}

nlohmann::json plain(const Value& v, int depth = 0) {
  using K = Value::Kind;
  if (depth > 16) return "...";
  switch (v.kind) {
    case K::None: return nullptr;
    case K::Bool: return v.b;
    case K::Int: return v.i;
    case K::Float: return v.f;
    case K::String: return v.s;
    case K::Bytes: return "<" + std::to_string(v.s.size()) + " bytes>";
    case K::Tensor: return v.tensor.numel() == 1 ? nlohmann::json(v.tensor.to(at::kDouble).item<double>())
                                                 : nlohmann::json("<tensor>");
    case K::List: case K::Tuple: {
      auto out = nlohmann::json::array();
      for (const auto& x : v.items) out.push_back(plain(*x, depth + 1));
      return out;
    }
    case K::Dict: {
      auto out = nlohmann::json::object();
      for (const auto& [k, x] : v.dict) {
        if (k->kind == K::String) out[k->s] = plain(*x, depth + 1);
      }
      return out;
    }
    default: return "<" + v.s + ">";
  }
}

// torch.optim's state_dict: {"state": {id: {name: tensor or number}}, "param_groups": [{"params": [id, ...], ...}]}.
void read_optimizer(const Value& opt, TorchSaveContents& out, const std::string& name) {
  const auto bad = [&](const std::string& what) -> Error {
    return Error(name + ": its 'optimizer' is not a torch.optim state_dict (" + what + ")");
  };
  if (opt.kind != Value::Kind::Dict) throw bad("not a dict");
  const Value *state = nullptr, *groups = nullptr;
  for (const auto& [k, v] : opt.dict) {
    if (k->kind != Value::Kind::String) continue;
    if (k->s == "state") state = v.get();
    if (k->s == "param_groups") groups = v.get();
  }
  if (!state || !groups) throw bad("no 'state' and 'param_groups'");
  if (state->kind != Value::Kind::Dict || groups->kind != Value::Kind::List) throw bad("'state' or 'param_groups' of the wrong type");
  for (const auto& g : groups->items) {
    const Value* params = nullptr;
    if (g->kind == Value::Kind::Dict) {
      for (const auto& [k, v] : g->dict) {
        if (k->kind != Value::Kind::String) continue;
        if (k->s == "params") params = v.get();
        // The group's hyperparameters name the optimizer even before its first step made any state.
        if (k->s == "alpha") out.optimizer_kind = "rmsprop";
      }
    }
    if (!params || params->kind != Value::Kind::List) throw bad("a param group without its 'params' list");
    std::vector<std::int64_t> ids;
    for (const auto& id : params->items) {
      if (id->kind != Value::Kind::Int) throw bad("a parameter id that is not an integer");
      ids.push_back(id->i);
    }
    out.optimizer_groups.push_back(std::move(ids));
  }
  for (const auto& [id, entry] : state->dict) {
    if (id->kind != Value::Kind::Int || entry->kind != Value::Kind::Dict) throw bad("a state entry not keyed by a parameter id");
    NamedTensors& tensors = out.optimizer_state[id->i];
    for (const auto& [k, v] : entry->dict) {
      // Scalars beside the buffers ("step") are the optimizer's count, not state convnets keeps.
      if (k->kind == Value::Kind::String && v->kind == Value::Kind::Tensor && v->tensor.dim() > 0) {
        tensors.emplace_back(k->s, v->tensor);
        if (k->s == "square_avg") out.optimizer_kind = "rmsprop";
      }
    }
  }
  out.has_optimizer = true;
}

Error no_data_pkl(const std::string& name) {
  return Error(name + ": a zip archive without data.pkl is not a torch.save file");
}

TorchSaveContents read(caffe2::serialize::PyTorchStreamReader& zip, const std::string& name) {
  if (zip.hasRecord("byteorder")) {
    const auto [data, size] = zip.getRecord("byteorder");
    const std::string order(static_cast<const char*>(data.get()), size);
    if (order != "little") throw Error(name + ": its tensors are stored " + order + "-endian; convnets reads little-endian files");
  }
  if (!zip.hasRecord("data.pkl")) throw no_data_pkl(name);
  const auto [pkl_ptr, pkl_size] = zip.getRecord("data.pkl");
  const std::string pkl(static_cast<const char*>(pkl_ptr.get()), pkl_size);

  std::map<std::string, ValuePtr> storages;  // by key: tensors that share one stay views of it
  Unpickler* self = nullptr;
  auto persistent = [&](const ValuePtr& pid) -> ValuePtr {
    const auto& t = pid->items;
    if (pid->kind != Value::Kind::Tuple || t.size() < 5 || t[0]->kind != Value::Kind::String || t[0]->s != "storage" ||
        t[1]->kind != Value::Kind::Global || t[2]->kind != Value::Kind::String || t[4]->kind != Value::Kind::Int) {
      self->fail("a persistent id that is not a storage");
    }
    const auto type = storage_types().find(t[1]->s);
    if (type == storage_types().end()) self->fail("a storage of class " + t[1]->s);
    if (const auto it = storages.find(t[2]->s); it != storages.end()) return it->second;
    const std::string record = "data/" + t[2]->s;
    if (!zip.hasRecord(record)) self->fail("storage " + t[2]->s + " is not in the archive");
    const auto [bytes, size] = zip.getRecord(record);
    const auto item = static_cast<std::uint64_t>(c10::elementSize(type->second));
    if (t[4]->i < 0 || static_cast<std::uint64_t>(t[4]->i) != size / item || size % item != 0)
      self->fail("storage " + t[2]->s + " holds " + std::to_string(size) + " bytes, not " + std::to_string(t[4]->i) +
                 " elements of " + std::to_string(item));
    auto v = make(Value::Kind::Storage);
    v->tensor = at::empty({t[4]->i}, at::TensorOptions().dtype(type->second));
    if (size) std::memcpy(v->tensor.data_ptr(), bytes.get(), size);
    storages[t[2]->s] = v;
    return v;
  };
  Unpickler unpickler(pkl, name, persistent);
  self = &unpickler;
  const ValuePtr root = unpickler.load();

  const Value* weights = nullptr;
  std::string section;
  if (all_tensors(*root)) weights = root.get();
  if (root->kind == Value::Kind::Dict && !weights) {
    for (const std::string key : {"state_dict", "model", "model_state_dict"}) {
      for (const auto& [k, v] : root->dict) {
        if (!weights && k->kind == Value::Kind::String && k->s == key && all_tensors(*v)) {
          weights = v.get();
          section = key;
        }
      }
    }
  }
  if (!weights) {
    std::string found;
    if (root->kind == Value::Kind::Dict) {
      for (const auto& [k, v] : root->dict) {
        if (k->kind == Value::Kind::String) found += (found.empty() ? "" : ", ") + k->s;
      }
    }
    throw Error(name + ": no state dict in it (looked for the whole file, state_dict, model, model_state_dict; its "
                "top level holds: " + (found.empty() ? "no named entries" : found) + ")");
  }
  TorchSaveContents contents;
  TensorFile& out = contents.weights;
  for (const auto& [k, v] : weights->dict) out.tensors.emplace_back(k->s, v->tensor);
  if (root.get() != weights) {
    for (const auto& [k, v] : root->dict) {
      if (k->kind != Value::Kind::String) continue;
      if (k->s == "state_dict_ema" && all_tensors(*v)) {
        for (const auto& [ek, ev] : v->dict) contents.ema.emplace_back(ek->s, ev->tensor);
      }
      if (k->s != "optimizer") continue;
      try {
        read_optimizer(*v, contents, name);
      } catch (const Error& e) {
        TorchSaveContents weights_only;  // what read_optimizer had filled in is dropped
        weights_only.weights = std::move(contents.weights);
        weights_only.ema = std::move(contents.ema);
        weights_only.optimizer_problem = e.what();
        contents = std::move(weights_only);
      }
    }
    nlohmann::json rest = nlohmann::json::object();
    for (const auto& [k, v] : root->dict) {
      if (k->kind == Value::Kind::String && !all_tensors(*v) && k->s.find("optimizer") == std::string::npos)
        rest[k->s] = plain(*v);
    }
    rest["weights_from"] = section;
    out.metadata["torch_save"] = dump_json(rest);  // invalid UTF-8 in a pickled string is replaced, not thrown
  }
  return contents;
}

using OpenZip = std::function<std::unique_ptr<caffe2::serialize::PyTorchStreamReader>()>;

Error unreadable(const std::string& name, const c10::Error& e) {
  return Error(name + ": not a readable torch.save archive (" + e.what_without_backtrace() + ")");
}

TorchSaveContents open_zip(const OpenZip& open, const std::string& name) {
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> zip;
  try {
    zip = open();
  } catch (const c10::Error& e) {
    throw unreadable(name, e);
  }
  try {
    return read(*zip, name);
  } catch (const c10::Error& e) {
    throw Error(name + ": a damaged torch.save archive (" + e.what_without_backtrace() + ")");
  }
}

// The bytes a legacy file needs for legacy_magic to tell: PROTO, a protocol 4 FRAME, and the pickled long.
constexpr std::size_t kLegacyHead = 2 + 9 + 12;

// Whether `head` begins as torch.save's pre-1.6 pickle does: the magic number 0x1950a86a20f9469cfc6c pickled
// first (PROTO 2..5, a FRAME from protocol 4 on, then LONG1 of its 10 little-endian bytes). Two bytes alone are
// not enough: a safetensors file whose header length is 640 begins 0x80 0x02 too.
bool legacy_magic(const unsigned char* head, std::size_t n) {
  static constexpr unsigned char kLong[] = {0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19};
  if (n < 2 || head[0] != 0x80 || head[1] < 2 || head[1] > 5) return false;
  std::size_t at = 2;
  if (head[1] >= 4 && n > at && head[at] == 0x95) at += 9;  // FRAME and its 8-byte length
  return n >= at + sizeof kLong && std::memcmp(head + at, kLong, sizeof kLong) == 0;
}

void refuse_legacy(const unsigned char* head, std::size_t n, const std::string& name) {
  if (legacy_magic(head, n)) {
    throw Error(name + ": a torch.save file in the legacy format (before PyTorch 1.6), which convnets does not read",
                "re-save it with a current PyTorch: torch.save(torch.load(f, weights_only=True), f)");
  }
}

std::unique_ptr<caffe2::serialize::PyTorchStreamReader> open_file(const std::string& path) {
  return std::make_unique<caffe2::serialize::PyTorchStreamReader>(path);
}

std::unique_ptr<caffe2::serialize::PyTorchStreamReader> open_bytes(const void* data, std::size_t size) {
  return std::make_unique<caffe2::serialize::PyTorchStreamReader>(
      std::make_shared<caffe2::serialize::MemoryReadAdapter>(data, size));
}

// The Error read_torch_save would throw before unpickling: an archive PyTorch's own reader cannot open, or one
// without data.pkl.
std::optional<Error> archive_problem(const OpenZip& open, const std::string& name) {
  try {
    if (!open()->hasRecord("data.pkl")) return no_data_pkl(name);
  } catch (const c10::Error& e) {
    return unreadable(name, e);
  }
  return std::nullopt;
}

}  // namespace

bool is_legacy_torch_save(const void* head, std::size_t n) {
  return legacy_magic(static_cast<const unsigned char*>(head), n);
}

std::optional<Error> torch_save_archive_problem(const std::string& path) {
  return archive_problem([&] { return open_file(path); }, path);
}

std::optional<Error> torch_save_archive_problem(const void* data, std::size_t size, const std::string& name) {
  return archive_problem([&] { return open_bytes(data, size); }, name);
}

TensorFile load_torch_save(const std::string& path) { return read_torch_save(path).weights; }

TorchSaveContents read_torch_save(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw SystemError("cannot open", path);
  unsigned char head[kLegacyHead] = {};
  in.read(reinterpret_cast<char*>(head), sizeof head);
  refuse_legacy(head, static_cast<std::size_t>(in.gcount()), path);
  return open_zip([&] { return open_file(path); }, path);
}

TorchSaveContents read_torch_save_bytes(const void* data, std::size_t size, const std::string& name) {
  refuse_legacy(static_cast<const unsigned char*>(data), size, name);
  return open_zip([&] { return open_bytes(data, size); }, name);
}

}  // namespace convnets
