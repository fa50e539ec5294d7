"""An engine-side process for the tests: attaches (and optionally begins), says so on stdout,
then waits to be killed. Speaks the socket protocol only (no sglang import, so it is cheap).

Usage: python -m tests.daemon_adapter.engine_proc SOCKET ENGINE_ID [LAYER ...]
"""

from __future__ import annotations

import json
import sys
import time

from tools.harness.daemon_proc import attach, request

from layout_sm.messages import begin_request


def main() -> None:
    socket_path, engine_id, *layers = sys.argv[1:]
    conn, reply = attach(socket_path, engine_id)
    result = {"attach": reply}
    if layers:
        begin = begin_request(engine_id, reply["session"], 0, [int(layer) for layer in layers])
        result["begin"] = request(socket_path, begin)
    print(json.dumps(result), flush=True)
    while True:  # hold the attach connection until killed
        time.sleep(3600)
    conn.close()


if __name__ == "__main__":
    main()
