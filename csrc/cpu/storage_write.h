// What asking for a storage's mutable pointer would do beyond returning it. Stock's copy_ asks for
// every destination's, even an empty one's (TensorIterator, after copy_impl's early return for the
// same data), so a one-pass plan or a plan that skips an empty pair's pointer must first know it is inert.
#pragma once

#include <c10/core/Storage.h>
#include <c10/core/impl/COW.h>
#include <c10/util/Exception.h>

namespace npu_dispatch {

// Copy-on-write storages: a cow DataPtr in every torch our range covers, and where StorageImpl
// has materializers (newer torch), any storage with one. Asking for the pointer copies them.
template <typename S>
auto lazily_materialized(const S& st, int) -> decltype(st.has_materializer()) {
  return st.has_materializer() || c10::impl::cow::is_cow_data_ptr(st.data_ptr());
}
template <typename S>
bool lazily_materialized(const S& st, long) {
  return c10::impl::cow::is_cow_data_ptr(st.data_ptr());
}

// Whether stock's request for the mutable pointer of `st` (non-null) would raise
// (set_throw_on_mutable_data_ptr: FakeTensor, FunctionalTensor) or materialize a copy-on-write
// storage. Asks for it, so a storage flagged to warn (set_warn_deprecated_on_mutable_data_ptr)
// issues its TORCH_WARN_ONCE here. Stock's copy_ issues it only on reaching that pair, so a call
// that stock stops earlier, or where copy_impl returns early for the same data, warns here and
// not under stock (c10 offers no side-effect-free read of the flags; a known difference).
inline bool mutable_data_refused(const c10::Storage& st) {
  try {
    // Reading the DataPtr for the copy-on-write test raises too where even const access is
    // refused (a released storage).
    if (lazily_materialized(*st.unsafeGetStorageImpl(), 0)) return true;
    st.mutable_data();
  } catch (const c10::Error&) {
    return true;
  }
  return false;
}

}  // namespace npu_dispatch
