// DataLoader: a per-epoch pool of worker threads that claim batches in order, within a window
// of batches ahead of the consumer, and hand them over through an ordered map. Results depend
// only on (seed, epoch, sample index), never on which worker built a batch or when.
#include "dpar/data/dataloader.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

namespace dpar::data {

struct DataLoader::EpochState {
  struct Result {
    Batch batch;
    std::exception_ptr error;
  };
  int64_t epoch = 0;
  std::vector<std::vector<size_t>> batches;  // dataset indices of each batch
  size_t window = 1;                         // batches claimed but not yet delivered, at most

  std::mutex mutex;
  std::condition_variable work_cv;   // workers wait for room in the window
  std::condition_variable ready_cv;  // the consumer waits for its next batch
  size_t next_claim = 0;             // next batch a worker will build
  size_t next_deliver = 0;           // next batch the consumer receives
  std::map<size_t, Result> ready;
  std::atomic<bool> stop{false};
  std::vector<std::thread> workers;
};

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset,
                       std::shared_ptr<const Sampler> sampler, DataLoaderOptions options)
    : dataset_(std::move(dataset)), sampler_(std::move(sampler)), options_(options) {
  DPAR_CHECK(dataset_ != nullptr, "DataLoader: dataset is null");
  DPAR_CHECK(sampler_ != nullptr, "DataLoader: sampler is null");
  DPAR_CHECK(options_.batch_size > 0, "DataLoader: batch_size must be positive");
  DPAR_CHECK(options_.num_workers >= 0, "DataLoader: num_workers must be >= 0, got ",
             options_.num_workers);
  DPAR_CHECK(options_.prefetch_batches > 0, "DataLoader: prefetch_batches must be positive");
  if (options_.pin_memory) {
    try {
      (void)Tensor::empty_pinned({0});  // fails now, with the reason, rather than in a worker
    } catch (const Error& e) {
      DPAR_FAIL("DataLoader: pin_memory: ", e.what());
    }
  }
}

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset,
                       std::shared_ptr<const Sampler> sampler, size_t batch_size, int num_workers,
                       size_t prefetch_batches, bool drop_last, uint64_t seed)
    : DataLoader(std::move(dataset), std::move(sampler),
                 DataLoaderOptions{batch_size, num_workers, prefetch_batches, drop_last, seed}) {}

DataLoader::~DataLoader() { stop_epoch(); }

size_t DataLoader::num_batches() const {
  const size_t n = sampler_->size(), b = options_.batch_size;
  return options_.drop_last ? n / b : (n + b - 1) / b;
}

size_t DataLoader::num_samples() const {
  const size_t n = sampler_->size();
  return options_.drop_last ? n / options_.batch_size * options_.batch_size : n;
}

uint64_t DataLoader::sample_seed(uint64_t seed, int64_t epoch, size_t index) {
  // splitmix64 finaliser, chained over the three inputs: nearby seeds, epochs and indices
  // give unrelated generator seeds.
  auto mix = [](uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  };
  return mix(mix(mix(seed) ^ static_cast<uint64_t>(epoch)) ^ static_cast<uint64_t>(index));
}

void DataLoader::stop_epoch() {
  if (!state_) return;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stop = true;
  }
  state_->work_cv.notify_all();
  for (std::thread& t : state_->workers) t.join();
  state_.reset();
}

void DataLoader::start_epoch(int64_t epoch) {
  stop_epoch();
  std::vector<size_t> order = sampler_->indices(epoch);
  const size_t n = dataset_->size();
  for (size_t i : order) {
    DPAR_CHECK(i < n, "DataLoader: the sampler produced index ", i, " for a dataset of ", n,
               " examples");
  }
  auto st = std::make_unique<EpochState>();
  st->epoch = epoch;
  const size_t bs = options_.batch_size;
  for (size_t begin = 0; begin < order.size(); begin += bs) {
    const size_t end = std::min(begin + bs, order.size());
    if (end - begin < bs && options_.drop_last) break;
    st->batches.emplace_back(order.begin() + static_cast<std::ptrdiff_t>(begin),
                             order.begin() + static_cast<std::ptrdiff_t>(end));
  }
  st->window = std::max(options_.prefetch_batches, static_cast<size_t>(options_.num_workers));
  EpochState* s = st.get();
  state_ = std::move(st);
  for (int w = 0; w < options_.num_workers; ++w) {
    s->workers.emplace_back([this, s] {
      std::unique_lock<std::mutex> lock(s->mutex);
      for (;;) {
        s->work_cv.wait(lock, [s] {
          return s->stop || s->next_claim >= s->batches.size() ||
                 s->next_claim < s->next_deliver + s->window;
        });
        if (s->stop || s->next_claim >= s->batches.size()) return;
        const size_t b = s->next_claim++;
        lock.unlock();
        EpochState::Result result;
        try {
          result.batch = build_batch(*s, b);
        } catch (...) {
          result.error = std::current_exception();
        }
        lock.lock();
        if (s->stop) return;
        s->ready.emplace(b, std::move(result));
        s->ready_cv.notify_all();
      }
    });
  }
}

