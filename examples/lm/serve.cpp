// kiln-lm serve: an OpenAI-compatible HTTP server (cpp-httplib) over kiln's
// batched decoding. Up to --parallel requests are decoded together, one
// forward pass per step for all of them (serve_scheduler.h); more wait their
// turn. A client that disconnects frees its sequence at the next step.
//   kiln-lm serve --model DIR|FILE.gguf [--host 127.0.0.1] [--port 8080] [--parallel 4]
//                 [--ctx N] [--threads N] [--template NAME] [--precision f32|bf16]
// Endpoints: POST /v1/chat/completions, POST /v1/completions, GET /v1/models,
// GET /health (docs/serve.md). --port 0 picks a free port; the address is
// printed on stderr as "listening on http://HOST:PORT".
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "chat_setup.h"
#include "commands.h"
#include "kiln/error.h"
#include "lm_model.h"
#include "serve_api.h"
#include "serve_scheduler.h"

namespace lm {
namespace {

using serve::Json;

struct ServeOptions {
  std::string model, host = "127.0.0.1", template_name, precision = "f32";
  int port = 8080, threads = 0;
  int64_t parallel = 4, ctx = 0;
};

int64_t now_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void send_error(httplib::Response& res, int status, const std::string& message,
                const std::string& param = {}) {
  res.status = status;
  res.set_content(serve::error_body(status, message, param).dump(), "application/json");
}

class Api {
 public:
  Api(const ServeOptions& o, LoadedModel& m, std::optional<kiln::chat::ChatTemplate> tmpl,
      std::string template_error, std::vector<int64_t> end_ids, int64_t ctx)
      : m_(m),
        tmpl_(std::move(tmpl)),
        template_error_(std::move(template_error)),
        sched_(*m.model, *m.cpu, *m.tokenizer, o.parallel, ctx, std::move(end_ids)),
        name_(std::filesystem::path(o.model).filename().string()),
        // Sampling fields a request leaves out: generation_config.json's, else OpenAI's (1, 1).
        defaults_(kiln::models::default_sampling(m.model->config().generation, {})) {
    if (name_.empty()) name_ = std::filesystem::path(o.model).parent_path().filename().string();
  }

