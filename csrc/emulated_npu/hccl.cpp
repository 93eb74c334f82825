// An emulated HCCL process-group backend for the emulated device: each collective runs on gloo over
// zero-copy CPU views of the npu tensors, synchronously, and returns completed work. It exists so
// FSDP2 can train on npu tensors across processes (init_process_group("cpu:gloo,npu:emulated_hccl")).
// A Python subclass of c10d.Backend cannot be constructed, hence C++.
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <vector>

namespace npu_dispatch::emulated_npu {

at::Tensor host_or_self(const at::Tensor& t);

namespace {

// Finished when returned: everything ran before the call came back.
class DoneWork final : public c10d::Work {
 public:
  explicit DoneWork(c10d::OpType op) : Work(-1, op) {}
  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds) override { return true; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    auto f = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
    f->markCompleted(c10::IValue(c10::List<at::Tensor>()));
    return f;
  }
};

std::vector<at::Tensor> host(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const auto& t : ts) out.push_back(host_or_self(t));
  return out;
}

class EmulatedHccl final : public c10d::Backend {
 public:
  EmulatedHccl(c10::intrusive_ptr<c10d::Backend> gloo, int rank, int size)
      : Backend(rank, size), gloo_(std::move(gloo)) {}

  const std::string getBackendName() const override { return "emulated_hccl"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) override {
    auto h = host(tensors);
    gloo_->broadcast(h, opts)->wait();
    return done(c10d::OpType::BROADCAST);
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override {
    auto h = host(tensors);
    auto o = opts;
    const bool avg = sum_for_avg(&o.reduceOp, h);
    gloo_->allreduce(h, o)->wait();
    if (avg) divide(h);
    return done(c10d::OpType::ALLREDUCE);
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override {
    std::vector<std::vector<at::Tensor>> ho;
    for (const auto& l : outputs) ho.push_back(host(l));
    auto hi = host(inputs);
    gloo_->allgather(ho, hi, opts)->wait();
    return done(c10d::OpType::ALLGATHER);
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override {
    auto ho = host_or_self(output);
    auto hi = host_or_self(input);
    gloo_->_allgather_base(ho, hi, opts)->wait();
    return done(c10d::OpType::_ALLGATHER_BASE);
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    auto ho = host(outputs);
    std::vector<std::vector<at::Tensor>> hi;
    for (const auto& l : inputs) hi.push_back(host(l));
    auto o = opts;
    const bool avg = sum_for_avg(&o.reduceOp, ho);
    gloo_->reduce_scatter(ho, hi, o)->wait();
    if (avg) divide(ho);
    return done(c10d::OpType::REDUCE_SCATTER);
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override {
    std::vector<at::Tensor> ho{host_or_self(output)};
    auto hi = host_or_self(input);
    auto o = opts;
    const bool avg = sum_for_avg(&o.reduceOp, ho);
    // One wait: a second wait() of gloo's reduce-scatter copies its sum over the divide below.
    gloo_->_reduce_scatter_base(ho[0], hi, o)->wait();
    if (avg) divide(ho);
    return done(c10d::OpType::_REDUCE_SCATTER_BASE);
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    gloo_->barrier(opts)->wait();
    return done(c10d::OpType::BARRIER);
  }

 private:
  static c10::intrusive_ptr<c10d::Work> done(c10d::OpType op) { return c10::make_intrusive<DoneWork>(op); }

  // Gloo has no AVG: a sum, then a divide by the world size (HCCL's AVG result for floats).
  static bool sum_for_avg(c10d::ReduceOp* op, const std::vector<at::Tensor>& ts) {
    if (op->op_ != c10d::ReduceOp::AVG) return false;
    for (const auto& t : ts) {
      TORCH_CHECK(at::isFloatingType(t.scalar_type()), "emulated_hccl: ReduceOp.AVG needs floating-point tensors");
    }
    *op = c10d::ReduceOp(c10d::ReduceOp::SUM);
    return true;
  }

  void divide(std::vector<at::Tensor>& ts) const {
    for (auto& t : ts) t.div_(size_);
  }

  c10::intrusive_ptr<c10d::Backend> gloo_;
};

}  // namespace

c10::intrusive_ptr<c10d::Backend> make_hccl(c10::intrusive_ptr<c10d::Backend> gloo, int rank, int size) {
  return c10::make_intrusive<EmulatedHccl>(std::move(gloo), rank, size);
}

}  // namespace npu_dispatch::emulated_npu
