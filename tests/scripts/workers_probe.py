"""A worker for the launcher's tests, without TensorFlow.

    python workers_probe.py echo
    python workers_probe.py hold PIDS_DIR [--die WORKER CODE|kill] [--child]

echo prints this worker's TFREPRO_WORKER and TF_CONFIG task, then one line on stderr, and exits 0.
hold writes its pid (and, with --child, the pid of a `sleep` it starts) to PIDS_DIR/K.pids, then
sleeps; with --die, worker WORKER exits with CODE (or SIGKILLs itself) once every worker is holding.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

worker = int(os.environ["TFREPRO_WORKER"])
if sys.argv[1] == "echo":
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    print(f"worker={worker} task={task['type']}:{task['index']} cluster={os.environ['TF_CONFIG']}")
    print(f"stderr of {worker}", file=sys.stderr)
    sys.exit(0)

pids = Path(sys.argv[2])
mine = [os.getpid()]
if "--child" in sys.argv:
    mine.append(subprocess.Popen(["sleep", "120"]).pid)
(pids / f"{worker}.part").write_text(" ".join(map(str, mine)))
os.replace(pids / f"{worker}.part", pids / f"{worker}.pids")  # whole when it appears: the tests poll for it
print("holding", flush=True)
if "--die" in sys.argv:
    index = sys.argv.index("--die")
    who, how = int(sys.argv[index + 1]), sys.argv[index + 2]
    if who == worker:
        while len(list(pids.glob("*.pids"))) < 2:
            time.sleep(0.05)
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        sys.exit(int(how))
time.sleep(120)
