"""Settings of the triton backend (module attributes; change them before compiling)."""

# Rows up to this many elements stay in registers (one pass over memory); longer rows
# loop.  8192 bf16 (a softmax row) fits comfortably in 16 warps.
persistent_rblock_max = 16384

# Replay a static graph of at least this many launches as one CUDA graph when its second
# call measures that the host is the bottleneck (cudagraphs.py): a wrapper's Python costs
# microseconds a launch, more than small kernels run (batch-1 decoding).
cudagraphs = True
cudagraph_min_launches = 2

# After the first call, launch each compiled kernel through its low-level launcher with
# the grid and block sizes as literals (Triton's `kernel[grid](...)` costs ~20 us a launch).
fast_launch = True

# Launch compiled kernels on CUDA through torch's ahead-of-time launcher
# (torch._C._StaticCudaLauncher, static_launch.py) instead of the C launcher Triton
# compiles with gcc for each kernel signature (a third of a second each, at first use).
# False: Triton's own launcher runs every kernel.
static_launch = True

# Where no fast wrapper runs (graphs with symbolic sizes: the block sizes and grids vary
# with the sizes; a static graph's first call), each launcher remembers the kernel Triton
# compiled for what Triton specializes a launch on (each tensor's dtype and 16-byte
# alignment; each int's being 1, a multiple of 16 and in int32 range; the block sizes),
# on the current device, and launches it again through torch's launcher when those match
# (~5 us) instead of asking Triton's JIT to specialize the arguments again (~40-80 us a
# launch: a decoding step of 54 kernels spent most of its time there).  Needs
# static_launch.  False: every such launch goes through Triton's JIT.
memo_launches = True
# ... the key read in C++ (frametrace._launch_keys, where it was built for this torch):
# ~3 us a launch in Python for nine arguments, on graphs whose sizes the data decides
# (a mixture of experts' loop: 66 launches a call, the call bound by the host).  False:
# computed in Python.
launch_keys_in_cxx = True

# Kernel sources name their shape symbols by position (sym0, sym1, ...) rather than as the
# graph does (s0, u3, ds1): kernels that differ only in which size they take (one per
# expert of a MoE loop, one per layer) share a source, a Triton compile and an autotuning.
# False: the graph's names, a kernel per symbol.
canonical_symbols = True

# Runtime asserts on sizes the data decides (u0 <= 64) run as Python comparisons in the
# wrapper, raising aten._assert_scalar's RuntimeError; False: each is an aten call.
python_size_asserts = True

# A graph's nonzeros whose arguments (of one shape and dtype) are all computed before the
# first of them (a MoE loop's per-expert masks) run as one nonzero of them stacked, each
# taking its part: one wait for the GPU, not one per nonzero.  False: each nonzero waits
# on its own.
batch_nonzero = True

