// ElasticState: named items saved into an in-memory commit, restored from it, and handed from
// one rank to the others as one byte buffer.
#include <cstring>
#include <map>

#include "dpar/core/random.h"
#include "dpar/distributed/elastic.h"
#include "dpar/optim/lr_scheduler.h"
#include "dpar/optim/optimizer.h"

namespace dpar::dist {
namespace {

constexpr uint32_t kBlobMagic = 0x53455044;  // "DPES"

Tensor i64_scalar(int64_t value) { return Tensor::from_vector(std::vector<int64_t>{value}, {}); }
int64_t i64_value(const Tensor& t) { return t.contiguous().to(Device::cpu()).data<int64_t>()[0]; }

Tensor bytes_tensor(const std::string& bytes) {
  Tensor t = Tensor::empty({static_cast<int64_t>(bytes.size())}, DType::u8);
  if (!bytes.empty()) std::memcpy(t.raw_data(), bytes.data(), bytes.size());
  return t;
}

const Tensor& entry(const nn::NamedTensors& entries, const std::string& key,
                    const std::string& item) {
  for (const auto& [name, tensor] : entries) {
    if (name == key) return tensor;
  }
  DPAR_FAIL("ElasticState: item '", item, "' has no entry '", key, "' in the commit");
}

// Bytes out / in, little-endian as the machine (every rank of a job runs on one architecture).
struct Writer {
  std::vector<uint8_t> out;
  void raw(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out.insert(out.end(), b, b + n);
  }
  void u64(uint64_t v) { raw(&v, sizeof v); }
  void str(const std::string& s) {
    u64(s.size());
    raw(s.data(), s.size());
  }
};

struct Reader {
  const uint8_t* p;
  size_t left;
  void raw(void* to, size_t n) {
    DPAR_CHECK(n <= left, "ElasticState::sync: the state received is cut short");
    std::memcpy(to, p, n);
    p += n;
    left -= n;
  }
  uint64_t u64() {
    uint64_t v = 0;
    raw(&v, sizeof v);
    return v;
  }
  std::string str() {
    const uint64_t n = u64();
    DPAR_CHECK(n <= left, "ElasticState::sync: the state received is cut short");
    std::string s(reinterpret_cast<const char*>(p), n);
    p += n;
    left -= n;
    return s;
  }
};

void fnv(uint64_t& h, const void* data, size_t n) {
  const auto* b = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= b[i];
    h *= 1099511628211ull;
  }
}

bool same_layout(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && a.device() == b.device();
}

}  // namespace

struct ElasticState::Impl {
  struct Item {
    std::string name;
    Save save;
    Load load;
    Device device;
    nn::NamedTensors committed;
  };
  std::vector<Item> items;
  bool has_commit = false;
  int64_t version = 0;

  void add(const std::string& name, Save save, Load load, Device device) {
    DPAR_CHECK(!name.empty(), "ElasticState: an item needs a name");
    for (const Item& item : items) {
      DPAR_CHECK(item.name != name, "ElasticState: an item named '", name, "' exists already");
    }
    DPAR_CHECK(!has_commit, "ElasticState: add '", name, "' before the first commit");
    items.push_back(Item{name, std::move(save), std::move(load), device, {}});
  }

  std::vector<uint8_t> serialize() const {
    Writer w;
    w.u64(kBlobMagic);
    w.u64(static_cast<uint64_t>(version));
    w.u64(items.size());
    for (const Item& item : items) {
      w.str(item.name);
      w.u64(item.committed.size());
      for (const auto& [key, tensor] : item.committed) {
        const Tensor host = tensor.contiguous().to(Device::cpu());
        w.str(key);
        w.u64(static_cast<uint64_t>(host.dtype()));
        w.u64(host.shape().size());
        for (int64_t d : host.shape()) w.u64(static_cast<uint64_t>(d));
        w.raw(host.raw_data(), host.nbytes());
      }
    }
    return w.out;
  }

