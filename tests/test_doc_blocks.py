"""Documentation that runs: every fenced Python block of README.md and docs/*.md, run as a reader
would run it, and what it prints checked against what the page shows.

Each page's Python blocks run in order, in one namespace, in a fresh process whose working
directory is an empty temporary folder (tests/scripts/doc_page.py runs them; the environment
adds KERAS_BACKEND=torch, PYTHONHASHSEED=0, OMP_NUM_THREADS=1 and the Hugging Face offline
switches). A page fails with its name (the test's id) and the page's own line numbers. Pages run
side by side (FITKIT_DOC_BLOCK_WORKERS, default: the CPU count up to 4), each within
FITKIT_DOC_BLOCK_TIMEOUT seconds (default 60). Each page's process is forked from a process
that imported torch, fitkit, torchmetrics and scikit-learn's datasets already (nearly every page
imports them, about 8 s of CPU time each); its namespace is empty all the same, so a name a page
forgets to import still fails (only a submodule of those packages used as an attribute without
its own import, `sklearn.datasets` after `import sklearn`, would pass here and not in a fresh
interpreter). FITKIT_DOC_BLOCK_PRELOAD=0 starts each page in an interpreter of its own instead.

What a page marks, with an HTML comment on the line before a fence (invisible on the site and on
GitHub):

- `<!-- skip: why -->` before a Python block: not run (a GPU, a cluster, a server, a download...).
  The reason is required; each skipped block is reported as a skipped test with it.
- `<!-- signature -->` before a Python block holding one call, `Name(a, b=1, **rest)`: not run,
  but checked against the real signature of `Name` (as the page's earlier blocks define it):
  the same parameters in the same order with the same defaults, and all of them unless the call
  ends with `**name`.
- `<!-- output -->` before a ```text (or plain ```) block: what the Python block just before it
  prints, stdout and stderr as a terminal shows them, line for line (trailing spaces and blank
  lines aside). `...` matches any text within a line, and a line of its own `...` any number of
  lines (doctest's ellipsis).
  `<!-- output: numbers vary -->`: the same, where each number (`-0.12`, `97`, `1.5e-05`) stands
  for any number: the wording and layout are exact, the figures are not.

And in a Python block, a top-level expression followed by `# -> value` is checked: `repr` of the
expression must match `value` (`...` as above), e.g. `model.predict(x).shape  # -> torch.Size([64, 3])`.

A comment right before a fence that is none of these is an error, and so is a plain or ```text
block right after a Python block without a marker (say whether it is the output).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import difflib
import glob
import json
import os
import queue
import re
import select
import signal
import subprocess
import sys
import threading
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNNER = os.path.join(ROOT, "tests", "scripts", "doc_page.py")
PAGES = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
#: seconds a page may take; every page's data is small
TIMEOUT = float(os.environ.get("FITKIT_DOC_BLOCK_TIMEOUT", "60"))
#: pages run side by side (each process is one thread busy, mostly)
WORKERS = int(os.environ.get("FITKIT_DOC_BLOCK_WORKERS", str(min(4, os.cpu_count() or 1))))
#: pages known to fail, each with the fix it waits for (strict: once the page runs, drop its entry)
KNOWN_FAILURES: dict[str, str] = {}

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`\s]*)")
COMMENT = re.compile(r"^\s*<!--(?P<body>.*?)-->\s*$")
MARKER = re.compile(r"^\s*(?P<kind>[a-z]+)\s*(?::\s*(?P<arg>.*?))?\s*$")
PYTHON = {"python", "py", "python3"}
TEXT = {"", "text"}
NUMBER = r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"


class PageError(Exception):
    """A page whose markers are wrong (unknown, a skip without a reason, an output of nothing)."""


@dataclasses.dataclass
class Block:
    page: str
    line: int  # the opening fence's line, 1-based
    lang: str
    source: str
    kind: str = "run"  # Python blocks: "run", "skip" or "signature"; others: "output" or "other"
    reason: str | None = None  # why a block is skipped
    output: Block | None = None  # the output block a Python block's printing is checked against
    numbers_vary: bool = False  # an output block whose numbers stand for any number

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def parse(page: str, text: str) -> list[Block]:
    """The fenced blocks of a page, with their markers checked; raises PageError."""
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    previous_end = -1  # the line index of the previous block's closing fence
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence, info = match.group("indent"), match.group("fence"), match.group("info").lower()
        closing = re.compile(rf"[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*")
        end = i + 1
        while end < len(lines) and not closing.fullmatch(lines[end]):
            end += 1
        if end == len(lines):
            raise PageError(f"{page}:{i + 1}: the fence is never closed")
        body = [line[len(indent):] if line.startswith(indent) else line.lstrip() for line in lines[i + 1:end]]
        block = Block(page, i + 1, info, "\n".join(body) + "\n")
        _mark(block, _marker(page, lines, i), blocks, lines, previous_end)
        blocks.append(block)
        previous_end = end
        i = end + 1
    return blocks


def _marker(page: str, lines: list[str], fence: int) -> tuple[str, str | None] | None:
    k = fence - 1
    while k >= 0 and not lines[k].strip():
        k -= 1
    if k < 0 or not lines[k].lstrip().startswith("<!--"):
        return None
    comment = COMMENT.match(lines[k])
    marker = MARKER.match(comment.group("body")) if comment else None
    if marker is None:
        raise PageError(f"{page}:{k + 1}: a comment before a fence must be one marker on one line "
                        f"(`<!-- skip: why -->`, `<!-- signature -->`, `<!-- output -->`): {lines[k].strip()!r}")
    return marker.group("kind"), marker.group("arg")


def _mark(block: Block, marker, blocks: list[Block], lines: list[str], previous_end: int) -> None:
    kind, arg = marker if marker else (None, None)
    where = block.where
    if block.lang in PYTHON:
        if kind is None:
            return
        if kind == "skip":
            if not arg:
                raise PageError(f"{where}: `<!-- skip -->` needs its reason: `<!-- skip: needs a GPU -->`")
            block.kind, block.reason = "skip", arg
        elif kind == "signature" and not arg:
            block.kind = "signature"
        else:
            raise PageError(f"{where}: unknown marker {kind!r} before a Python block "
                            "(`<!-- skip: why -->` or `<!-- signature -->`)")
        return
    if kind is None:
        last = blocks[-1] if blocks else None
        between = lines[previous_end + 1:block.line - 1]
        if block.lang in TEXT and last is not None and last.lang in PYTHON and not any(s.strip() for s in between):
            raise PageError(f"{where}: a block right after the Python block of line {last.line}: mark it "
                            "`<!-- output -->` (checked against what that block prints), or say in a sentence "
                            "between them what it is")
        block.kind = "other"
        return
    if kind != "output" or arg not in (None, "numbers vary"):
        raise PageError(f"{where}: unknown marker {kind}{': ' + arg if arg else ''} before a {block.lang or 'plain'} "
                        "block (`<!-- output -->` or `<!-- output: numbers vary -->`)")
    if block.lang not in TEXT:
        raise PageError(f"{where}: an output block is ```text or a plain ```, not {block.lang!r}")
    last = blocks[-1] if blocks else None
    if last is None or last.lang not in PYTHON or last.kind == "signature":
        raise PageError(f"{where}: an output block follows the Python block whose printing it shows")
    if last.output is not None:
        raise PageError(f"{where}: the block of line {last.line} has an output block already")
    block.kind, block.numbers_vary = "output", arg == "numbers vary"
    last.output = block


def matches(expected: str, actual: str, numbers_vary: bool = False) -> bool:
    """`actual` shows what `expected` does: lines compared without trailing spaces and trailing
    blank lines; `...` matches any text in a line, a line `...` any lines; with `numbers_vary`,
    each number in `expected` matches any number."""
    tokens = rf"(\.\.\.|{NUMBER})" if numbers_vary else r"(\.\.\.)"
    parts = []
    for line in _lines(expected):
        if line.strip() == "...":
            parts.append(r"(?:[^\n]*\n)*?")
            continue
        pattern = ""
        for token in re.split(tokens, line):
            if token == "...":
                pattern += r"[^\n]*?"
            elif numbers_vary and token and re.fullmatch(NUMBER, token):
                pattern += NUMBER
            else:
                pattern += re.escape(token)
        parts.append(pattern + r"\n")
    return re.fullmatch("".join(parts), "".join(line + "\n" for line in _lines(actual))) is not None


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _diff(expected: str, actual: str) -> str:
    return "\n".join(difflib.unified_diff(_lines(expected), _lines(actual), "the page shows", "the block printed",
                                          lineterm=""))


def _blocks(page: str) -> list[Block]:
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        return parse(page, f.read())


def _skipped() -> list:
    cases = []
    for page in PAGES:
        try:
            blocks = _blocks(page)
        except PageError:
            continue  # test_page_runs_as_shown reports it
        cases += [pytest.param(f"{b.where}: {b.reason}", id=b.where) for b in blocks if b.kind == "skip"]
    return cases


#: the environment of every page (and of the preloaded processes pages fork from); one intra-op
#: thread: the pages' networks are tiny, pages run side by side, and on a busy machine torch's
#: spinning threads multiply a step's time (values agree to float rounding)
ENV = {"KERAS_BACKEND": "torch", "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
       "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
#: "0": each page in an interpreter of its own, importing everything itself (as a reader's script
#: does; about 8 s more CPU time a page) instead of a child forked from a preloaded process
PRELOAD = os.environ.get("FITKIT_DOC_BLOCK_PRELOAD", "1") != "0"


class Preloaded:
    """A `doc_page.py --serve` process: the pages forked from it skip the imports every page makes."""

    def __init__(self, folder: str):
        self.log = os.path.join(folder, "server.log")
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen([sys.executable, RUNNER, "--serve"], cwd=folder, env={**os.environ, **ENV},
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
        self.buffer = b""
        if self._read(300) != {"ready": True}:
            raise RuntimeError(f"the preloading process did not start in 300 s: {self._log()}")

    def run(self, spec: str, result: str, cwd: str, log: str) -> bool:
        """Runs one page in a child; True when it ran past TIMEOUT (and was killed)."""
        request = {"spec": spec, "result": result, "cwd": cwd, "log": log}
        self.proc.stdin.write(json.dumps(request).encode() + b"\n")
        self.proc.stdin.flush()
        pid = self._read(60)["pid"]
        reply = self._read(TIMEOUT)
        if reply is None:
            _kill(pid)
            reply = self._read(60)
            if reply is None:
                raise RuntimeError(f"the preloading process stopped answering: {self._log()}")
            return True
        return False

    def close(self) -> None:
        self.proc.kill()  # between pages it holds nothing: no need to wait for its interpreter's shutdown
        self.proc.wait()
        self.proc.stdin.close()
        self.proc.stdout.close()

    def _read(self, timeout: float) -> dict | None:
        """Its next JSON line, or None after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.proc.stdout], [], [], left)[0]:
                return None
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            if not chunk:
                raise RuntimeError(f"the preloading process ended: {self._log()}")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def _log(self) -> str:
        with open(self.log) as f:
            return f.read()[-3000:]


