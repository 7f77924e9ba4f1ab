#include "backend/http_text_task.h"

#include <algorithm>
#include <map>
#include <set>

#include "util/error.h"
#include "util/rng.h"

namespace phasekv {
namespace {

using json = nlohmann::json;

const std::vector<std::string> kSentences = {
    " The grass is green.",       " The sky is blue.",
    " The sun is yellow.",        " Here we go.",
    " There and back again.",     " The river flows to the sea.",
    " A bird sings in the tree.", " The road winds over the hill."};
// Starts with a newline so that no padding token can merge into its first word.
const std::string kIntro = "\nRemember the value of each key.";
const std::string kRecordKey = "\nkey";
const std::string kRecordMid = " -> value";
const std::string kRecordEnd = ".";
const std::string kQuestion = "\n\nQuestion: what is the value of key";
const std::string kAnswer = "?\nAnswer: key";
// Chat: a leading space instead of the newline, which a template's "user\n" would merge with
// ("\n\n" is one token in many vocabularies); the question asks for the value alone.
const std::string kChatIntro = " Remember the value of each key.";
const std::string kChatAsk = "? Answer with the value only.";
// Padding candidates, most tokenizers keep the first ones as one token per copy.
const std::vector<std::string> kPadCandidates = {" the", " .", " -", " =", " x", "\n"};

std::vector<int32_t> repeat(int32_t t, int n) {
  return std::vector<int32_t>(static_cast<size_t>(n), t);
}

bool is_blank(const std::string& s) {
  return s.find_first_not_of(" \t\r\n") == std::string::npos;
}

void append(std::vector<int32_t>& out, const std::vector<int32_t>& ids) {
  out.insert(out.end(), ids.begin(), ids.end());
}

}  // namespace

// One target record of an example and the question that asks for it.
struct TextKvTask::Needle {
  int target_start = 0;        // body offset where the record begins ("\nkey")
  int target_len = 0;          // its tokens
  double depth = 0;            // target_start / the body's other tokens
  int key_off = 0;             // body offset of the key's first non-blank token
  int value_off = 0;           // and of the value's
  std::vector<int32_t> query;  // ends right before the value's first non-blank token
  int32_t target = 0;
  std::vector<int32_t> answer;
  std::string answer_text;
};

struct TextKvTask::Example {
  int64_t id = 0;
  std::vector<int32_t> body;    // intro, filler and records
  bool filler_repeats = false;  // more sentences than the corpus has: it wrapped around
  std::vector<Needle> needles;  // needle 0 first
};

TextKvTask::TextKvTask(TextTokenizerFns tokenizer, TextTaskOptions options)
    : tok_(std::move(tokenizer)), o_(options) {
  if (o_.records < 1 || o_.records > 90)
    throw Error("--records is " + std::to_string(o_.records) + " (allowed: 1..90)");
  if (o_.modulus < 1) throw Error("--modulus must be >= 1");
  if (o_.context_tokens < 16) throw Error("--context-tokens must be >= 16");
  if (o_.needles < 1 || o_.needles > o_.records)
    throw Error("--needles is " + std::to_string(o_.needles) + " (allowed: 1..--records = " +
                std::to_string(o_.records) + ")");
  if (o_.chat) {
    bos_ = o_.chat_prefix;  // the template writes its own BOS
  } else {
    detect_bos();
  }
  pick_padding();
}

void TextKvTask::detect_bos() {
  // The server's special prefix: tokenize with and without special tokens.
  const auto both = tok_.tokenize({"Hello world", "Hello world"}, true);
  const auto plain = tok_.tokenize({"Hello world"}, false).front();
  const auto& with = both.front();
  if (with.size() > plain.size() && std::equal(plain.rbegin(), plain.rend(), with.rbegin()))
    bos_.assign(with.begin(), with.end() - static_cast<long>(plain.size()));
}

void TextKvTask::pick_padding() {
  // A padding token whose copies tokenize to as many tokens (so k copies shift by exactly k).
  std::vector<std::string> probes;
  for (const auto& c : kPadCandidates) {
    probes.push_back(c);
    std::string many;
    for (int i = 0; i < std::max(2, o_.modulus); ++i) many += c;
    probes.push_back(many);
  }
  const auto got = tok_.tokenize(probes, false);
  for (size_t i = 0; i < kPadCandidates.size(); ++i) {
    const auto& one = got[2 * i];
    if (one.size() == 1 && got[2 * i + 1] == repeat(one[0], std::max(2, o_.modulus))) {
      pad_ = one[0];
      pad_text_ = kPadCandidates[i];
      break;
    }
  }
  if (pad_ < 0)
    throw Error(
        "the server's tokenizer splits or merges every padding candidate (' the', ' .', "
        "' -', ' =', ' x', newline), so phases cannot be shifted by whole tokens");
}

std::vector<int32_t> TextKvTask::ids(const std::string& text) {
  auto it = cache_.find(text);
  if (it == cache_.end()) it = cache_.emplace(text, tok_.tokenize({text}, false).front()).first;
  return it->second;
}

TextKvTask::Example TextKvTask::make_example(int64_t id) {
  // Each example its own stream (util/rng.h): examples are independent, as the cluster bootstrap
  // over examples assumes.
  Rng rng(seed_for(o_.seed, static_cast<uint64_t>(id)));
  // Keys: distinct 4-digit numbers. Values: distinct leading digit (<= 9 records) or leading two
  // digits, so that their first tokens differ under digit-splitting tokenizers too.
  std::set<int> keys, leads;
  std::vector<int> key_list, value_list;
  while (static_cast<int>(key_list.size()) < o_.records) {
    const int k = 1000 + draw_below(rng, 9000);
    if (keys.insert(k).second) key_list.push_back(k);
  }
  const bool one_digit = o_.records <= 9;
  while (static_cast<int>(value_list.size()) < o_.records) {
    const int v = 1000 + draw_below(rng, 9000);
    if (leads.insert(one_digit ? v / 1000 : v / 100).second) value_list.push_back(v);
  }
  const int target = draw_below(rng, o_.records);
  const std::vector<std::string>& filler = o_.filler.empty() ? kSentences : o_.filler;
  const int first_sentence = draw_below(rng, static_cast<int>(filler.size()));

  // Tokenize this example's pieces in one batch (the fixed ones are cached).
  std::vector<std::string> texts;
  auto spaced = [](int n) {
    std::string s(1, ' ');
    s += std::to_string(n);
    return s;
  };
  for (int i = 0; i < o_.records; ++i) {
    texts.push_back(spaced(key_list[i]));
    texts.push_back(spaced(value_list[i]));
  }
  std::vector<std::string> missing;
  for (const auto& t : texts)
    if (!cache_.count(t)) missing.push_back(t);
  if (!missing.empty()) {
    const auto got = tok_.tokenize(missing, false);
    for (size_t i = 0; i < missing.size(); ++i) cache_[missing[i]] = got[i];
  }
  auto first_nonblank = [&](const std::vector<int32_t>& piece) {
    std::vector<std::vector<int32_t>> singles;
    for (int32_t t : piece) singles.push_back({t});
    const auto text = tok_.detokenize(singles);
    for (size_t i = 0; i < text.size(); ++i)
      if (!is_blank(text[i])) return static_cast<int>(i);
    throw Error("the server tokenizes a number into blank tokens only");
  };

  Example ex;
  ex.id = id;
  append(ex.body, ids(o_.chat ? kChatIntro : kIntro));
  // Filler sentences up to the budget, records at random sentence boundaries.
  int record_tokens = 0;
  for (int i = 0; i < o_.records; ++i)
    record_tokens += static_cast<int>(ids(kRecordKey).size() + ids(texts[2 * i]).size() +
                                      ids(kRecordMid).size() + ids(texts[2 * i + 1]).size() +
                                      ids(kRecordEnd).size());
  std::vector<std::vector<int32_t>> sentences;
  int length = static_cast<int>(ex.body.size()) + record_tokens;
  for (int s = 0; length < o_.context_tokens || static_cast<int>(sentences.size()) < 1; ++s) {
    const size_t at = (first_sentence + s) % filler.size();
    sentences.push_back(o_.filler_ids.empty() ? ids(filler[at]) : o_.filler_ids[at]);
    length += static_cast<int>(sentences.back().size());
  }
  // Only a corpus's wrap is news: the eight built-in sentences repeat by design.
  ex.filler_repeats = !o_.filler.empty() && sentences.size() > filler.size();
  std::vector<int> slots;  // sentence boundaries, sorted; record r goes to the r-th
  for (int i = 0; i < o_.records; ++i)
    slots.push_back(draw_below(rng, static_cast<int>(sentences.size()) + 1));
  std::sort(slots.begin(), slots.end());
  // More needles are drawn after everything else, so needle 0's document is the single-needle one.
  std::vector<int> targets = {target};
  while (static_cast<int>(targets.size()) < o_.needles) {
    const int t = draw_below(rng, o_.records);
    if (std::find(targets.begin(), targets.end(), t) == targets.end()) targets.push_back(t);
  }
  std::vector<Needle> needles(targets.size());
  auto needle_of = [&](size_t r) -> Needle* {
    const auto it = std::find(targets.begin(), targets.end(), static_cast<int>(r));
    return it == targets.end() ? nullptr : &needles[static_cast<size_t>(it - targets.begin())];
  };
  std::vector<std::pair<int, int>> placed;  // (boundary, record) in body order
  for (int i = 0; i < o_.records; ++i) placed.push_back({slots[static_cast<size_t>(i)], i});
  if (o_.depth >= 0) {  // the boundary whose filler before it is nearest depth x all filler
    std::vector<int64_t> before = {0};
    for (const auto& sentence : sentences)
      before.push_back(before.back() + static_cast<int64_t>(sentence.size()));
    const double want = o_.depth * static_cast<double>(before.back());
    int best = 0;
    for (int b = 1; b < static_cast<int>(before.size()); ++b)
      if (std::abs(static_cast<double>(before[static_cast<size_t>(b)]) - want) <
          std::abs(static_cast<double>(before[static_cast<size_t>(best)]) - want))
        best = b;
    placed[static_cast<size_t>(target)].first = best;
    // At a shared boundary the target goes first in the first half of the document and last in
    // the second, so depth 0 and 100 are the document's two ends.
    const bool early = o_.depth < 0.5;
    auto order = [&](const std::pair<int, int>& p) {
      return std::pair{p.first, p.second == target ? (early ? 0 : 2) : 1};
    };
    std::stable_sort(placed.begin(), placed.end(),
                     [&](const auto& a, const auto& b) { return order(a) < order(b); });
  }
  size_t p = 0;
  for (size_t s = 0; s <= sentences.size(); ++s) {
    for (; p < placed.size() && placed[p].first == static_cast<int>(s); ++p) {
      const size_t r = static_cast<size_t>(placed[p].second);
      const auto& key = ids(texts[2 * r]);
      const auto& value = ids(texts[2 * r + 1]);
      Needle* n = needle_of(r);
      if (n) n->target_start = static_cast<int>(ex.body.size());
      append(ex.body, ids(kRecordKey));
      if (n) n->key_off = static_cast<int>(ex.body.size()) + first_nonblank(key);
      append(ex.body, key);
      append(ex.body, ids(kRecordMid));
      if (n) n->value_off = static_cast<int>(ex.body.size()) + first_nonblank(value);
      append(ex.body, value);
      append(ex.body, ids(kRecordEnd));
      if (n) n->target_len = static_cast<int>(ex.body.size()) - n->target_start;
    }
    if (s < sentences.size()) append(ex.body, sentences[s]);
  }
  for (size_t j = 0; j < targets.size(); ++j) {
    Needle& n = needles[j];
    const size_t t = static_cast<size_t>(targets[j]);
    // As NIAH measures it: the share of the document (all but the target record) before it.
    n.depth = static_cast<double>(n.target_start) /
              static_cast<double>(
                  std::max<size_t>(1, ex.body.size() - static_cast<size_t>(n.target_len)));
    const auto& key = ids(texts[2 * t]);
    n.answer_text = std::to_string(value_list[t]);
    if (o_.chat) {  // the assistant's answer starts a turn: the digits without a space
      append(n.query, ids(kQuestion));
      append(n.query, key);
      append(n.query, ids(kChatAsk));
      n.answer = ids(n.answer_text);
      n.target = n.answer.front();
      continue;
    }
    const auto& value = ids(texts[2 * t + 1]);
    const int lead = first_nonblank(value);
    append(n.query, ids(kQuestion));
    append(n.query, key);
    append(n.query, ids(kAnswer));
    append(n.query, key);
    append(n.query, ids(kRecordMid));
    n.query.insert(n.query.end(), value.begin(), value.begin() + lead);
    n.target = value[static_cast<size_t>(lead)];
    n.answer.assign(value.begin() + lead, value.end());
  }
  ex.needles = std::move(needles);
  return ex;
}

TextKvTask::Shape TextKvTask::shape(int64_t example_id, int needle) {
  const Example ex = make_example(example_id);
  const Needle& n = ex.needles.at(static_cast<size_t>(needle));
  return {static_cast<int>(bos_.size() + ex.body.size() + n.query.size() + o_.chat_suffix.size()) +
              o_.modulus - 1,
          static_cast<int>(n.answer.size()), ex.filler_repeats};
}

std::vector<TextItem> TextKvTask::build(const std::vector<std::pair<int64_t, int>>& pairs,
                                        int needle) {
  if (needle < 0 || needle >= o_.needles)
    throw Error("internal: needle " + std::to_string(needle) + " outside [0, " +
                std::to_string(o_.needles) + ")");
  std::vector<TextItem> items;
  std::map<int64_t, Example> examples;
  const int M = o_.modulus;
  const int nbos = static_cast<int>(bos_.size());
  for (const auto& [id, phase] : pairs) {
    if (phase < 0 || phase >= M)
      throw Error("phase " + std::to_string(phase) + " outside [0, " + std::to_string(M) + ")");
    auto it = examples.find(id);
    if (it == examples.end()) it = examples.emplace(id, make_example(id)).first;
    const Example& ex = it->second;
    const Needle& n = ex.needles[static_cast<size_t>(needle)];
    // k pads before the key: (nbos + key_off + k) mod M == phase, for both padding modes.
    const int k = (((phase - nbos - n.key_off) % M) + M) % M;
    TextItem item;
    item.example_id = id;
    item.phase = phase;
    item.needle = needle;
    auto& t = item.tokens;
    append(t, bos_);
    const auto split = o_.padding == PaddingMode::kPrefix ? 0 : n.target_start;
    t.insert(t.end(), ex.body.begin(), ex.body.begin() + split);
    append(t, repeat(pad_, k));
    t.insert(t.end(), ex.body.begin() + split, ex.body.end());
    append(t, repeat(pad_, M - 1 - k));
    append(t, n.query);
    if (o_.chat) append(t, o_.chat_suffix);
    item.key_pos = nbos + k + n.key_off;
    item.value_pos = nbos + k + n.value_off;
    item.query_pos = static_cast<int>(t.size()) - 1;
    item.target = n.target;
    item.answer = n.answer;
    item.answer_text = n.answer_text;
    item.depth = n.depth;
    item.filler_repeats = ex.filler_repeats;
    if (item.key_pos % M != phase)
      throw Error("internal: text task layout does not put the key at its phase");
    items.push_back(std::move(item));
  }
  return items;
}

std::vector<TextCheck> TextKvTask::verify(const std::vector<TextItem>& items) {
  const size_t nbos = bos_.size();
  const auto nsuffix = static_cast<long>(o_.chat ? o_.chat_suffix.size() : 0);
  std::vector<std::vector<int32_t>> texts;  // per item: the message, the part before the key
  for (const auto& it : items) {
    texts.emplace_back(it.tokens.begin() + static_cast<long>(nbos), it.tokens.end() - nsuffix);
    texts.emplace_back(it.tokens.begin() + static_cast<long>(nbos), it.tokens.begin() + it.key_pos);
  }
  const auto strings = tok_.detokenize(texts);
  const auto retok = tok_.tokenize(strings, false);
  std::vector<TextCheck> out;
  for (size_t i = 0; i < items.size(); ++i) {
    const auto& planned = texts[2 * i];
    const auto& whole = retok[2 * i];
    const size_t key = static_cast<size_t>(items[i].key_pos) - nbos;
    TextCheck c;
    c.identical = whole == planned;
    c.planned_key_pos = items[i].key_pos;
    const bool same_through_key =
        whole.size() > key &&
        std::equal(planned.begin(), planned.begin() + static_cast<long>(key) + 1, whole.begin());
    c.measured_key_pos =
        same_through_key ? items[i].key_pos : static_cast<int>(nbos + retok[2 * i + 1].size());
    out.push_back(c);
  }
  return out;
}

json TextKvTask::describe() const {
  json d = {{"render", "text"},
            {"n_records", o_.records},
            {"context_len", o_.context_tokens},
            {"padding", to_string(o_.padding)},
            {"padding_token", pad_},
            {"padding_text", pad_text_},
            {"bos", bos_},
            {"record_format", "\\nkey K -> value V."},
            {"question",
             o_.chat ? "\\n\\nQuestion: what is the value of key K? Answer with the value only."
                     : "\\n\\nQuestion: what is the value of key K?\\nAnswer: key K -> value"}};
  if (o_.needles > 1) d["needles"] = o_.needles;
  if (o_.chat) {
    d["chat"] = true;
    d["chat_template_prefix_tokens"] = o_.chat_prefix.size();
    d["chat_template_suffix_tokens"] = o_.chat_suffix.size();
    d["answer"] = "the assistant's message, its value read as the first number after any reasoning";
  }
  return d;
}

}  // namespace phasekv
