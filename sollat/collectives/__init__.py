"""What each collective is, whoever runs it: the algorithm registry (``algorithms``), selection
(``select``, ``handover``), the fused AllReduce + RMSNorm (``rmsnorm*``), AllGather and
ReduceScatter (``gather_scatter``), user-written collectives (``custom``), argument checks
(``validate``), the ``torch.library`` ops (``ops``, ``registry``) and the kernel instantiations
(``instantiations``). Imports ``sollat.device`` and ``sollat.errors``, never a communicator.
"""
