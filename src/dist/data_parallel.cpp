// DataParallel: gradient averaging in buckets, overlapped with the backward
// pass (the design of PyTorch DDP and Horovod; docs/distributed.md).
//
// OptContext places the gradients one after the other in backward order, so a
// bucket (consecutive gradients, about bucket_bytes) is one contiguous range of
// floats reduced in place by one MPI_Iallreduce. The context pauses the backward
// pass at bucket boundaries and calls grads_ready(); the bucket's allreduce
// starts then, and a communication thread keeps calling MPI_Test on the
// requests in flight (MPI moves data only inside MPI calls) while the training
// thread computes the rest of the backward pass. finish_grads() waits for the
// last bucket, with the communicator's timeout as a watchdog.
#include <condition_variable>
#include <cstring>
#include <thread>

#include "dist/comm_impl.h"
#include "kiln/backend.h"
#include "kiln/ext/tensor_node.h"

namespace kiln::dist {

namespace {

struct Bucket {
  size_t first = 0, last = 0;  // gradients [first, last) in backward order
  float* data = nullptr;       // the range reduced: the gradients' memory, or `fusion`
  size_t count = 0;
  bool packed = false;  // not contiguous host memory: copied through `fusion`
  std::vector<float> fusion;
  Request req = kNoRequest;
  bool finished = false;
};

}  // namespace

struct DataParallel::Impl {
  Communicator& comm;
  Communicator::Impl& ci;
  DataParallelOptions o;
  std::vector<Tensor> grads;
  std::vector<Bucket> buckets;
  bool attached = false;
  bool use_thread = false;
  DataParallelStats stats;

  // One step's progress. `ready`: buckets whose gradients are final (set by the
  // training thread); `started`, `finished`: set by whoever drives MPI.
  std::mutex m;
  std::condition_variable cv_work, cv_done;
  size_t ready = 0, started = 0, finished = 0;
  bool stop = false;
  Clock::time_point t_first, t_last;
  std::thread thread;

  Impl(Communicator& c, DataParallelOptions opts) : comm(c), ci(c.impl()), o(opts) {}