# Graphs with symbolic sizes: once a set of sizes (every shape symbol's value) has been
# called this many times, that set gets a fast wrapper of its own, with its grids, block
# sizes and compiled kernels as literals, as a static graph's (a server's recurring
# sequence lengths, a second `generate()`'s lengths); later calls with those sizes run it
# after one dict lookup on the sizes (one generated function serves every set whose
# kernels take the same argument types, each set a table of kernels and grids).  Sizes
# seen fewer times launch through the memo above.  1 (the default): right after a set's
# first call, which costs a table (a tuple per kernel, no compile) for sizes that never
# recur (a graph whose kernels need a fast source of their own, compiled, makes it at a
# set's second call), and saves a second call through the general wrapper for those that do (on the
# H200, LLaMA decoding at batch 1 ran 1.36 ms a token with 1 against 3.35 with 2; a
# BERT length's second call took 4.8 ms through the general wrapper against 2.9 through
# its fast one).  0: never (every call of a symbolic graph runs the general wrapper).
# Graphs with sizes the data decides (nonzero) never get them: those sizes are known
# only midway through a call.
sized_fast_after = 1
# At most this many sets of sizes keep a fast wrapper per graph (of the oldest quarter
# made, the one least far along towards a CUDA-graph replay is dropped first).
sized_fast_limit = 64
# An inference graph's set of sizes captures its CUDA graph (cudagraphs.py) at its call of
# this number counted from the call that built its fast wrapper (the set's own call of
# this number with sized_fast_after 1; at least the 4th, after two timed calls): a capture costs
# about three direct calls (BERT, 12 lengths: 10 ms against 3), which a replay (1 ms
# against 3) earns back only over the calls after it, so a size pays for it once it has
# recurred that often (the ski-rental rule: rent until the rent paid equals the price).
sized_capture_at = 5
# Once one set of sizes of a graph kept its CUDA graph (its replay measured faster than
# its direct call), the graph's other sets capture at their third call without timing a
# run before the capture or replays after it (cudagraphs.Verdict): on the H200 a BERT
# length's measured capture cost ~15 ms, five direct calls.  Each set still times one
# direct call, and one the GPU is the bottleneck of keeps launching.  False: every set is
# measured on its own, at `sized_capture_at`.
sized_shared_verdict = True
# ... and the first set of sizes to reach its third call while no sibling has measured a
# replay measures its own there (timed, as at `sized_capture_at`), so that the verdict
# comes while the siblings are at their third calls too: decoding calls each length
# once per `generate()`, so every length reached its 5th call in the same (5th)
# `generate()`, which alone captured; the 3rd and 4th ran every step directly (H200,
# LLaMA batch 1: 3.27 ms a token there against 2.00 replaying).  A verdict that the
# replay lost still leaves each sibling to measure its own at `sized_capture_at`.
# False: the first measurement waits for `sized_capture_at` (needs sized_shared_verdict).
sized_early_verdict = True
# With sized_shared_verdict: the verdict is measured at the first set of sizes' first
# call (right after it, in the call that compiled: its direct call timed, a graph
# captured over its inputs, timed and dropped), and once it is kept a new set of sizes
# captures right after its first call, a bet that the set recurs (a server's lengths,
# decoding's in the next `generate()`); a set not captured so captures at its second
# call, untimed.  On the H200, BERT's 12 lengths called in rounds captured in the round
# of their third calls, at about 2.7 ms a length, which two rounds of replays (1.4 ms a
# call against 1.8 launching) did not earn back.  A bet that never replays (sizes seen
# once) costs a capture, about one direct call's launches, and the graph's outputs'
# memory until it is evicted (sized_fast_limit).  False: sets capture at their third
# call, and the first measurement is sized_early_verdict's.
sized_capture_first = True
# ... and such bets stop while those not replayed yet number this many more than the
# sets seen twice (sizes that never recur: a long prompt's decoding steps in a single
# generate()), and resume as sets recur.
sized_capture_first_limit = 16
# A graph whose direct call's host time is most of its wall time (cudagraphs.HOST_SATURATED,
# 80%) is captured and kept without timing a run before the capture and replays after
# it, at its third call: the replay's GPU work is the direct call's plus its copies, which
# cannot make up the host time it saves.  False: timed, as graphs between 50% and 80%
# are, at their `capture_at`.
graph_trust_saturated = True
# A capture runs on a side stream ordered after the current one by an event, without
# `torch.cuda.graph`'s device synchronize and `empty_cache` before each capture (the
# graphs draw from a pool of their own; the emptied cache made the calls after a capture
# allocate from the driver again).  False: through `torch.cuda.graph`.
graph_capture_direct = True

# torch.utils.checkpoint over random ops (dropout) on CUDA tensors compiles in the graph,
# its recompute restoring the CUDA generator's state around the Philox key it draws.
# Checked on CPU tensors (Triton's interpreter, tests/test_triton_rng.py) and on the
# H200 (gradients against the masks and noise the forward drew: 1024x4096 regions,
# preserve_rng_state on and off, reduce-overhead, max-autotune, bf16 autocast).  False:
# such a region runs in CPython on CUDA.
checkpoint_random_on_cuda = True

# Graphs with torch.Generator inputs compile: AOTAutograd's graph-safe RNG (CUDA,
# torch >= 2.11) hands a training graph whose checkpointed region draws random numbers
# (dropout, SDPA with dropout) one Generator per recomputed random op, and wraps each such
# op in graphsafe_run_with_rng_state(op, ..., rng_state=generator).  The generators pass
# through the wrapper to those calls (run as they are, never in kernels), which draw from
# them as eager does; the rest of the graph gets kernels.  False: such graphs run eagerly
# as a whole (their FX code, no kernels), as before.
generator_inputs = True