  void deserialize(const uint8_t* data, size_t size) {
    Reader r{data, size};
    DPAR_CHECK(r.u64() == kBlobMagic, "ElasticState::sync: what arrived is not an elastic state");
    const auto received_version = static_cast<int64_t>(r.u64());
    const uint64_t count = r.u64();
    DPAR_CHECK(count == items.size(), "ElasticState::sync: the sender registered ", count,
               " items, this rank ", items.size(), ": every rank must add the same items");
    for (Item& item : items) {
      const std::string name = r.str();
      DPAR_CHECK(name == item.name, "ElasticState::sync: the sender's item '", name,
                 "' stands where this rank has '", item.name, "'");
      nn::NamedTensors received;
      const uint64_t entries = r.u64();
      for (uint64_t e = 0; e < entries; ++e) {
        std::string key = r.str();
        const uint64_t dtype_code = r.u64();
        const uint64_t dims = r.u64();
        DPAR_CHECK(dtype_code <= static_cast<uint64_t>(DType::u8) && dims <= 16,
                   "ElasticState::sync: entry '", key, "' of item '", name, "' is malformed");
        const auto dtype = static_cast<DType>(dtype_code);
        Shape shape(dims);
        for (int64_t& d : shape) d = static_cast<int64_t>(r.u64());
        Tensor host = Tensor::empty(shape, dtype);
        r.raw(host.raw_data(), host.nbytes());
        // Where this rank keeps the entry already (its own commit), else the item's device.
        Device device = item.device;
        for (const auto& [k, t] : item.committed) {
          if (k == key) device = t.device();
        }
        received.emplace_back(std::move(key), device.is_cpu() ? host : host.to(device));
      }
      item.committed = std::move(received);
    }
    DPAR_CHECK(r.left == 0, "ElasticState::sync: ", r.left, " bytes left over after the state");
    version = received_version;
    has_commit = true;
  }
};

ElasticState::ElasticState() : impl_(std::make_unique<Impl>()) {}
ElasticState::~ElasticState() = default;

void ElasticState::add(const std::string& name, Save save, Load load, Device device) {
  impl_->add(name, std::move(save), std::move(load), device);
}

void ElasticState::add_module(const std::string& name, nn::Module& module) {
  const auto params = module.parameters();
  add(
      name, [&module] { return module.state_dict(); },
      [&module](const nn::NamedTensors& entries) { module.load_state_dict(entries, true); },
      params.empty() ? Device::cpu() : params.front().device());
}

void ElasticState::add_optimizer(const std::string& name, optim::Optimizer& optimizer) {
  // The learning rate travels as its bit pattern, so it comes back exactly.
  add(
      name,
      [&optimizer] {
        nn::NamedTensors out = optimizer.state_dict();
        const double lr = optimizer.lr();
        int64_t bits = 0;
        std::memcpy(&bits, &lr, sizeof bits);
        out.emplace_back("lr", i64_scalar(bits));
        return out;
      },
      [&optimizer, name](const nn::NamedTensors& entries) {
        optim::StateDict state;
        for (const auto& e : entries) {
          if (e.first != "lr") state.push_back(e);
        }
        optimizer.load_state_dict(state);
        const int64_t bits = i64_value(entry(entries, "lr", name));
        double lr = 0;
        std::memcpy(&lr, &bits, sizeof lr);
        optimizer.set_lr(lr);
      },
      optimizer.params().empty() ? Device::cpu() : optimizer.params().front().device());
}

void ElasticState::add_scheduler(const std::string& name, optim::LRScheduler& scheduler) {
  add(
      name, [&scheduler] { return scheduler.state_dict(); },
      [&scheduler](const nn::NamedTensors& entries) { scheduler.load_state_dict(entries); });
}

void ElasticState::add_generator(const std::string& name, Generator& generator) {
  add(
      name,
      [&generator] {
        return nn::NamedTensors{{"state", bytes_tensor(generator.state())}};
      },
      [&generator, name](const nn::NamedTensors& entries) {
        const Tensor& t = entry(entries, "state", name);
        generator.set_state(std::string(static_cast<const char*>(t.raw_data()), t.nbytes()));
      });
}

void ElasticState::add_counter(const std::string& name, int64_t& counter) {
  add(
      name,
      [&counter] {
        return nn::NamedTensors{{"value", i64_scalar(counter)}};
      },
      [&counter, name](const nn::NamedTensors& entries) {
        counter = i64_value(entry(entries, "value", name));
      });
}

void ElasticState::commit() {
  for (Impl::Item& item : impl_->items) {
    nn::NamedTensors now = item.save();
    bool reuse = now.size() == item.committed.size();
    for (size_t i = 0; reuse && i < now.size(); ++i) {
      reuse = now[i].first == item.committed[i].first &&
              same_layout(now[i].second, item.committed[i].second);
    }
    if (reuse) {
      // The usual case: copy into the previous commit's buffers, no allocation.
      for (size_t i = 0; i < now.size(); ++i) item.committed[i].second.copy_(now[i].second);
    } else {
      for (auto& [key, tensor] : now) tensor = tensor.detach().clone();
      item.committed = std::move(now);
    }
  }
  impl_->has_commit = true;
  ++impl_->version;
}

