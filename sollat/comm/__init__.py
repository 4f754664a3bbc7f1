"""The communicator core: one definition of every public op (``api.py``) over the state and the
steps every call shares (``base.py``), built from plain parts (``ranks.py``: the launch ranks;
``state.py``: the device memory; ``plan.py`` with ``fitting.py``: the launch plans), served by two
thin faces: ``real.py`` (``Communicator``, one process per GPU) and ``virtual.py``
(``VirtualCommunicator``, R ranks on one GPU)."""