  void make_buckets();
  void check_same_layout();
  void pack(Bucket& b);
  void unpack(Bucket& b);
  void start(size_t b);
  bool progress();  // tests the requests in flight; true when one finished
  void loop();
};

void DataParallel::Impl::make_buckets() {
  size_t bytes = 0;
  for (size_t i = 0; i < grads.size(); ++i) {
    const size_t nb = grads[i].node()->nbytes();
    if (buckets.empty() || (bytes > 0 && bytes + nb > o.bucket_bytes)) {
      buckets.push_back({});
      buckets.back().first = i;
      bytes = 0;
    }
    buckets.back().last = i + 1;
    bytes += nb;
  }
  for (Bucket& b : buckets) {
    // In place when the gradients are f32 host memory, in order, separated only
    // by alignment padding (zeros that stay zero when summed).
    bool inplace = true;
    size_t count = 0;
    for (size_t i = b.first; i < b.last && inplace; ++i) {
      const TensorNode* n = grads[i].node();
      inplace =
          n->dtype == f32 && n->data && n->buffer && n->buffer->is_host() && n->is_contiguous();
      if (inplace && i > b.first) {
        const TensorNode* p = grads[i - 1].node();
        const char* end = static_cast<const char*>(p->data) + p->nbytes();
        const char* at = static_cast<const char*>(n->data);
        inplace = p->buffer == n->buffer && at >= end &&
                  size_t(at - end) < n->buffer->type().alignment() &&
                  size_t(at - end) % sizeof(float) == 0;
      }
      count += size_t(n->numel());
    }
    if (inplace) {
      const TensorNode* last = grads[b.last - 1].node();
      b.data = static_cast<float*>(grads[b.first].node()->data);
      b.count = size_t(static_cast<const float*>(last->data) + last->numel() - b.data);
    } else {
      b.packed = true;
      b.fusion.resize(count);
      b.data = b.fusion.data();
      b.count = count;
    }
  }
}

// Every rank must reduce the same buckets in the same order, or MPI would pair
// mismatched messages: compare with rank 0's layout once.
void DataParallel::Impl::check_same_layout() {
  std::vector<uint64_t> sig = {grads.size(), buckets.size()};
  for (const Bucket& b : buckets) sig.push_back(b.count);
  uint64_t n0 = sig.size();
  comm.broadcast(std::span<std::byte>(reinterpret_cast<std::byte*>(&n0), sizeof n0));
  std::vector<uint64_t> root = sig;
  root.resize(n0);
  comm.broadcast(std::span<std::byte>(reinterpret_cast<std::byte*>(root.data()),
                                      root.size() * sizeof(uint64_t)));
  if (root != sig)
    comm.abort("DataParallel: this rank's gradients (" + std::to_string(grads.size()) +
               " tensors in " + std::to_string(buckets.size()) +
               " buckets) differ from rank 0's (" + std::to_string(root[0]) + " tensors in " +
               std::to_string(root.size() > 1 ? root[1] : 0) +
               " buckets): every rank must build the same model");
}

void DataParallel::Impl::pack(Bucket& b) {
  if (!b.packed) return;
  float* p = b.fusion.data();
  for (size_t i = b.first; i < b.last; ++i) {
    TensorNode* n = grads[i].node();
    n->buffer->get(n, p, 0, n->nbytes());
    p += n->numel();
  }
}

void DataParallel::Impl::unpack(Bucket& b) {
  if (!b.packed) return;
  const float* p = b.fusion.data();
  for (size_t i = b.first; i < b.last; ++i) {
    TensorNode* n = grads[i].node();
    n->buffer->set(n, p, 0, n->nbytes());
    p += n->numel();
  }
}

void DataParallel::Impl::start(size_t i) {
  if (i == 0) t_first = Clock::now();
  Bucket& b = buckets[i];
  b.finished = false;
  b.req = ci.iallreduce(b.data, b.count, Elem::f32);
  stats.buckets++;
  stats.bytes += double(b.count) * sizeof(float);
}

bool DataParallel::Impl::progress() {
  bool any = false;
  for (size_t i = 0; i < started; ++i) {
    Bucket& b = buckets[i];
    if (b.finished || !ci.test(b.req)) continue;
    b.finished = true;
    any = true;
    std::lock_guard<std::mutex> lk(m);
    if (++finished == buckets.size()) {
      t_last = Clock::now();
      cv_done.notify_all();
    }
  }
  return any;
}

// The communication thread: starts the buckets the training thread marked
// ready and tests the requests in flight until every started one finished.
void DataParallel::Impl::loop() {
  for (;;) {
    size_t from, target;
    {
      std::unique_lock<std::mutex> lk(m);
      cv_work.wait(lk, [&] { return stop || started < ready || finished < started; });
      if (stop) return;
      from = started;
      target = ready;
    }
    for (size_t i = from; i < target; ++i) start(i);
    {
      std::lock_guard<std::mutex> lk(m);
      started = target;
    }
    // No work of its own: leave the core to the backward pass between tests.
    if (!progress()) std::this_thread::yield();
  }
}

// ---------------------------------------------------------------------------

DataParallel::DataParallel(Communicator& comm, DataParallelOptions o)
    : impl_(std::make_unique<Impl>(comm, o)) {
  if (o.bucket_bytes == 0) fail("dist", "DataParallelOptions::bucket_bytes must be > 0");
}

DataParallel::~DataParallel() {
  Impl& s = *impl_;
  if (s.thread.joinable()) {
    {
      std::lock_guard<std::mutex> lk(s.m);
      s.stop = true;
    }
    s.cv_work.notify_all();
    s.thread.join();
  }
}

int DataParallel::rank() const { return impl_->comm.rank(); }
int DataParallel::size() const { return impl_->comm.size(); }
Communicator& DataParallel::comm() { return impl_->comm; }
size_t DataParallel::n_buckets() const { return impl_->buckets.size(); }
size_t DataParallel::n_packed_buckets() const {
  size_t n = 0;
  for (const Bucket& b : impl_->buckets) n += b.packed;
  return n;
}
const DataParallelStats& DataParallel::stats() const { return impl_->stats; }
void DataParallel::reset_stats() { impl_->stats = {}; }

std::vector<size_t> DataParallel::attach(std::span<const Tensor> grads) {
  Impl& s = *impl_;
  if (s.attached)
    fail("dist", "this DataParallel already serves an OptContext: create one per context");
  s.attached = true;
  s.grads.assign(grads.begin(), grads.end());
  if (grads.empty()) return {};
  if (size() == 1) return {grads.size()};
  s.make_buckets();
  s.check_same_layout();
  s.use_thread = s.o.progress_thread && s.ci.threads_ok;
  if (s.use_thread) s.thread = std::thread([&s] { s.loop(); });
  if (!s.o.overlap) return {grads.size()};
  std::vector<size_t> cuts;
  for (const Bucket& b : s.buckets) cuts.push_back(b.last);
  return cuts;
}

void DataParallel::grads_ready(size_t count) {
  Impl& s = *impl_;
  if (size() == 1 || s.buckets.empty()) return;
  if (!s.o.overlap && count < s.grads.size()) return;
  size_t nb = s.ready;
  while (nb < s.buckets.size() && s.buckets[nb].last <= count) s.pack(s.buckets[nb++]);
  if (nb == s.ready) return;
  if (s.use_thread) {
    {
      std::lock_guard<std::mutex> lk(s.m);
      s.ready = nb;
    }
    s.cv_work.notify_one();
    return;
  }
  // Driven by the caller: start now, progress at each later call.
  for (size_t i = s.started; i < nb; ++i) s.start(i);
  s.ready = s.started = nb;
  s.progress();
}

void DataParallel::finish_grads() {
  Impl& s = *impl_;
  if (size() == 1 || s.buckets.empty()) return;
  if (s.ready < s.buckets.size()) grads_ready(s.grads.size());
  const Clock::time_point t0 = Clock::now();
  const size_t n = s.buckets.size();
  if (s.use_thread) {
    std::unique_lock<std::mutex> lk(s.m);
    auto all_done = [&] { return s.finished == n; };
    if (s.ci.timeout > 0) {
      if (!s.cv_done.wait_for(lk, std::chrono::duration<double>(s.ci.timeout), all_done)) {
        lk.unlock();
        s.ci.timed_out("the gradient allreduce");
      }
    } else {
      s.cv_done.wait(lk, all_done);
    }
  } else {
    for (;;) {
      s.progress();
      if (s.finished == n) break;
      if (s.ci.timeout > 0 && seconds_since(t0) > s.ci.timeout)
        s.ci.timed_out("the gradient allreduce");
      std::this_thread::yield();
    }
  }
  s.stats.wait_seconds += seconds_since(t0);
  s.stats.reduce_seconds += std::chrono::duration<double>(s.t_last - s.t_first).count();
  s.stats.steps++;
  for (Bucket& b : s.buckets) s.unpack(b);
  std::lock_guard<std::mutex> lk(s.m);
  s.ready = s.started = s.finished = 0;
}

void DataParallel::broadcast(std::span<const Tensor> tensors) {
  if (size() == 1) return;
  for (const Tensor& t : tensors) impl_->comm.broadcast(t, 0);
}

void DataParallel::sum(std::span<double> values) { impl_->comm.allreduce(values, ReduceOp::sum); }

}  // namespace kiln::dist
