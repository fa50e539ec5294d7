"""``make chaos``: seeded fault schedules on the harness, every trace checked against the protocol."""
