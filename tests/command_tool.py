"""The console scripts as a user types them, for tests/conftest.py's cli fixtures: each run in a process of its own, or
several `graphbridge` commands one after another in one process (Tool.many)."""

import json
import subprocess
import sys
from pathlib import Path
from typing import Optional

# The console scripts by module, so that a checkout that is not installed (the GPU machine) runs them too.
ENTRY_POINTS = {
    "graphbridge": "from perf.main import main; main()",
    "graphbridge-workload": "from perf.workload import main; main()",
    "graphbridge-report": "import sys; from perf.report import main; sys.exit(main())",  # as its console script
}


MANY = """
import contextlib, io, json, sys
from hydra.core.global_hydra import GlobalHydra
import perf.main
from perf import callbacks
done = []
for argv in json.loads(sys.stdin.read()):
    sys.argv = [sys.argv[0], *argv]
    perf.main.STARTED, callbacks.SWEEP_EXIT_CODE = False, 0
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            perf.main.main()
            code = 0
        except SystemExit as exit:
            code = exit.code
            if code is not None and not isinstance(code, int):
                print(code, file=sys.stderr)  # a message, as Python prints it, and status 1
                code = 1
    GlobalHydra.instance().clear()
    done.append([code or 0, out.getvalue(), err.getvalue()])
print("\\n" + MARK + json.dumps(done))
"""
MANY_MARK = "graphbridge-tests: results of each command: "


class Tool:
    """A console script as a user types it: ``tool(*args, cwd=...)`` runs it to the end and captures its
    output; ``tool.start(*args, cwd=..., **popen)`` starts it in the background (to signal it, or run a
    second one beside it); ``tool.argv`` is the command itself, for a test that runs it inside another.
    ``tool.many([args, ...], cwd=...)``: several `graphbridge` commands one after another in one process, each with
    its own output and exit status, for a test that reads only what each prints (plans and refusals; not a run,
    whose processes and files are its own)."""

    def __init__(self, name: str):
        self.name, self.argv = name, [sys.executable, "-c", ENTRY_POINTS[name]]

    def __call__(self, *args: str, cwd: Path, env: Optional[dict] = None, timeout: float = 300,
                 input: Optional[str] = None) -> subprocess.CompletedProcess:
        return subprocess.run([*self.argv, *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=timeout,
                              input=input)

    def many(self, commands, cwd: Path, env: Optional[dict] = None, timeout: float = 600):
        """The CompletedProcess of each command (a sequence of arguments), as ``tool(*args)`` would give it."""
        commands = [list(args) for args in commands]
        assert self.name == "graphbridge"
        done = subprocess.run([sys.executable, "-c", f"MARK = {MANY_MARK!r}\n{MANY}"], cwd=cwd, capture_output=True,
                              text=True, env=env, timeout=timeout, input=json.dumps(commands))
        assert done.returncode == 0 and MANY_MARK in done.stdout, done.stdout[-2000:] + done.stderr[-3000:]
        results = json.loads(done.stdout.rsplit(MANY_MARK, 1)[1])
        return [subprocess.CompletedProcess([*self.argv, *args], code, stdout, stderr)
                for args, (code, stdout, stderr) in zip(commands, results)]

    def start(self, *args: str, cwd: Path, **popen) -> subprocess.Popen:
        return subprocess.Popen([*self.argv, *args], cwd=cwd, **popen)