def _kill(pid: int) -> None:
    """A page's process and the processes it started (its session)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_page(page: str, blocks: list[Block], folder: str, server: Preloaded | None = None) -> dict:
    """Runs the page's blocks in a fresh process whose working directory is `folder`/cwd, empty,
    forked from `server` or started afresh: {"results", "log" (what the process printed outside
    the blocks), "timed_out", "meta" (the folder of its files)}."""
    cwd, meta = os.path.join(folder, "cwd"), os.path.join(folder, "meta")
    os.makedirs(cwd)
    os.makedirs(meta)
    spec, result, log = (os.path.join(meta, name) for name in ("blocks.json", "results.json", "process.log"))
    with open(spec, "w") as f:
        json.dump({"page": os.path.join(ROOT, page),
                   "blocks": [{"line": b.line, "kind": b.kind, "source": b.source} for b in blocks]}, f)
    if server is not None:
        timed_out = server.run(spec, result, cwd, log)
    else:
        with open(log, "w") as out:
            proc = subprocess.Popen([sys.executable, RUNNER, spec, result], cwd=cwd, env={**os.environ, **ENV},
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
        try:
            proc.wait(timeout=TIMEOUT)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill(proc.pid)
            proc.wait()
    results = []
    if os.path.exists(result):
        with open(result) as f:
            results = json.load(f)
    return {"results": results, "log": _read(log), "timed_out": timed_out, "meta": meta}


@pytest.fixture(scope="module")
def page_runs(request, tmp_path_factory):
    """The selected pages, run WORKERS at a time from the first test on (each worker forks its
    pages from a preloaded process of its own); `page_runs(page)` waits for one page's run."""
    selected = [item.callspec.params["page"] for item in request.session.items
                if getattr(item, "originalname", None) == "test_page_runs_as_shown"]
    todo = [(page, _runnable(page)) for page in selected]
    todo = [(page, blocks) for page, blocks in todo if blocks]
    servers: queue.Queue = queue.Queue()
    started: list[Preloaded] = []
    lock = threading.Lock()

    def folder(name: str) -> str:
        with lock:  # pytest's temporary folders are made by one thread at a time
            return str(tmp_path_factory.mktemp(name))

    def run(page: str, blocks: list[Block]) -> dict:
        where = folder(os.path.basename(page).replace(".", "_"))
        if not PRELOAD:
            return run_page(page, blocks, where)
        try:
            server = servers.get_nowait()
        except queue.Empty:
            server = Preloaded(folder("preloaded"))
            with lock:
                started.append(server)
        try:
            return run_page(page, blocks, where, server)
        finally:
            servers.put(server)

    tmp_path_factory.getbasetemp()  # made (and an old one removed) before the threads start
    pool = concurrent.futures.ThreadPoolExecutor(max(1, min(WORKERS, len(todo))))
    futures = {page: pool.submit(run, page, blocks) for page, blocks in todo}
    yield lambda page: futures[page].result()
    for future in futures.values():
        future.cancel()
    pool.shutdown()
    for server in started:
        server.close()


