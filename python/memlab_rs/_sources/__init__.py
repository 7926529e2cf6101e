"""Where memory numbers come from, on the Python side: a floor below the rooms (the trace,
the line profiler, the monitor, the estimate use it; it uses no room).

- ``cuda_history``: torch's CUDA allocation history: on and off, the layout when recording
  starts, the snapshot without its first-call cost;
- ``cpu_source``: the CPU source's torch side (libc10's path, the probe, the baseline),
  registered with the Rust core (``src/sources/cpu``) when imported;
- ``cpu_dispatch``: the CPU source's fallback, a dispatch mode counting operator outputs.
"""