  void routes(httplib::Server& svr) {
    svr.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      const Json h = {{"status", "ok"},
                      {"requests_active", sched_.active()},
                      {"requests_waiting", sched_.waiting()}};
      res.set_content(h.dump(), "application/json");
    });
    svr.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      const Json list = {{"object", "list"},
                         {"data",
                          {{{"id", name_},
                            {"object", "model"},
                            {"created", now_seconds()},
                            {"owned_by", "kiln"}}}}};
      res.set_content(list.dump(), "application/json");
    });
    svr.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      complete(req, res, true);
    });
    svr.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      complete(req, res, false);
    });
  }

 private:
  void complete(const httplib::Request& req, httplib::Response& res, bool chat) {
    serve::Request q;
    std::vector<int32_t> ids;
    try {
      if (chat && !tmpl_) throw serve::RequestError(400, template_error_, "messages");
      q = serve::parse_request(req.body, chat, defaults_, tmpl_ ? &*tmpl_ : nullptr);
      ids = prompt_ids(q);
    } catch (const serve::RequestError& e) {
      send_error(res, e.status, e.what(), e.param);
      return;
    }
    auto job = std::make_shared<serve::Job>();
    job->id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id_++);
    job->prompt = ids;
    job->max_tokens = q.max_tokens.value_or(sched_.capacity());
    job->sampling = q.sampling;
    job->stop = q.stop;
    serve::Reply r;
    r.id = job->id;
    r.model = name_;
    r.created = now_seconds();
    r.prompt_tokens = int64_t(ids.size());
    sched_.submit(job);
    if (q.stream) stream(res, job, q, r);
    else whole(res, job, q, r);
  }

  std::vector<int32_t> prompt_ids(const serve::Request& q) const {
    const char* param = q.chat ? "messages" : "prompt";
    std::vector<int32_t> ids = q.prompt_ids;
    if (ids.empty()) ids = m_.tokenizer->encode(q.prompt, !q.chat);  // a chat template adds its own
    for (int32_t id : ids)
      if (id >= m_.model->vocab_size())
        throw serve::RequestError(400,
                                  "token id " + std::to_string(id) +
                                      " is outside the model's vocabulary of " +
                                      std::to_string(m_.model->vocab_size()),
                                  param);
    if (ids.empty()) throw serve::RequestError(400, "the prompt has no tokens", param);
    // The prompt and at least one new token must fit the context.
    if (int64_t(ids.size()) >= sched_.capacity())
      throw serve::RequestError(
          400,
          "the prompt is " + std::to_string(ids.size()) + " tokens, too long for the context of " +
              std::to_string(sched_.capacity()) + " tokens (prompt and reply); use --ctx for more",
          param);
    return ids;
  }

  // Waits for the job without a client that could be gone unnoticed: until it
  // is done, a space is sent every second (JSON allows leading whitespace),
  // and a failed write cancels the job.
  void whole(httplib::Response& res, std::shared_ptr<serve::Job> job, const serve::Request& q,
             const serve::Reply& r0) {
    res.set_chunked_content_provider(
        "application/json",
        [job, q, r0](size_t, httplib::DataSink& sink) {
          std::unique_lock<std::mutex> lock(job->mu);
          if (!job->cv.wait_for(lock, std::chrono::seconds(1), [&] { return job->finished; })) {
            lock.unlock();
            if (!sink.write(" ", 1)) return false;
            return true;
          }
          serve::Reply r = r0;
          r.completion_tokens = job->completion_tokens;
          r.cached_tokens = job->cached_tokens;
          const std::string body =
              job->error.empty() ? serve::whole_response(q, r, job->text, job->finish_reason).dump()
                                 : serve::error_body(500, job->error).dump();
          lock.unlock();
          if (!sink.write(body.data(), body.size())) return false;
          sink.done();
          return true;
        },
        [job](bool) { job->cancel(); });  // done or gone: the scheduler lets go of it
  }

  // Server-sent events: a chunk per piece of new text, the last chunk with the
  // finish reason, the usage when stream_options.include_usage, then [DONE].
  void stream(httplib::Response& res, std::shared_ptr<serve::Job> job, const serve::Request& q,
              const serve::Reply& r0) {
    struct State {
      size_t sent = 0;
      bool first = true;
    };
    auto st = std::make_shared<State>();
    res.set_chunked_content_provider(
        "text/event-stream",
        [job, q, r0, st](size_t, httplib::DataSink& sink) {
          std::unique_lock<std::mutex> lock(job->mu);
          job->cv.wait_for(lock, std::chrono::seconds(1),
                           [&] { return job->finished || job->text.size() > st->sent; });
          const std::string fresh = job->text.substr(st->sent);
          st->sent = job->text.size();
          const bool finished = job->finished;
          const std::string reason = job->finish_reason, error = job->error;
          serve::Reply r = r0;
          r.completion_tokens = job->completion_tokens;
          r.cached_tokens = job->cached_tokens;
          lock.unlock();
          auto event = [](const Json& j) { return "data: " + j.dump() + "\n\n"; };
          std::string out;
          if (!fresh.empty() || (st->first && q.chat)) {
            out += event(serve::stream_chunk(q, r, fresh, nullptr, st->first));
            st->first = false;
          }
          if (finished) {
            if (!error.empty()) {
              out += event(serve::error_body(500, error));
            } else {
              out += event(serve::stream_chunk(q, r, "", &reason, st->first));
              if (q.include_usage) {
                Json u = serve::stream_chunk(q, r, "", &reason, false);
                u["choices"] = Json::array();
                u["usage"] = serve::usage(r);
                out += event(u);
              }
            }
            out += "data: [DONE]\n\n";
          }
          if (out.empty()) out = ": waiting\n\n";  // an SSE comment: finds a client that left
          if (!sink.write(out.data(), out.size())) return false;
          if (finished) sink.done();
          return true;
        },
        [job](bool) { job->cancel(); });
  }

  LoadedModel& m_;
  std::optional<kiln::chat::ChatTemplate> tmpl_;
  std::string template_error_;
  serve::Scheduler sched_;
  std::string name_;
  kiln::models::SamplingConfig defaults_;
  std::atomic<uint64_t> next_id_{0};
};