def _runnable(page: str) -> list[Block]:
    try:
        blocks = _blocks(page)
    except PageError:
        return []  # the test reports it
    return [b for b in blocks if b.lang in PYTHON and b.kind in ("run", "signature")]


def _page_params() -> list:
    return [pytest.param(page, id=os.path.basename(page),
                         marks=[pytest.mark.xfail(reason=KNOWN_FAILURES[page], strict=True)] if page in KNOWN_FAILURES
                         else []) for page in PAGES]


@pytest.mark.parametrize("page", _page_params())
def test_page_runs_as_shown(page, page_runs):
    try:
        _blocks(page)
        wrong = None
    except PageError as error:
        wrong = str(error)
    if wrong:
        pytest.fail(wrong, pytrace=False)
    runnable = _runnable(page)
    if not runnable:
        return
    run = page_runs(page)
    results = run["results"]
    problems = []
    for block, result in zip(runnable, results):
        if result["error"]:
            problems.append(f"{block.where}: the block raised\n{result['error']}" + _tail("its output", result["output"]))
            break
        if result["seconds"] is None:  # begun, never finished
            why = f"ran past {TIMEOUT:.0f} s" if run["timed_out"] else "the process died"
            problems.append(f"{block.where}: {why} in this block"
                            + _tail("its output", _read(os.path.join(run["meta"], f"output-{block.line}.txt"))))
            break
        problems += [f"{block.where}: {problem}" for problem in result["signature"]]
        for line, expected, got in result["arrows"]:
            if not matches(expected, got):
                problems.append(f"{page}:{line}: `# -> {expected}`, but the value is {got}")
        if block.output is not None and not matches(block.output.source, result["output"], block.output.numbers_vary):
            problems.append(f"{block.where}: the output shown at line {block.output.line} differs from what the "
                            f"block printed:\n{_diff(block.output.source, result['output'])}")
    else:
        if len(results) < len(runnable):
            problems.append(f"{runnable[len(results)].where}: never ran (the process ended before it)")
    if problems:
        pytest.fail("\n\n".join(problems) + _tail("the process's own output", run["log"]), pytrace=False)


