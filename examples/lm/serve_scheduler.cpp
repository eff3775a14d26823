// kiln-lm serve's decoding loop (serve_scheduler.h).
#include "serve_scheduler.h"

#include <algorithm>
#include <cstdio>

#include "kiln/error.h"

namespace lm::serve {

void Job::cancel() {
  std::lock_guard<std::mutex> lock(mu);
  cancelled_ = true;
}

bool Job::cancelled() const {
  std::lock_guard<std::mutex> lock(mu);
  return cancelled_;
}

// A job that holds a sequence of the batch.
struct Scheduler::Active {
  std::shared_ptr<Job> job;
  int64_t seq = 0;
  std::unique_ptr<kiln::models::Sampler> sampler;
  std::unique_ptr<kiln::StreamDecoder> decoder;
  std::unique_ptr<kiln::models::StopStrings> stops;
  int64_t generated = 0;
  int32_t next = 0;  // the token the next step appends
};

namespace {

void finish(Job& job, const std::string& reason, const std::string& error = {}) {
  int64_t tokens = 0, cached = 0;
  {
    std::lock_guard<std::mutex> lock(job.mu);
    job.finished = true;
    job.finish_reason = reason;
    job.error = error;
    tokens = job.completion_tokens;
    cached = job.cached_tokens;
  }
  job.cv.notify_all();
  std::fprintf(stderr, "kiln-lm serve: %s: %zu prompt tokens (%lld cached), %lld new, %s%s%s\n",
               job.id.c_str(), job.prompt.size(), (long long)cached, (long long)tokens,
               reason.c_str(), error.empty() ? "" : ": ", error.c_str());
}

void append(Job& job, const std::string& text) {
  if (text.empty()) return;
  {
    std::lock_guard<std::mutex> lock(job.mu);
    job.text += text;
  }
  job.cv.notify_all();
}

}  // namespace

Scheduler::Scheduler(kiln::models::CausalLM& model, kiln::Backend& backend,
                     const kiln::Tokenizer& tok, int64_t parallel, int64_t ctx,
                     std::vector<int64_t> eos_ids)
    : batch_(model, backend, parallel, {.max_seq_len = ctx}), tok_(tok), eos_(std::move(eos_ids)) {
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
  for (auto& j : waiting_) finish(*j, "error", "the server is shutting down");
}

int64_t Scheduler::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return int64_t(waiting_.size());
}

void Scheduler::submit(std::shared_ptr<Job> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    waiting_.push_back(std::move(job));
  }
  cv_.notify_all();
}

bool Scheduler::take(Active& a, int32_t id) {
  Job& job = *a.job;
  ++a.generated;
  {
    std::lock_guard<std::mutex> lock(job.mu);
    job.completion_tokens = a.generated;
  }
  if (std::find(eos_.begin(), eos_.end(), int64_t(id)) != eos_.end()) {
    append(job, a.stops->feed(a.decoder->flush()) + a.stops->flush());
    finish(job, "stop");
    return true;
  }
  append(job, a.stops->feed(a.decoder->push(id)));
  if (a.stops->stopped()) {
    finish(job, "stop");
    return true;
  }
  // The token is appended by the next step: a full cache ends the reply too.
  if (a.generated >= job.max_tokens || batch_.position(a.seq) >= batch_.capacity()) {
    append(job, a.stops->feed(a.decoder->flush()) + a.stops->flush());
    finish(job, "length");
    return true;
  }
  a.next = id;
  return false;
}

void Scheduler::admit(std::vector<Active>& active) {
  while (int64_t(active.size()) < batch_.max_sequences()) {
    std::shared_ptr<Job> job;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (waiting_.empty()) return;
      job = std::move(waiting_.front());
      waiting_.pop_front();
    }
    if (job->cancelled()) {
      finish(*job, "cancelled");
      continue;
    }
    Active a;
    a.job = job;
    try {
      a.sampler = std::make_unique<kiln::models::Sampler>(job->sampling);
      a.sampler->set_prompt(job->prompt);
      a.decoder = std::make_unique<kiln::StreamDecoder>(tok_, true);
      a.stops = std::make_unique<kiln::models::StopStrings>(job->stop);
      a.seq = batch_.start(job->prompt, true);
      std::lock_guard<std::mutex> lock(job->mu);
      job->cached_tokens = batch_.reused_tokens(a.seq);
    } catch (const kiln::Error& e) {
      finish(*job, "error", e.what());
      continue;
    }
    int32_t id = 0;
    try {
      id = a.sampler->sample(batch_.logits(a.seq));
    } catch (const kiln::Error& e) {
      batch_.finish(a.seq);
      finish(*job, "error", e.what());
      continue;
    }
    if (take(a, id)) batch_.finish(a.seq);
    else active.push_back(std::move(a));
  }
}

void Scheduler::loop() {
  std::vector<Active> active;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !waiting_.empty() || !active.empty(); });
      if (stopping_) break;
    }
    // Clients that went away free their sequences before anything runs.
    std::erase_if(active, [&](Active& a) {
      if (!a.job->cancelled()) return false;
      batch_.finish(a.seq);
      finish(*a.job, "cancelled");
      return true;
    });
    admit(active);
    active_count_ = int64_t(active.size());
    if (active.empty()) continue;
    std::vector<kiln::models::BatchGenerator::Token> tokens;
    for (const Active& a : active) tokens.push_back({a.seq, a.next});
    try {
      batch_.step(tokens);
    } catch (const kiln::Error& e) {  // every active job fails, the server goes on
      std::fprintf(stderr, "kiln-lm serve: %s\n", e.what());
      for (Active& a : active) {
        batch_.finish(a.seq);
        finish(*a.job, "error", e.what());
      }
      active.clear();
      active_count_ = 0;
      continue;
    }
    std::erase_if(active, [&](Active& a) {
      bool done = false;
      try {
        done = take(a, a.sampler->sample(batch_.logits(a.seq)));
      } catch (const kiln::Error& e) {
        finish(*a.job, "error", e.what());
        done = true;
      }
      if (done) batch_.finish(a.seq);
      return done;
    });
    active_count_ = int64_t(active.size());
  }
  for (Active& a : active) finish(*a.job, "error", "the server is shutting down");
}

}  // namespace lm::serve
