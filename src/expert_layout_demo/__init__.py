"""``python -m expert_layout_demo``: the upstream GPU cases of the expert-layout protocol, on CPU.

Real daemon processes and 2-rank engine processes over gloo share the toy MoE's weights through
sglang's own ``torch_ipc`` transport (``file_system`` sharing); see ``shm_proof`` for why that
works on CPU, ``scenarios`` for the cases, and ``bench`` for ``make bench``.
"""