void ElasticState::restore() {
  DPAR_CHECK(impl_->has_commit, "ElasticState::restore: nothing was committed yet");
  for (Impl::Item& item : impl_->items) {
    // Copies: a loader may keep the tensors it is given (an optimizer's state), and the commit
    // must stay as it is for the next restore.
    nn::NamedTensors copy;
    copy.reserve(item.committed.size());
    for (const auto& [key, tensor] : item.committed) copy.emplace_back(key, tensor.clone());
    try {
      item.load(copy);
    } catch (const Error& e) {
      DPAR_FAIL("ElasticState: restoring item '", item.name, "': ", e.what());
    }
  }
}

void ElasticState::sync(Group& group, int root) {
  DPAR_CHECK(root >= 0 && root < group.size(), "ElasticState::sync: root ", root,
             " is outside a group of ", group.size());
  if (group.size() > 1) {
    std::vector<uint8_t> blob;
    Tensor length = Tensor::zeros({1}, DType::i64);
    if (group.rank() == root) {
      DPAR_CHECK(impl_->has_commit, "ElasticState::sync: root ", root, " has nothing committed");
      blob = impl_->serialize();
      length.data<int64_t>()[0] = static_cast<int64_t>(blob.size());
    }
    group.broadcast({length}, root, /*async_op=*/false);
    Tensor bytes = Tensor::empty({length.data<int64_t>()[0]}, DType::u8);
    if (group.rank() == root) std::memcpy(bytes.raw_data(), blob.data(), blob.size());
    group.broadcast({bytes}, root, /*async_op=*/false);
    if (group.rank() != root) {
      impl_->deserialize(static_cast<const uint8_t*>(bytes.raw_data()), bytes.nbytes());
    }
  }
  restore();
}

bool ElasticState::has_commit() const { return impl_->has_commit; }
int64_t ElasticState::version() const { return impl_->version; }

void ElasticState::set_version(int64_t version) {
  DPAR_CHECK(version >= 0, "ElasticState::set_version: the version must be >= 0, not ", version);
  impl_->version = version;
}

size_t ElasticState::committed_bytes() const {
  size_t total = 0;
  for (const auto& item : impl_->items) {
    for (const auto& [key, tensor] : item.committed) total += tensor.nbytes();
  }
  return total;
}

uint64_t ElasticState::checksum() const {
  uint64_t h = 1469598103934665603ull;
  for (const auto& item : impl_->items) {
    fnv(h, item.name.data(), item.name.size());
    for (const auto& [key, tensor] : item.committed) {
      const Tensor host = tensor.contiguous().to(Device::cpu());
      fnv(h, key.data(), key.size());
      const auto dtype = static_cast<uint8_t>(host.dtype());
      fnv(h, &dtype, 1);
      fnv(h, host.shape().data(), host.shape().size() * sizeof(int64_t));
      fnv(h, host.raw_data(), host.nbytes());
    }
  }
  return h;
}

StepPlan plan_step(BatchPolicy policy, int64_t per_rank_batch, int planned_world, int world) {
  DPAR_CHECK(per_rank_batch >= 1 && planned_world >= 1 && world >= 1, "plan_step: batch ",
             per_rank_batch, ", planned world ", planned_world, " and world ", world,
             " must be positive");
  StepPlan plan;
  if (policy == BatchPolicy::KeepPerRankBatch) {
    plan.micro_batch = per_rank_batch;
    plan.global_batch = per_rank_batch * world;
    plan.lr_scale = static_cast<double>(world) / planned_world;
    return plan;
  }
  const int64_t global = per_rank_batch * planned_world;
  for (int64_t steps = (global + per_rank_batch * world - 1) / (per_rank_batch * world);
       steps <= global; ++steps) {
    if (global % (world * steps) == 0) {
      plan.accumulation = steps;
      plan.micro_batch = global / (world * steps);
      plan.global_batch = global;
      return plan;
    }
  }
  DPAR_FAIL("plan_step: the global batch of ", global, " (", per_rank_batch, " x ", planned_world,
            " ranks) cannot be split into equal micro-batches over ", world,
            " ranks; plan a global batch divisible by every world size the job may have, or keep "
            "the per-rank batch (BatchPolicy::KeepPerRankBatch)");
}

}  // namespace dpar::dist
