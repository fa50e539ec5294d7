"""``make bench``: the protocol's costs, each a ratio to a floor measured in the same run.

``protocol``: the protocol-only parts (chunk, startup, daemon-side checks); ``real``: the part on real
``python -m sglang.launch_server`` servers. ``python -m tools.bench`` runs both.
"""
