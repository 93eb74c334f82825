// The eligibility rule (planner/classify.h).
#include "planner/classify.h"

namespace npu_dispatch {

bool same_layout(const c10::TensorImpl& d, const c10::TensorImpl& s) {
  return d.sizes() == s.sizes() && dense(d) && dense(s) && classify_detail::same_strides(d, s);
}

Refusal fast_route_tensor(const c10::TensorImpl& t, bool written, const RuleContext& rule) {
  const Refusal r = tensor_refusal(t, written, rule);
  if (r || !(t.is_conj() || t.is_neg())) return r;
  return {Kind::ConjNeg, 0};
}


void bump_pairs_as_stock(at::TensorList dsts, at::TensorList srcs, bool in_inference,
                         const std::vector<uint8_t>& skip) {
  for (size_t i = 0; i < dsts.size(); ++i) {
    if ((skip.empty() || !skip[i]) && stock_bumps_pair(dsts[i], srcs[i], in_inference)) {
      dsts[i].unsafeGetTensorImpl()->bump_version();
    }
  }
}

void bump_as_stock(at::TensorList written, at::TensorList read, bool in_inference) {
  bool all_inference = in_inference;
  for (const auto l : {read, written}) {
    for (size_t k = 0; k < l.size() && all_inference; ++k) all_inference = inference_keyed(*l[k].unsafeGetTensorImpl());
  }
  for (const auto& t : written) {
    if (stock_bumps(all_inference, in_inference)) t.unsafeGetTensorImpl()->bump_version();
  }
}

int64_t lazy_bit_dst(at::TensorList dsts) {
  for (size_t i = 0; i < dsts.size(); ++i) {
    const auto& d = dsts[i];
    if (d.defined() && (d.is_conj() || d.is_neg())) return static_cast<int64_t>(i);
  }
  return -1;
}

}  // namespace npu_dispatch
