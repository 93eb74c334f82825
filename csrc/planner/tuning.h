// Every tuning threshold of the native library, in one place, each with the reason it exists.
#pragma once

#include <cstddef>
#include <cstdint>

namespace npu_dispatch {

// Destination bytes one thread takes at least when a kernel pass splits across threads: about
// ATen's GRAIN_SIZE elements of a 2-byte type.
constexpr int64_t kCopyGrainBytes = 64 * 1024;

// Bytes read plus written at or below which a pass of the direct entry runs on the calling
// thread, as ATen's copy_ stays serial below GRAIN_SIZE elements.
constexpr int64_t kSerialMovedBytes = 256 * 1024;

// The same limit for calls that reach the planner through the dispatcher (the interception
// kernels, the ops' kernels): the binding's work around such a call leaves the second thread
// idle, and its share of the bytes lands in the other core's caches, so these stay on one
// thread longer.
constexpr int64_t kDispatchedSerialMovedBytes = 768 * 1024;

// Above this many destination bytes the direct entry's copy drops the GIL (holding references
// to the list items meanwhile); below it the pass is far shorter than Python's switch
// interval.
constexpr int64_t kReleaseGilBytes = 2 * 1024 * 1024;

// Lists of up to this many pairs reuse the calling thread's scratch instead of allocating a
// fresh one per call.
constexpr size_t kKeptPairs = 4096;

// The most a pass may move before it streams its stores, whatever sysfs says of the last-level
// cache (cpu/byte_copy.h stream_moved_bytes): a virtual machine on a large package sees the
// package's whole cache but holds only a slice of it, and passes beyond that slice gain from
// streaming (byte copies and conversions alike).
constexpr int64_t kMaxStreamMovedBytes = int64_t{96} << 20;

// How far ahead the one-pass plan prefetches a long list's metadata: the tensors this many pairs
// ahead, the storages of nearer ones (whose tensors have arrived by then).
constexpr size_t kAheadTensors = 8, kAheadStorages = 4;

// Longest single memcpy: above a cache-size threshold glibc switches to its own non-temporal
// path, slower than 64 KB calls; passes beyond the cache stream with cpu/byte_copy.h
// instead.
constexpr int64_t kMemcpyChunk = 64 * 1024;

}  // namespace npu_dispatch