# erf by a short polynomial and one exp (absolute error < 1.5e-7) instead of libdevice's
fast_erf = True
# An erf whose result is rounded to bf16/fp16 (gelu on half inputs): one exp2 and a
# polynomial, no division (absolute error < 4.7e-6); needs fast_erf
half_erf = True

# Graphs with symbolic sizes (dynamic shapes) compile to kernels that take the sizes as
# int arguments; False: such graphs run with aot_eager
dynamic_shapes = True
# A view (reshape, transpose, slice, split, expand...) of a buffer with symbolic sizes is
# that buffer's memory with the strides and offset the graph's fake value of the view has,
# where the buffer's layout is the fake input's (compared symbolically, size-1 dims
# aside): the layout tracing computed, under the guards tracing installed.  Without it
# such a view is an index map, which an aten call (a matmul's input, attention's q/k/v)
# or an output stores with a copy kernel: BERT with a symbolic length had 3 copies of
# q/k/v and one of the attention output per layer, and its q/k/v strides differed from the
# static graph's, so cuDNN attention built a plan again for a length it had seen.  False:
# index maps for views of computed values (views of graph inputs take their fake layout
# either way: a returned view of an input with an offset, stored as a copy, came back
# wrong, AOTAutograd making the view again from the input with the copy's strides).
symbolic_views = True
# A symbolic size that is no polynomial of shape symbols (`(s0 - 1)//2 + 1` of a slice
# with a step, `s0//2` of a view's -1, a pooling's or a strided convolution's output size:
# FloorDiv, Mod, Max, Min...) stands for an opaque int symbol of its own, which the
# wrapper computes from the shape symbols once per call (derived.py) and kernels take as
# a size argument.  Without it one such size anywhere sent the whole graph to aot_eager:
# a CNN whose image size varies lost every kernel.  False: such graphs run with aot_eager,
# as before.
derived_sizes = True
# A graph output with symbolic sizes is stored with its traced strides (its fake value's,
# as expressions) where they lay it out densely in another order than row-major: a
# channels-last pooling or an op over a transposed or channels-last input returns eager's
# layout at every size, as static graphs do.  False: such outputs are stored in the
# layout of their dominant input where that is static, else row-major (strides unlike
# eager's; the values the same).
symbolic_output_strides = True

# Sizes that depend on the data (`nonzero`, `torch.where(mask)`, `x[mask]` under
# frametrace.config.capture_dynamic_output_shape_ops: a mixture of experts' tokens per
# expert) are read by the wrapper from the aten call that makes them, and kernels take
# them as int arguments, as other symbolic sizes.  Their size hint (block-size candidates)
# is this, within the size's known range; block sizes are picked per power-of-two bucket
# of the actual extent, not per value.  False: such graphs run with aot_eager.
unbacked_sizes = True
unbacked_size_hint = 8192

# Kernels with symbolic extents (a sequence length) pick block sizes per power-of-two
# bucket of the extents, as those of sizes the data decides do: a length met for the
# first time whose bucket was tuned launches with that bucket's choice instead of timing
# every candidate inside the call (~100 ms for a BERT forward's kernels; Inductor tunes a
# dynamic kernel once for all sizes).  True: tuned for each distinct extent.
tune_each_size = False
# A kernel with symbolic extents times its candidates for at most this many buckets (or
# extents, with tune_each_size); a bucket met after that launches with the choice of the
# nearest bucket tuned (in powers of two), so that a length first met after the warm-up
# compiles and times nothing inside the call (masks are always on and symbolic rows loop:
# every candidate computes every extent).  0: every bucket is tuned.
tuned_buckets = 4

# Convolutions on channels-last activations (cuDNN's NHWC kernels, no transposes around
# each conv; the epilogues then follow that layout): "auto" on CUDA when most of the
# graph's conv FLOPs are in convs that run faster so (as Inductor's layout optimization
# weighs them), True/False to force.  A backward graph's `convolution_backward`s are
# weighed and laid out alike: gradient, activation and a computed weight (an autocast
# copy) channels-last, so that cuDNN transposes none of them.
channels_last_convs = "auto"
# A training forward (static sizes) stores the values it saves for its backward in the
# layout it computed them in (a channels-last convolution's input stays channels-last),
# not in eager's: only the backward reads them, and it is built for the strides the
# forward chose (partition.py links the two graphs; a backward whose inputs still differ
# is built again at its first call).  False: saved values in eager's strides, a copy
# each where the forward computed another layout.
saved_values_own_layout = True

