#include "io/sentencepiece_bpe.h"

#include <cstdio>
#include <functional>
#include <queue>

#include "util/error.h"
#include "util/utf8.h"

namespace phasekv {
namespace {

using nlohmann::json;

const std::string kSpace = "\xE2\x96\x81";        // U+2581, sentencepiece's space symbol
const std::string kReplacement = "\xEF\xBF\xBD";  // U+FFFD

SentencePieceBpe::Type parse_type(const json& t, const std::string& where, size_t id) {
  static const std::pair<const char*, SentencePieceBpe::Type> kTypes[] = {
      {"normal", SentencePieceBpe::Type::kNormal},   {"unknown", SentencePieceBpe::Type::kUnknown},
      {"control", SentencePieceBpe::Type::kControl}, {"unused", SentencePieceBpe::Type::kUnused},
      {"byte", SentencePieceBpe::Type::kByte}};
  if (t.is_string())
    for (const auto& [name, type] : kTypes)
      if (t.get<std::string>() == name) return type;
  throw Error(where + ": pieces[" + std::to_string(id) + "] has type " + t.dump() +
              " (allowed: normal, unknown, control, unused, byte)");
}

// One option of tokenizer.json's "options" that must have the value this reader implements.
void require_option(const json& options, const char* key, const json& want,
                    const std::string& where) {
  if (!options.contains(key) || options[key] != want)
    throw Error(where + ": options." + key + " is " +
                (options.contains(key) ? options[key].dump() : std::string("missing")) +
                " (allowed: " + want.dump() + ", the settings of `phasekv tokenizer train`)");
}

}  // namespace

SentencePieceBpe SentencePieceBpe::from_json(const json& j, const std::string& where) {
  if (!j.is_object() || j.value("type", "") != "sentencepiece")
    throw Error(where + ": not a sentencepiece tokenizer (allowed: {\"type\": \"sentencepiece\", "
                        "...}, written by `phasekv tokenizer train`)");
  if (!j.contains("pieces"))
    throw Error(where + ": no \"pieces\": the vocabulary is exported by `phasekv tokenizer "
                        "train` since phasekv reads it in process; train the tokenizer again");
  const json options = j.value("options", json::object());
  require_option(options, "model_type", "bpe", where);
  require_option(options, "normalization", "identity", where);
  require_option(options, "byte_fallback", true, where);
  require_option(options, "add_dummy_prefix", false, where);
  require_option(options, "remove_extra_whitespaces", false, where);
  const json& pieces = j["pieces"];
  if (!pieces.is_array() || pieces.empty())
    throw Error(where + ": \"pieces\" must be a non-empty array of [piece, score, type]");
  SentencePieceBpe t;
  t.unk_surface_ = options.value("unk_surface", std::string(" \xE2\x81\x87 "));
  for (int& id : t.byte_ids_) id = -1;
  for (size_t id = 0; id < pieces.size(); ++id) {
    const json& p = pieces[id];
    if (!p.is_array() || p.size() != 3 || !p[0].is_string() || p[0].get<std::string>().empty() ||
        !p[1].is_number())
      throw Error(where + ": pieces[" + std::to_string(id) + "] is " + p.dump() +
                  " (allowed: [non-empty piece, score, type])");
    const std::string piece = p[0].get<std::string>();
    const Type type = parse_type(p[2], where, id);
    t.pieces_.push_back(piece);
    t.scores_.push_back(p[1].get<float>());
    t.types_.push_back(type);
    const auto i32 = static_cast<int32_t>(id);
    if (type == Type::kNormal || type == Type::kUnused) {
      if (!t.mergeable_.emplace(piece, i32).second)
        throw Error(where + ": pieces[" + std::to_string(id) + "] '" + piece + "' is a duplicate");
    } else if (type == Type::kUnknown) {
      t.unk_id_ = i32;
    } else if (type == Type::kByte) {
      unsigned value = 0;
      if (piece.size() != 6 || std::sscanf(piece.c_str(), "<0x%2X>", &value) != 1)
        throw Error(where + ": pieces[" + std::to_string(id) + "] '" + piece +
                    "' is a byte piece but not <0xXX>");
      t.byte_ids_[value] = i32;
    }
  }
  if (t.unk_id_ < 0) throw Error(where + ": no piece of type \"unknown\"");
  for (int b = 0; b < 256; ++b)
    if (t.byte_ids_[b] < 0)
      throw Error(where + ": byte fallback without a piece for byte " + std::to_string(b));
  return t;
}

std::vector<int32_t> SentencePieceBpe::encode(const std::string& text) const {
  // Normalise: ' ' -> U+2581, each invalid byte -> U+FFFD; one symbol per character.
  struct Symbol {
    int prev, next;
    size_t at, len;  // the symbol's bytes in norm; len 0 once merged into its left neighbour
  };
  std::string norm;
  std::vector<Symbol> sym;
  for (size_t i = 0; i < text.size();) {
    const size_t n = utf8_char_len(text, i);
    const size_t at = norm.size();
    if (n == 0)
      norm += kReplacement, ++i;
    else if (text[i] == ' ')
      norm += kSpace, ++i;
    else
      norm.append(text, i, n), i += n;
    const int k = static_cast<int>(sym.size());
    sym.push_back({k - 1, k + 1, at, norm.size() - at});
  }
  if (!sym.empty()) sym.back().next = -1;
  struct Pair {
    float score;
    int left, right;
    size_t len;  // the merged length when pushed: a pair whose symbols changed since is stale
  };
  // Highest score first; equal scores: the leftmost pair.
  const auto worse = [](const Pair& a, const Pair& b) {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  };
  std::priority_queue<Pair, std::vector<Pair>, decltype(worse)> agenda(worse);
  // Unused pieces merge like normal ones and are split back into their two parts at the end.
  std::unordered_map<std::string, std::pair<std::string, std::string>> unmerge;
  const std::string_view view(norm);
  const auto consider = [&](int l, int r) {
    if (l < 0 || r < 0) return;
    const size_t len = sym[l].len + sym[r].len;
    const auto it = mergeable_.find(view.substr(sym[l].at, len));
    if (it == mergeable_.end()) return;
    agenda.push({scores_[it->second], l, r, len});
    if (types_[it->second] == Type::kUnused)
      unmerge[it->first] = {norm.substr(sym[l].at, sym[l].len), norm.substr(sym[r].at, sym[r].len)};
  };
  for (size_t i = 1; i < sym.size(); ++i) consider(static_cast<int>(i) - 1, static_cast<int>(i));
  while (!agenda.empty()) {
    const Pair p = agenda.top();
    agenda.pop();
    Symbol &l = sym[p.left], &r = sym[p.right];
    if (l.len == 0 || r.len == 0 || l.len + r.len != p.len) continue;
    l.len += r.len;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = p.left;
    r.len = 0;
    consider(l.prev, p.left);
    consider(p.left, l.next);
  }
  std::vector<int32_t> ids;
  std::function<void(const std::string&)> emit = [&](const std::string& piece) {
    const auto it = mergeable_.find(piece);
    if (it == mergeable_.end()) {  // not a piece: its bytes (byte fallback)
      for (unsigned char c : piece) ids.push_back(byte_ids_[c]);
    } else if (types_[it->second] == Type::kUnused && unmerge.count(piece)) {
      const auto parts = unmerge.at(piece);
      emit(parts.first);
      emit(parts.second);
    } else {  // a normal piece, or an unused one that no merge made (kept, as libsentencepiece)
      ids.push_back(it->second);
    }
  };
  for (int i = sym.empty() ? -1 : 0; i >= 0; i = sym[i].next) emit(norm.substr(sym[i].at, sym[i].len));
  return ids;
}

std::string SentencePieceBpe::decode(const std::vector<int32_t>& ids) const {
  std::string text, bytes;
  const auto flush_bytes = [&] {  // a run of byte pieces: valid characters, else U+FFFD a byte
    for (size_t i = 0; i < bytes.size();) {
      const size_t n = utf8_char_len(bytes, i);
      if (n == 0)
        text += kReplacement, ++i;
      else
        text.append(bytes, i, n), i += n;
    }
    bytes.clear();
  };
  for (int32_t id : ids) {
    if (id < 0 || id >= size())
      throw Error("token id " + std::to_string(id) + " is outside the vocabulary (allowed: 0 to " +
                  std::to_string(size() - 1) + ")");
    const Type type = types_[static_cast<size_t>(id)];
    if (type == Type::kByte) {
      unsigned value = 0;
      std::sscanf(piece(id).c_str(), "<0x%2X>", &value);
      bytes.push_back(static_cast<char>(value));
      continue;
    }
    flush_bytes();
    if (type == Type::kControl) continue;
    if (type == Type::kUnknown) {
      text += unk_surface_;
      continue;
    }
    const std::string& p = piece(id);
    for (size_t i = 0; i < p.size();) {
      if (p.compare(i, kSpace.size(), kSpace) == 0)
        text += ' ', i += kSpace.size();
      else
        text += p[i++];
    }
  }
  flush_bytes();
  return text;
}

}  // namespace phasekv
