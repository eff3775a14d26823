// A second chat turn prefills only its new tokens (docs/benchmarks.md): time to
// first token of turn 2, after turn 1's prompt and reply are in the KV cache
// (GenerateOptions::reuse_cache, what `kiln-lm chat` does), against a fresh
// single-turn request with the same new user text, on a random model shaped
// like SmolLM2-135M (bench/llama_shape.h). The token ids are made up; the
// counts follow a ChatML template (SmolLM2's, Qwen's):
//   turn 1  <|im_start|>system\n S <|im_end|>\n <|im_start|>user\n U <|im_end|>\n
//   <|im_start|>assistant\n reply   R tokens, then <|im_end|> (sampled, so never run) turn 2  turn
//   1 + reply + <|im_end|>\n <|im_start|>user\n N <|im_end|>\n <|im_start|>assistant\n single
//   <|im_start|>user\n N <|im_end|>\n <|im_start|>assistant\n
// Turn 2 runs 2 tokens more than the single request (the end of the reply:
// the reply's last token is sampled, never run) unless the chat has run them
// ahead, after the reply, as `kiln-lm chat` does (Generator::prefill_uncached
// with the conversation rendered without a generation prompt): each N is timed
// both ways (ahead=0, ahead=1).
//
//   bench_chat_turns [--threads 2] [--layers 30] [--system 24] [--user 16]
//                    [--reply 32] [--new 8,24,56,120] [--reps 5]
//
// Prints, for each new-text length N and way, the tokens each request runs, the time
// to first token of turn 2 and of the single request (the first run, which
// builds the pass graphs of a new shape, and the median of the others,
// interleaved), and their ratio; also the process's CPU time (both threads),
// the steadier figure on a loaded machine.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_args.h"
#include "kiln/kiln.h"
#include "llama_shape.h"

