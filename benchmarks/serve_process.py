"""`spot serve` as a child process for the serving benchmarks: started on a free port, its URL read from its log."""
from __future__ import annotations

import re
import subprocess
import sys
import threading
from pathlib import Path


def start_server(options: list[str], cwd: Path, env: dict) -> tuple[subprocess.Popen, str]:
    """`python -m spot serve --port 0 OPTIONS` in `cwd` with `env`; (the process, its base URL) once it listens.
    Its stderr is drained on a thread after that, so a chatty server never blocks on a full pipe."""
    proc = subprocess.Popen([sys.executable, "-m", "spot", "serve", "--port", "0", *options], cwd=cwd, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines = []
    for line in proc.stderr:
        lines.append(line)
        found = re.search(r" on (http://\S+) ", line)
        if found:
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()   # keep draining
            return proc, found.group(1)
    raise SystemExit(f"spot serve ({cwd}) did not start:\n" + "".join(lines))
