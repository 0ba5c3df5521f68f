"""Settings of the triton backend (module attributes; change them before compiling)."""

# Rows up to this many elements stay in registers (one pass over memory); longer rows
# loop.  8192 bf16 (a softmax row) fits comfortably in 16 warps.
persistent_rblock_max = 16384

# Replay CUDA graphs of this many launches or more as one CUDA graph: a generated
# wrapper's Python costs tens of microseconds a launch, more than small kernels run.
cudagraphs = True
cudagraph_min_launches = 8

# erf by a short polynomial and one exp (absolute error < 1.5e-7) instead of libdevice's
fast_erf = True