namespace {

using bench::arg;
using bench::sarg;
using Ids = std::vector<int32_t>;

// ChatML's marker tokens, as ids of the made-up vocabulary.
constexpr int32_t kStart = 1, kEnd = 2, kNewline = 198, kSystem = 9, kUser = 10, kAssistant = 11;

// `n` text tokens, different for each `seed`.
Ids text(int64_t n, int32_t seed) {
  Ids t;
  for (int64_t i = 0; i < n; ++i) t.push_back(int32_t(1000 + (seed * 7919 + i * 104729) % 40000));
  return t;
}

void append(Ids& to, const Ids& from) { to.insert(to.end(), from.begin(), from.end()); }

// <|im_start|>role\n text <|im_end|>\n
Ids message(int32_t role, const Ids& body) {
  Ids m{kStart, role, kNewline};
  append(m, body);
  append(m, {kEnd, kNewline});
  return m;
}

const Ids kGenerationPrompt{kStart, kAssistant, kNewline};

double seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

struct Ttft {
  double wall = 0, cpu = 0;  // seconds; cpu: the process's, all threads
};

// Time from generate() to the first token.
Ttft ttft(kiln::models::Generator& gen, const Ids& prompt, bool reuse,
          kiln::models::GenerationStats* stats = nullptr) {
  kiln::models::GenerateOptions o;
  o.max_new_tokens = 1;
  o.sampling.temperature = 0;
  o.ignore_eos = true;
  o.reuse_cache = reuse;
  const auto t0 = std::chrono::steady_clock::now();
  const std::clock_t c0 = std::clock();
  Ttft first;
  const kiln::models::GenerationResult r = gen.generate(prompt, o, [&](int32_t) {
    first.wall = seconds(std::chrono::steady_clock::now() - t0);
    first.cpu = double(std::clock() - c0) / CLOCKS_PER_SEC;
    return true;
  });
  if (stats) *stats = r.stats;
  return first;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

std::vector<int64_t> int_list(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(std::stoll(item));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = int(arg(argc, argv, "--threads", 2));
  const int64_t layers = arg(argc, argv, "--layers", 30), reps = arg(argc, argv, "--reps", 5);
  const int64_t system = arg(argc, argv, "--system", 24), user = arg(argc, argv, "--user", 16),
                reply = arg(argc, argv, "--reply", 32);
  const std::vector<int64_t> news = int_list(sarg(argc, argv, "--new", "8,24,56,120"));
  if (reps < 2 || reply < 1) {
    std::fprintf(stderr, "bench_chat_turns: --reps must be >= 2 and --reply >= 1\n");
    return 2;
  }

  kiln::Context ctx;
  kiln::CpuBackend cpu(threads);
  kiln::models::ModelOptions mo;
  mo.max_seq_len = 2048;
  auto model = kiln::models::make_model(ctx, bench::smollm2_135m_shape(layers), mo);
  model->allocate(cpu);
  model->init(1);
  kiln::models::Generator chat(*model, cpu), fresh(*model, cpu);

  // Turn 1 and its reply, as `kiln-lm chat` leaves them in the cache.
  Ids turn1 = message(kSystem, text(system, 1));
  append(turn1, message(kUser, text(user, 2)));
  append(turn1, kGenerationPrompt);
  kiln::models::GenerateOptions o;
  o.max_new_tokens = reply;
  o.sampling.temperature = 0;
  o.ignore_eos = true;
  const kiln::models::GenerationResult r1 = chat.generate(turn1, o);
  Ids history = turn1;
  append(history, Ids(r1.ids.begin(), r1.ids.end() - 1));  // the last stands for <|im_end|>
  const int64_t after_turn1 = chat.position();

  std::printf(
      "threads=%d layers=%lld turn1_tokens=%lld reply_tokens=%lld cached_after_turn1=%lld\n",
      threads, (long long)layers, (long long)turn1.size(), (long long)reply,
      (long long)after_turn1);
  Ids history_ended = history;  // and the end of the assistant's turn
  append(history_ended, {kEnd, kNewline});
  for (const int64_t n : news)
    for (const bool ahead : {false, true}) {
      const Ids body = text(n, int32_t(100 + n));
      Ids single = message(kUser, body);
      append(single, kGenerationPrompt);
      Ids turn2 = history_ended;
      append(turn2, single);

      std::vector<Ttft> t2, t1;
      kiln::models::GenerationStats s2, s1;
      for (int64_t k = 0; k < reps; ++k) {
        chat.truncate(after_turn1);  // back to the end of turn 1
        if (ahead) chat.prefill_uncached(history_ended);
        t2.push_back(ttft(chat, turn2, true, &s2));
        t1.push_back(ttft(fresh, single, false, &s1));
      }
      const double cold2 = t2.front().wall, cold1 = t1.front().wall;
      t2.erase(t2.begin());
      t1.erase(t1.begin());
      auto med = [](const std::vector<Ttft>& v, double Ttft::*f) {
        std::vector<double> x;
        for (const Ttft& t : v) x.push_back(t.*f);
        return median(x);
      };
      const double m2 = med(t2, &Ttft::wall), m1 = med(t1, &Ttft::wall);
      const double c2 = med(t2, &Ttft::cpu), c1 = med(t1, &Ttft::cpu);
      std::printf(
          "new_text=%lld ahead=%d turn2_run_tokens=%lld turn2_reused_tokens=%lld "
          "single_run_tokens=%lld ttft_turn2_ms=%.1f ttft_single_ms=%.1f ratio=%.3f "
          "cpu_turn2_ms=%.1f cpu_single_ms=%.1f cpu_ratio=%.3f first_run_turn2_ms=%.1f "
          "first_run_single_ms=%.1f\n",
          (long long)n, int(ahead), (long long)s2.prompt_tokens, (long long)s2.reused_tokens,
          (long long)s1.prompt_tokens, m2 * 1e3, m1 * 1e3, m2 / m1, c2 * 1e3, c1 * 1e3, c2 / c1,
          cold2 * 1e3, cold1 * 1e3);
    }
  return 0;
}
