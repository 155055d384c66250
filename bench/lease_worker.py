"""One worker in a process of its own, without Ray: the GPU check's served_over_tls part runs it
beside the controller that the check's own process holds.

    python bench/lease_worker.py < spec.json

The first line on stdin is the WorkerSpec as JSON (`WorkerSpec.from_dict`; the worker's TLS key
travels there rather than in argv, where any process could read it). Once the worker is serving
(verified by the controller), rejected or failed, one JSON line on stdout gives its status
(`WorkerRuntime.status()`); the next line on stdin, or its end, stops it. Logs go to stderr.
"""

from __future__ import annotations

import json
import logging
import sys

from intentserve.worker.runtime.lifecycle import Phase, WorkerRuntime
from intentserve.worker.runtime.spec import WorkerSpec


def main() -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    spec = WorkerSpec.from_dict(json.loads(sys.stdin.readline()))
    runtime = WorkerRuntime(spec).start()
    try:
        runtime.wait_for(Phase.SERVING, Phase.REJECTED, Phase.FAILED)
        print(json.dumps(runtime.status()), flush=True)
        sys.stdin.readline()  # the owner's word to stop (or its end of the pipe)
    finally:
        runtime.stop(grace_s=0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