def _read(path: str) -> str:
    if not os.path.exists(path):
        return ""
    with open(path, errors="replace") as f:
        return f.read()


def _tail(title: str, text: str, size: int = 3000) -> str:
    return f"\n{title} (the end):\n{text[-size:]}" if text.strip() else ""


@pytest.mark.parametrize("reason", _skipped())
def test_skipped_block(reason):
    pytest.skip(reason)


# -- the markers themselves ---------------------------------------------------------------------------------
def test_markers_are_read_and_checked():
    page = ("```python\nx = 1\n```\n\n<!-- output -->\n```text\n1\n```\n\n<!-- skip: needs a GPU -->\n"
            "```python\ncuda()\n```\n\n<!-- signature -->\n```python\nf(a, b=1)\n```\n")
    run, output, skipped, signature = parse("p.md", page)
    assert run.kind == "run" and run.output is output and output.source == "1\n"
    assert skipped.kind == "skip" and skipped.reason == "needs a GPU" and skipped.line == 11
    assert signature.kind == "signature"
    for wrong, message in [("<!-- skip -->\n```python\nx\n```\n", "needs its reason"),
                           ("<!-- skip:   -->\n```python\nx\n```\n", "needs its reason"),
                           ("<!-- skpi: why -->\n```python\nx\n```\n", "unknown marker"),
                           ("<!-- output -->\n```text\nx\n```\n", "follows the Python block"),
                           ("```python\nx\n```\n\n```text\n1\n```\n", "mark it `<!-- output -->`"),
                           ("```python\nx\n```\n<!-- output: roughly -->\n```text\n1\n```\n", "unknown marker"),
                           ("```python\nx\n", "never closed")]:
        with pytest.raises(PageError, match=re.escape(message)):
            parse("p.md", wrong)


def test_output_matching():
    assert matches("a\nb  \n\n", "a\nb\n")
    assert not matches("a\nb\n", "a\nb\nc\n")
    assert matches("loss: 0.1234 - 12ms/step\n", "loss: 0.0871 - 3ms/step\n", numbers_vary=True)
    assert not matches("loss: 0.1234\n", "loss: 0.0871\n")
    assert not matches("loss: 0.1234\n", "loss: nan\n", numbers_vary=True)
    assert not matches("val_loss: 0.1\n", "loss: 0.1\n", numbers_vary=True)
    assert matches("{'loss': 0.0...}\n", "{'loss': 0.0712}\n")
    assert matches("first\n...\nlast\n", "first\nx\ny\nlast\n") and matches("first\n...\nlast\n", "first\nlast\n")