# More block-size and warp candidates per kernel shape, each timed on first launch
# (torch.compile's mode="max-autotune")
max_autotune = False

# A kernel of at most this many elements (xnumel * rnumel) is not autotuned: it runs for
# a few microseconds, bounded by its launch, whatever its block sizes, and timing its
# candidates costs their compiles (most of a first call's time).  It takes the heuristic
# default.  0: every kernel with several candidates is timed.  max_autotune times all.
autotune_min_elements = 1 << 16

# While a graph compiles (AOTAutograd, lowering, code generation, and its first call,
# which compiles and tunes the kernels), the garbage collector's youngest generation runs
# every this many net allocations instead of CPython's 700 (gc_pause.py): in
# EfficientNet-B0's first training step on the CPU the collector ran ~1,100 times for
# 2.2-2.6 s (~330 times, 0.8 s, with this; the first call 1.5-3 s shorter on a loaded
# 2-core machine).  0: thresholds untouched.
compile_gc_threshold = 50_000

# How many block-size candidates a kernel gets (autotune.few): each one a GPU times is a
# Triton compile (~0.1-0.3 s) in the first call.  "few": a pointwise or tiled kernel its
# heuristic default alone (two candidates from autotune.FEW_LARGE elements), a reduction
# two (three from FEW_LARGE), as Inductor's default policy; "all": every candidate of
# the kernel's class (3-6), as before.  max_autotune: all, and more.
autotune_candidates = "few"

# A static graph's kernels (every block-size candidate its first call would time) are
# compiled at once in `compile_threads` threads before that call launches them, from a
# dry run of its wrapper that records each launch's arguments (precompile.py): a ResNet-50
# training step compiled ~380 kernels one after another at their first launches.
# False: each compiles at its first launch.
precompile_kernels = True

# Threads that compile a kernel's block-size candidates at once before they are timed
# (Triton's compiler spends its time in MLIR/LLVM and ptxas, outside the GIL), and a
# graph's kernels ahead of its first call (precompile_kernels); 1: one compile at a time.
compile_threads = 8

# Kernels check each index they load (gather, index_select, embedding, x[idx], scatter)
# against the size it indexes, as eager does: a failed check is a device-side assert on
# CUDA (as Inductor's) and eager's exception under Triton's interpreter.  False: an index
# out of range reads or writes whatever memory it names.
check_indices = True

# Remember, for the rest of a compile, what the index helpers computed (indexing.py:
# simplify, flatten, unflatten, a buffer's index of an element), keyed on their arguments
# and the iteration ranges they depend on: the scheduler generates a kernel's code for each
# fusion candidate, and each generation asked again for the same indices.  Also each
# term's sympy.expand within simplify's (indexing._expand): a cat's parts are loaded with
# indices that share every term but the concatenated dimension's.  The results
# are the same either way (the helpers are pure functions of what the key holds);
# False computes each one every time.
memo_indexing = True

# The scheduler keeps each candidate kernel's generated code: a node joining a kernel
# continues that kernel's generation with the node's store (KernelCodegen.joined) instead
# of generating the whole kernel again, and the final kernel's source is the one its last
# join made.  Only where that is exactly what a fresh generation would do (the same
# iteration space and block sizes, a persistent kernel, the node not read before); the
# sources are the same either way.  False: every candidate is generated from scratch.
reuse_generations = True

# Training graphs save max pooling's indices as each max's offset in its window (int8)
# rather than its flat index (int64), the backward computing the index again (one byte
# saved an output element instead of eight, as Inductor's low-memory pooling): partition.py
# `pool_offsets`.  False: the indices are saved as they are.
pool_offsets = True

