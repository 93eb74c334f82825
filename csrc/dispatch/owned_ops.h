// The owned ops: one row each, the library's one list of them. Adding an op is a row here plus
// its kernel.
//
// C++ expands the rows by defining the row macros before including this file (no include guard);
// Python reads the same rows from this file (npu_dispatch/_op_table.py), so the list also holds
// where the native library is missing. Each row is one line:
//
//   NPU_DISPATCH_STOCK_OP(id, kernel, wrapper, copy, "schema")
//     a stock op served by an interception kernel at BackendSelect while a mode is entered;
//   NPU_DISPATCH_LIBRARY_OP(id, kernel, wrapper, copy, "schema")
//     an op the library defines (namespace npu_dispatch), called directly or from compiled code.
//
//   id       the CountedOp enumerator, kOp<id> (dispatch/op_table.h); stats count the op as its
//            schema's name with "." for "::" ("fsdp.chunk_cat")
//   kernel   the C++ kernel: the interception kernel (dispatch/intercept.cpp), the library op's
//            backend kernel (dispatch/register.cpp), or python_kernel where the op keeps the
//            Python kernel of npu_dispatch/ops.py on every backend
//   wrapper  the key of the Python handler (npu_dispatch/engine.py HANDLERS) that serves the op
//            under the debugging mode (read by Python only; C++ reads the kernel column)
//   copy     which of FSDP2's copies the op makes: cast (the mixed-precision cast, or any foreach
//            copy), copy_in (all-gather copy-in), copy_out (all-gather copy-out), chunk_cat
//            (reduce-scatter copy-in)
//   schema   the schema the kernel is typed on, as str(op._schema) prints it; an intercepted fsdp
//            op found with another schema passes through to stock, counted (reason "schema"); an
//            aten op's schema is a dispatcher fact (dispatch/dispatcher_facts.h): where it differs,
//            the mode takes its Python path
//
// Sources of the stock schemas: native_functions.yaml (_foreach_copy_, _foreach_copy,
// split_with_sizes_copy.out: torch 2.13 to 2.15),
// torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py (all_gather_copy_in,
// split_with_sizes_copy, chunk_cat) and torch/csrc/distributed/fsdp/ChunkCat.h
// (chunk_cat_mixed_dtype, torch 2.15 on). The library's own ops copy the stock schemas, so a
// caller, a FakeTensor trace or an Inductor lowering can swap one for the other.

// clang-format off
NPU_DISPATCH_LIBRARY_OP(ForeachCopy, foreach_copy_kernel, foreach_copy, cast, "npu_dispatch::foreach_copy_(Tensor(a!)[] self, Tensor[] src, bool non_blocking=False) -> ()")
NPU_DISPATCH_LIBRARY_OP(AllGatherCopyIn, all_gather_copy_in_kernel, all_gather_copy_in, copy_in, "npu_dispatch::all_gather_copy_in(Tensor[] all_gather_inputs, Tensor all_gather_output, SymInt[] inp_split_sizes, SymInt all_gather_input_numel, SymInt rank) -> (Tensor, Tensor)")
NPU_DISPATCH_LIBRARY_OP(SplitWithSizesCopy, python_kernel, split_with_sizes_copy, copy_out, "npu_dispatch::split_with_sizes_copy(Tensor all_gather_output, SymInt[] all_gather_input_split_sizes, int dim=0, *, Tensor(a!)[] out) -> ()")
NPU_DISPATCH_LIBRARY_OP(ChunkCat, python_kernel, chunk_cat, chunk_cat, "npu_dispatch::chunk_cat(Tensor[] tensors, int dim, int num_chunks, *, Tensor(a!) out) -> ()")
NPU_DISPATCH_STOCK_OP(AtenForeachCopy, foreach_copy_, foreach_copy, cast, "aten::_foreach_copy_(Tensor(a!)[] self, Tensor[] src, bool non_blocking=False) -> ()")
NPU_DISPATCH_STOCK_OP(AtenForeachCopyFunctional, foreach_copy, foreach_copy_functional, cast, "aten::_foreach_copy(Tensor[] self, Tensor[] src, bool non_blocking=False) -> Tensor[] self_out")
NPU_DISPATCH_STOCK_OP(AtenSplitWithSizesCopyOut, copy_out_kernel, split_with_sizes_copy, copy_out, "aten::split_with_sizes_copy.out(Tensor self, SymInt[] split_sizes, int dim=0, *, Tensor(a!)[] out) -> ()")
NPU_DISPATCH_STOCK_OP(FsdpAllGatherCopyIn, fsdp_all_gather_copy_in, all_gather_copy_in, copy_in, "fsdp::all_gather_copy_in(Tensor[] all_gather_inputs, Tensor all_gather_output, SymInt[] inp_split_sizes, SymInt all_gather_input_numel, SymInt rank) -> (Tensor, Tensor)")
NPU_DISPATCH_STOCK_OP(FsdpSplitWithSizesCopy, copy_out_kernel, split_with_sizes_copy, copy_out, "fsdp::split_with_sizes_copy(Tensor all_gather_output, SymInt[] all_gather_input_split_sizes, int dim=0, *, Tensor(a!)[] out) -> ()")
NPU_DISPATCH_STOCK_OP(FsdpChunkCat, fsdp_chunk_cat, chunk_cat, chunk_cat, "fsdp::chunk_cat(Tensor[] tensors, int dim, int num_chunks, *, Tensor(a!) out) -> ()")
NPU_DISPATCH_STOCK_OP(FsdpChunkCatMixedDtype, fsdp_chunk_cat_mixed, chunk_cat_mixed_dtype, chunk_cat, "fsdp::chunk_cat_mixed_dtype(Tensor[] tensors, int dim, int num_chunks, *, Tensor(a!) out) -> ()")
// clang-format on