int run(const ServeOptions& o) {
  std::unique_ptr<LoadedModel> m =
      load_model_with_precision(o.model, o.threads, o.ctx, "", o.precision);
  if (!m->tokenizer)
    kiln::fail("kiln-lm serve", o.model,
               " has no tokenizer (tokenizer.json, or GGUF tokenizer.ggml.* keys)");
  const int64_t ctx = o.ctx > 0 ? o.ctx : std::min<int64_t>(m->model->max_seq_len(), 4096);
  // A model without a chat template still serves /v1/completions.
  std::optional<kiln::chat::ChatTemplate> tmpl;
  std::string template_error;
  std::vector<int64_t> end_ids = m->model->config().generation.eos_token_ids;
  try {
    tmpl = load_chat_template(o.model, o.template_name);
    end_ids = reply_end_ids(*m->model, *m->tokenizer, *tmpl, "kiln-lm serve", o.model);
  } catch (const kiln::Error& e) {
    template_error = std::string("the model has no usable chat template: ") + e.what();
    std::fprintf(stderr, "kiln-lm serve: %s (only /v1/completions works)\n",
                 template_error.c_str());
    if (m->tokenizer->eos_id()) end_ids.push_back(*m->tokenizer->eos_id());
  }
  Api api(o, *m, std::move(tmpl), template_error, end_ids, ctx);

  std::signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is a failed write, not a signal
  httplib::Server svr;
  // Handler threads wait on their requests: enough for every sequence and the
  // requests queued behind them, plus the cheap endpoints.
  const size_t threads = size_t(std::max<int64_t>(8, 4 * o.parallel));
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  svr.set_payload_max_length(size_t(64) << 20);
  svr.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;  // the handler's own error
    const std::string what =
        res.status == 404 ? "no such endpoint: " + req.method + " " + req.path : "request failed";
    res.set_content(serve::error_body(res.status, what).dump(), "application/json");
  });
  svr.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "internal error";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {}
        send_error(res, 500, what);
      });
  api.routes(svr);
  int port = o.port;
  if (port == 0) port = svr.bind_to_any_port(o.host);
  else if (!svr.bind_to_port(o.host, port)) port = -1;
  if (port <= 0) kiln::fail("kiln-lm serve", "cannot listen on ", o.host, ":", o.port);
  std::fprintf(stderr,
               "kiln-lm serve: %s (load %.2f s), %lld sequences of %lld positions; listening on "
               "http://%s:%d\n",
               o.model.c_str(), m->load_seconds, (long long)o.parallel, (long long)ctx,
               o.host.c_str(), port);
  if (!svr.listen_after_bind()) kiln::fail("kiln-lm serve", "the server stopped");
  return 0;
}

}  // namespace

Command add_serve(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  CLI::App* s = app.add_subcommand("serve", "an OpenAI-compatible HTTP server (docs/serve.md)");
  s->add_option("--model", o->model, "a Hugging Face model directory or a .gguf file")->required();
  s->add_option("--host", o->host, "address to listen on (default 127.0.0.1: this machine only)");
  s->add_option("--port", o->port, "port (default 8080; 0: any free port)")
      ->check(CLI::Range(0, 65535));
  s->add_option("--parallel", o->parallel, "requests decoded together (default 4)")
      ->check(CLI::Range(int64_t(1), int64_t(256)));
  s->add_option("--ctx", o->ctx,
                "positions per sequence: prompt and reply (default: the model's context, at "
                "most 4096)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 40));
  s->add_option("--threads", o->threads, "CPU threads (default: all cores)")
      ->check(CLI::Range(0, 1024));
  s->add_option("--template", o->template_name,
                "which of a list of named chat templates (default: \"default\")");
  add_precision_option(s, o->precision);
  return {s, [o] { return run(*o); }};
}

}  // namespace lm