# A pointwise value that several kernels read and that is only a wider-float cast of
# another (bf16 -> fp32: the gradient BatchNorm's backward upcasts for its three kernels)
# is stored before the cast, in half the bytes, each reader casting it again.  Not the
# same numbers: the stored value is rounded to bf16 as eager's is, where the fp32 one
# kept the kernel's unrounded intermediate (a bottleneck block's three bf16 steps: as
# close to fp32 training as eager's, either way).  Off until the H200 says whether the
# backward's time and memory gain is worth it (optimize(options={"store_before_upcast": True})).
store_before_upcast = False

# GroupNorm (aten.native_group_norm) decomposes into a per-(sample, group) var_mean and
# one pointwise pass, which fuses with what follows (SiLU) instead of aten's kernel and a
# second pass over its output.  False: native_group_norm stays one aten call.
decompose_group_norm = True

# linalg.vector_norm of real floats (F.normalize, torch.norm) decomposes into a sum of
# powers (or an amax/amin of |x|) that fuses with its neighbours, as Inductor's does,
# instead of one aten call and a kernel reading its result.  False: it stays aten's.
decompose_vector_norm = True

# Random numbers (dropout's mask, rand, randn) take all four 32-bit words of each Philox
# call: counter c's number is word c % 4 of Philox at c // 4 (normal: the Box-Muller pair
# of words holding it, cos then sin), and a 1-D kernel makes four lanes' numbers with one
# call (as Inductor's rand4x), a quarter of the integer work that dropout is bound by on
# the GPU.  False: one call per number, its first word (tl.rand's stream).  Proven on
# both sides: on the H200, tests/test_triton_rng.py's CUDA fill kernel draws the eager
# op's numbers with it on and off, and dropout added to a residual (16384 x 4096 bf16)
# takes 0.103 ms against 0.218 off and Inductor's 0.222; on the CPU, Triton's interpreter
# draws the same numbers as the eager op on both paths, bit for bit
# (tests/test_triton_kernel_classes.py).
philox_four_words = True

# A value that reads both the kernel being built and an earlier kernel whose iteration
# space it shares moves the kernel being built before the earlier one (when that one
# does not feed it), and joins the earlier one: a masked mean's mask sum runs first and
# the big sum's kernel divides by it (two kernels, the sum not stored and read back for a
# third).  False: such a value starts a kernel of its own.
hoist_kernels = True

# Max pooling whose indices nothing reads (inference) computes the window's max alone:
# each tap one compare and one select, instead of also carrying the tap's flat index and
# testing for the first valid tap (which only the index needs).  The window's row and
# column bounds are tested once each either way.  False: the max comes from the same
# chain as the indices.
pool_max_alone = True

# On CUDA, that max is the hardware's NaN-propagating max (max.NaN: one instruction a tap,
# not a compare, a NaN test and a select): 3x3 stride-2 pooling of 64x256x112x112 bf16 on
# the H200 took 192 us against 212 (Inductor's, which does the same: 202).  NaN wins as in
# eager; a tie of -0.0 and 0.0 gives 0.0 where eager's CUDA kernel keeps the first tap.
# False: the compare and select, eager's tie to the zero's sign.
pool_hardware_max = True

# A pointwise value whose inputs are one full-size tensor and small broadcast ones (a
# log_softmax: the row, its max and log-sum-exp) counts only the full-size loads when
# deciding whether a value that two kernels read is stored or computed in each: the
# small ones come from cache.  False: every input counts as a full load (such values
# are stored: one write and a read per reader instead of a read of the row).
broadcast_reads_cached = True

# Deciding whether a reduction is inner or outer (contiguity.py), a load that stays on the
# same element at most steps of x or of r (a [batch, length] mask broadcast over the
# hidden columns of a masked mean) has no vote, as loads indexed by one axis alone have
# none: it is small and cached while the full-size loads stream.  False: it votes for the
# axis it is contiguous along (the masked mean's tile then ran across the columns of its
# [batch, length, hidden] input with a stride of `hidden`: 1.4x Inductor's time).
broadcast_reads_abstain = True

# A pointwise kernel none of whose full-size loads is contiguous along x (a pooling
# window's taps, a strided slice) takes block sizes of two elements a thread
# (autotune.gather_candidates) instead of eight: without vector loads, more elements a
# thread only spread each warp's load over more memory (max pooling: 254 against 538 us).
# False: the contiguous kernels' block sizes.
gather_blocks = True

