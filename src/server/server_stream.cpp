// Server-sent-event streaming of /v1/completions and /v1/chat/completions, in vLLM's (and
// OpenAI's) shape: one `data: {json}` event per generated token, the last token's chunk with
// finish_reason, with stream_options.include_usage one more chunk with no choices and the
// usage, then `data: [DONE]`. The chunks are built by response_shapes.h from the same engine
// result as a whole answer, so concatenated they equal it; a chunk's text is what the tokens so
// far add to the whole text (TextDeltas), "" while a character is incomplete.
//
// The model runs inside httplib's content provider, on the connection's thread, one token at a
// time; a failed write (the client has gone) stops the generation at once instead of spending
// the model on tokens nobody reads. Everything a client can get wrong was checked before the
// stream started (a 4xx JSON answer); a failure after that is sent as an error event.
#include <httplib.h>

#include <ctime>
#include <memory>

#include "server/response_shapes.h"
#include "server/server.h"
#include "server/server_engine.h"

namespace phasekv {
namespace {

using json = nlohmann::json;

// A chunk as JSON; bytes that are not UTF-8 (none should reach here: the decoders write U+FFFD)
// become U+FFFD rather than ending the stream with an exception.
std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

// The events of one response: every chunk shares id, object, created and model.
class EventStream {
 public:
  EventStream(httplib::DataSink& sink, const char* prefix, const char* object,
              const std::string& model, bool include_usage)
      : sink_(sink), include_usage_(include_usage) {
    envelope_ = {{"id", response_id(prefix)},
                 {"object", object},
                 {"created", static_cast<int64_t>(std::time(nullptr))},
                 {"model", model}};
  }
  // One chunk with one choice; false once the client is gone.
  bool choice(json c) {
    json chunk = envelope_;
    chunk["choices"] = json::array({std::move(c)});
    if (include_usage_) chunk["usage"] = nullptr;  // as OpenAI: only the last chunk has usage
    return send(dump(chunk));
  }
  // The usage chunk when asked for, then [DONE].
  bool finish(int64_t prompt_tokens, int64_t completion_tokens) {
    if (include_usage_) {
      json chunk = envelope_;
      chunk["choices"] = json::array();
      chunk["usage"] = usage_json(prompt_tokens, completion_tokens);
      if (!send(dump(chunk))) return false;
    }
    return send("[DONE]");
  }
  bool error(const std::string& message) {
    return send(dump(error_body(500, "internal_server_error", message))) && send("[DONE]");
  }
  bool alive() const { return alive_; }

 private:
  bool send(const std::string& data) {
    const std::string event = "data: " + data + "\n\n";
    alive_ = alive_ && sink_.write(event.data(), event.size());
    return alive_;
  }
  httplib::DataSink& sink_;
  bool include_usage_;
  json envelope_;
  bool alive_ = true;
};

}  // namespace

// Runs `produce` (which writes the events) as the response body; logs a stream the client
// abandoned, which is how a disconnect shows up in --log-requests.
void CompletionServer::stream(httplib::Response& res,
                              std::function<bool(httplib::DataSink&)> produce) {
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream", [this, produce = std::move(produce)](size_t, httplib::DataSink& sink) {
        const bool complete = produce(sink);
        if (complete) sink.done();
        if (!complete) log_line("stream: the client went away; generation stopped");
        return complete;
      });
}

