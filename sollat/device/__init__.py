"""The host side of sollat's host-device contract.

What the CUDA code and Python must agree on (``abi``: limits, the communicator state block, kernel
parameters, the fault record; ``abi_layout``/``layout``: slot, line and region arithmetic), the
element types (``dtypes``), the run-time build of ``csrc/`` with NVRTC (``build``), launches
(``launch``, ``driver_launch``), fault decoding (``faults``) and the link topology (``topology``).
Imports nothing of sollat but ``sollat.errors``.
"""