# A sum, max or min over rows and more (a full sum, a batchmean loss: the KL divergence
# of two log_softmaxes) whose summand reads per-row values of a row reduction over the
# same rows (the log_softmax's max and log-sum-exp) reduces each row first, in a further
# loop over the row of the kernel that computes those values (the row still in cache,
# each per-row expression of them computed once a row), then the rows' partials in a
# small kernel (row_partials.py; graphs of static sizes).  False: it is reduced as one
# flat reduction, split into chunks, in a kernel of its own that reads the inputs again
# and each element's row values through `index // row length`.
row_partials = True

# A variance over rows too long for registers (a looped reduction: GroupNorm's groups,
# BatchNorm's per-channel statistics when not split, LayerNorm over long rows, var/std)
# reads each row once: each lane keeps Welford's running mean and centred sum of
# squares (M2) beside the plain sum the mean comes from (the mean is the two-pass
# form's, bit for bit), and the lanes' (mean, M2, count) combine by Chan's formula
# (kernel_source's `_welford`), instead of a second loop reading the row again for the
# squares about the mean (GroupNorm+SiLU of 32x512x64x64 fp16 on the H200 read x three
# times: 139 us against Inductor's 128 with one Welford pass).  Rows in registers keep
# the two passes, the second from registers.  False: the second loop, as before.
welford = True

# With `welford`, a var_mean's mean (GroupNorm's, LayerNorm's, training BatchNorm's
# statistics) is Welford's own running mean, times the row's length for the sum the
# mean is, instead of a fourth accumulator keeping the plain sum beside it: eager's
# CUDA var_mean is Welford's too.  The mean then differs from the plain sum's in its
# last bits, and a row holding an infinity has a NaN mean (as its variance is NaN).
# Only the var_mean's own mean takes it; a user's separate `mean()` is another
# reduction.  H200, group norm + SiLU of 32x512x64x64 fp16: 0.123 ms against 0.130
# with the fourth accumulator (Inductor 0.127).  False: the fourth accumulator.
welford_mean = True

# True: a looped kernel that reads an input in more than one loop over the row (a looped
# norm: the statistics, then the output) loads it with `evict_last` in all but its last
# loop, so the row stays in L2 for the next, and `evict_first` in the last, where it is
# read for the last time (Inductor's rule for reductions); an input read in one loop
# only (a per-channel weight) takes no hint.  Off: on the H200 the hints slowed group
# norm + SiLU of 32x512x64x64 fp16 (rows of 128 KB: 0.127 ms against 0.123 without), and
# they paid only in a hand-written L2 normalisation of 16 KB fp32 rows looped once
# (125.8 us against 130.1), which the persistent kernel we make for those rows is not.
eviction_hints = False

# A persistent kernel with one reduction (an L2 or RMS norm: a sum of squares, then the
# row scaled) loads its row again after the reduction, where the row is used next,
# instead of keeping it in registers across it: the first load keeps the row in L2
# (`evict_last`), the second lets it go (`evict_first`).  H200 (benchmarks/
# triton_kernels.py --ablate persistent_reload, one process): L2 normalisation of
# 16384x4096 fp32 0.1270 ms against 0.1291 (Inductor 0.1268); add + RMSNorm 16384x4096
# bf16 0.1288 against 0.1345.  Kernels of chained reductions keep their rows: reloading
# once per reduction measured slower there (softmax 0.081 against 0.068 ms, var_mean
# over channels 0.035 against 0.030).  False: rows stay in registers.
persistent_reload = True

# torch.compile's `mode=` names, as settings of this backend:
# `frametrace.optimize(f, backend="triton", mode="reduce-overhead")`
MODES = {
    "default": {},
    "reduce-overhead": {"cudagraphs": True, "cudagraph_min_launches": 1},
    "max-autotune": {"max_autotune": True, "cudagraphs": True, "cudagraph_min_launches": 1},
    "max-autotune-no-cudagraphs": {"max_autotune": True, "cudagraphs": False},
}


def settings() -> dict:
    """Every setting of this module and its current value."""
    return {k: v for k, v in globals().items()
            if not k.startswith("_") and k.islower() and isinstance(v, (bool, int, float, str))}