void CompletionServer::stream_completions(std::shared_ptr<const CompletionRequest> r,
                                          httplib::Response& res) {
  stream(res, [this, r](httplib::DataSink& sink) {
    EventStream events(sink, "cmpl", "text_completion", name_, r->include_usage);
    int64_t prompt_tokens = 0, completion_tokens = 0;
    for (size_t i = 0; i < r->prompts.size() && events.alive(); ++i) {
      const auto& prompt = r->prompts[i];
      const bool logprobs = r->logprobs.has_value();
      LogprobsBuilder lp(limits_, r->tokens_as_ids);
      TextDeltas deltas(completion_text, limits_);
      auto base = [&](std::string text, bool last) {
        return json{{"index", i},
                    {"text", std::move(text)},
                    {"logprobs", nullptr},
                    {"finish_reason", last ? json("length") : json(nullptr)},
                    {"stop_reason", nullptr}};
      };
      // With echo the prompt comes first, as one chunk (with its logprobs when asked).
      auto send_prompt = [&](const EngineResult& out) {
        json c = base(text_of(prompt, limits_), r->max_tokens == 0);
        if (logprobs) {
          for (size_t t = 0; t < prompt.size(); ++t) lp.add(prompt[t], &out.prompt.at(t));
          c["logprobs"] = lp.build();
        }
        if (r->return_token_ids) c["prompt_token_ids"] = prompt;
        return events.choice(std::move(c));
      };
      try {
        const EngineParams p =
            engine_params(*r, logprobs ? *r->logprobs : -1, r->echo && logprobs, i);
        const EngineResult out = engine_->run(prompt, p, [&](const EngineResult& so_far) {
          const size_t t = so_far.generated.size() - 1;
          if (t == 0 && r->echo && !send_prompt(so_far)) return false;
          const int32_t id = so_far.generated[t];
          const bool last = static_cast<int>(t) + 1 == r->max_tokens;
          json c = base(deltas.next(so_far.generated, last), last);
          if (logprobs) {
            const size_t from = lp.size();
            lp.add(id, &so_far.completion.at(t));
            c["logprobs"] = lp.build(from);
          }
          if (r->return_token_ids) c["token_ids"] = json::array({id});
          return events.choice(std::move(c));
        });
        if (r->echo && out.generated.empty()) send_prompt(out);  // max_tokens 0: the prompt only
        prompt_tokens += static_cast<int64_t>(prompt.size());
        completion_tokens += static_cast<int64_t>(out.generated.size());
      } catch (const std::exception& e) {
        events.error(e.what());
        return events.alive();
      }
    }
    return events.alive() && events.finish(prompt_tokens, completion_tokens);
  });
}

void CompletionServer::stream_chat(std::shared_ptr<const ChatRequest> r, httplib::Response& res) {
  stream(res, [this, r](httplib::DataSink& sink) {
    EventStream events(sink, "chatcmpl", "chat.completion.chunk", name_, r->include_usage);
    // OpenAI's first chunk names the role and carries no text.
    if (!events.choice({{"index", 0},
                        {"delta", {{"role", "assistant"}, {"content", ""}}},
                        {"logprobs", nullptr},
                        {"finish_reason", nullptr}}))
      return false;
    try {
      const EngineParams p = engine_params(*r, r->logprobs ? r->top_logprobs : -1, false, 0);
      TextDeltas deltas(text_of, limits_);
      const EngineResult out = engine_->run(r->prompt, p, [&](const EngineResult& so_far) {
        const size_t t = so_far.generated.size() - 1;
        const int32_t id = so_far.generated[t];
        const bool last = static_cast<int>(t) + 1 == r->max_tokens;
        json c = {{"index", 0},
                  {"delta", {{"content", deltas.next(so_far.generated, last)}}},
                  {"logprobs", nullptr},
                  {"finish_reason", last ? json("length") : json(nullptr)}};
        if (r->logprobs)
          c["logprobs"] = {
              {"content", json::array({chat_logprob(id, so_far.completion.at(t), r->top_logprobs,
                                                    r->tokens_as_ids, limits_)})}};
        if (r->return_token_ids) c["token_ids"] = json::array({id});
        return events.choice(std::move(c));
      });
      return events.alive() && events.finish(static_cast<int64_t>(r->prompt.size()),
                                             static_cast<int64_t>(out.generated.size()));
    } catch (const std::exception& e) {
      events.error(e.what());
      return events.alive();
    }
  });
}

}  // namespace phasekv