std::optional<Batch> DataLoader::next() {
  if (!state_) return std::nullopt;
  EpochState& st = *state_;
  if (st.next_deliver >= st.batches.size()) {
    stop_epoch();
    return std::nullopt;
  }
  if (options_.num_workers == 0) {
    const size_t b = st.next_deliver++;
    try {
      return build_batch(st, b);
    } catch (...) {
      stop_epoch();
      throw;
    }
  }
  EpochState::Result result;
  {
    std::unique_lock<std::mutex> lock(st.mutex);
    st.ready_cv.wait(lock, [&st] { return st.ready.count(st.next_deliver) != 0; });
    auto it = st.ready.find(st.next_deliver);
    result = std::move(it->second);
    st.ready.erase(it);
    ++st.next_deliver;
  }
  st.work_cv.notify_all();  // room for one more batch in the window
  if (result.error) {
    stop_epoch();
    std::rethrow_exception(result.error);
  }
  return std::move(result.batch);
}

Batch DataLoader::build_batch(const EpochState& st, size_t batch_index) const {
  const std::vector<size_t>& idx = st.batches[batch_index];
  const int64_t count = static_cast<int64_t>(idx.size());
  Batch batch;
  batch.indices = idx;
  auto host_empty = [&](const Shape& shape, DType dtype) {
    return options_.pin_memory ? Tensor::empty_pinned(shape, dtype) : Tensor::empty(shape, dtype);
  };
  batch.labels = host_empty({count}, DType::i64);
  int64_t* labels = batch.labels.data<int64_t>();
  Shape image_shape;
  size_t image_bytes = 0;
  for (int64_t k = 0; k < count; ++k) {
    if (st.stop) return {};  // abandoned epoch: the result is discarded anyway
    const size_t i = idx[static_cast<size_t>(k)];
    try {
      Generator rng(sample_seed(options_.seed, st.epoch, i));
      Example ex = dataset_->get(i, rng);
      DPAR_CHECK(ex.image.defined() && ex.image.dtype() == DType::f32 && ex.image.dim() == 3,
                 "expected an f32 [C,H,W] image, got ",
                 ex.image.defined() ? ex.image.str() : std::string("an undefined tensor"));
      DPAR_CHECK(ex.image.device().is_cpu(), "expected a CPU image, got one on ",
                 ex.image.device());
      if (k == 0) {
        image_shape = ex.image.shape();
        image_bytes = ex.image.nbytes();
        batch.images =
            host_empty({count, image_shape[0], image_shape[1], image_shape[2]}, DType::f32);
      } else {
        DPAR_CHECK(ex.image.shape() == image_shape, "image shape ", ex.image.shape(),
                   " differs from the batch's first image ", image_shape,
                   " (add a Resize/CenterCrop or RandomResizedCrop transform)");
      }
      // Plain memcpy, not Tensor::copy_: no OpenMP team is started from a worker thread.
      const Tensor img = ex.image.contiguous();
      std::memcpy(
          static_cast<char*>(batch.images.raw_data()) + static_cast<size_t>(k) * image_bytes,
          img.raw_data(), image_bytes);
      labels[k] = ex.label;
    } catch (const std::exception& e) {
      throw Error(detail::str_cat("DataLoader: sample ", i, " (epoch ", st.epoch, ", batch ",
                                  batch_index, "): ", e.what()));
    }
  }
  return batch;
}

}  // namespace dpar::data
