"""The communicator core: one definition of every public op (``api.py``) over the shared
planning and launch (``base.py``, with the device state in ``state.py``), served by two thin
faces: ``real.py`` (``Communicator``, one process per GPU) and ``virtual.py``
(``VirtualCommunicator``, R ranks on one GPU)."""
