// kiln-lm serve's decoding loop: one thread drives a BatchGenerator
// (kiln/generate.h) over every admitted request. HTTP handler threads submit
// a Job and wait on it (or stream its text as it grows); the loop admits
// waiting jobs between steps while sequences are free, runs one batched pass
// per step for all active jobs, samples each one's next token with its own
// Sampler, and retires a job at its end (eos, stop string, max tokens, a full
// cache) or when its client went away (Job::cancel), freeing its sequence. A
// prompt that continues a finished request's tokens reuses their cache
// (BatchGenerator::start's reuse_prefix) and runs only the rest.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kiln/generate.h"
#include "kiln/tokenizer.h"

namespace lm::serve {

// One request's generation: what to run (set before submit) and its output
// (guarded by `mu`, signalled on `cv`).
struct Job {
  std::string id;  // names the request in the server's log
  std::vector<int32_t> prompt;
  int64_t max_tokens = 0;  // new tokens at most
  kiln::models::SamplingConfig sampling;
  std::vector<std::string> stop;

  mutable std::mutex mu;
  std::condition_variable cv;
  std::string text;  // generated text so far (stop strings never in it)
  bool finished = false;
  std::string finish_reason;  // "stop", "length" (or "cancelled", "error")
  std::string error;          // set when generation failed (finished too)
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens taken from a finished request's cache

  // The client went away: the loop frees the job's sequence at its next step.
  void cancel();
  bool cancelled() const;

 private:
  friend class Scheduler;
  bool cancelled_ = false;  // under mu
};

class Scheduler {
 public:
  // `eos_ids` end every reply (the model's, the tokenizer's, the template's end of turn).
  Scheduler(kiln::models::CausalLM& model, kiln::Backend& backend, const kiln::Tokenizer& tok,
            int64_t parallel, int64_t ctx, std::vector<int64_t> eos_ids);
  ~Scheduler();  // stops the loop; unfinished jobs finish with an error
  void submit(std::shared_ptr<Job> job);
  int64_t capacity() const { return batch_.capacity(); }  // positions per sequence
  // Requests being decoded, and those waiting for a free sequence.
  int64_t active() const { return active_count_; }
  int64_t waiting() const;

 private:
  struct Active;
  void loop();
  void admit(std::vector<Active>& active);
  // Takes the token sampled for `a`; true when the job is finished.
  bool take(Active& a, int32_t id);

  kiln::models::BatchGenerator batch_;
  const kiln::Tokenizer& tok_;
  std::vector<int64_t> eos_;
  std::atomic<int64_t> active_count_{0};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> waiting_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace lm::serve
