"""``make demo-harness``: the demo's cases on the in-process harness (``lab``: the setup, ``cases``: one row
each, ``rank_scripts``: what the engine rank processes run)."""
