"""Runs the Python blocks of one documentation page in order, in one namespace, as a reader would
(tests/test_doc_blocks.py starts it in a fresh process per page, in a temporary directory).

usage: doc_page.py SPEC RESULT     (one page, in this process)
       doc_page.py --serve           (a preloaded process that forks one child per page)

SPEC is a JSON file: {"page": path of the page, "blocks": [{"line": the fence's line, "kind":
"run" or "signature", "source": the block's text}, ...]}. RESULT receives a JSON list, one entry
per block begun, rewritten after each block (a page that hangs still says where):
{"line", "output" (what a reader's terminal shows while the block runs: everything written to
file descriptors 1 and 2, by Python, C code or child processes; with PYTHONUNBUFFERED set, in the
order it was written), "error" (the traceback, or None), "arrows" ([line, expected, repr] of
each `expression  # -> value` line), "signature" (what differs from the real signature),
"seconds" (the block's wall time), "cpu_seconds" (the process's CPU time after it)}.

The blocks are compiled with the page as their file name and their own line numbers, so a
traceback names the page's line. The first error ends the page: later blocks build on earlier
ones. What a block prints is also written to output-LINE.txt beside RESULT as it runs (what a
block that hangs had printed).

`--serve` imports what nearly every page imports (torch, torch._dynamo, which torch's first
optimizer loads, fitkit's Model, torchmetrics, scikit-learn's datasets) once, then reads
requests, one JSON line each on stdin: {"spec", "result", "cwd", "log"}. For each it forks a
child that starts a session of its own (its process group is the pid), moves to `cwd`, writes its
stdout and stderr to `log` and runs the page as above, then exits as a script ends (atexit
handlers, the streams flushed) without tearing the imported modules down one by one. It answers {"pid"} when the child starts and {"status"} (its exit code) when the
child ends, one page at a time. The children are fresh processes with fresh namespaces: only
the imports are done already (about 8 s of CPU time a page, saved).
"""

import ast
import atexit
import importlib
import inspect
import io
import json
import os
import sys
import time
import tokenize
import traceback

ARROW = "# ->"


def arrow_comments(source: str) -> dict[int, str]:
    """The `# -> value` comments of a block, by line (numbered as in `source`)."""
    found = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT and token.string.startswith(ARROW):
            found[token.start[0]] = token.string[len(ARROW):].strip()
    return found


def run_block(source: str, page: str, first_line: int, namespace: dict) -> list:
    """Runs one block in `namespace`; returns the checks of its `# ->` lines."""
    padded = "\n" * first_line + source  # the block's first line is the page's line after the fence
    arrows = arrow_comments(padded)
    if not arrows:
        exec(compile(padded, page, "exec"), namespace)
        return []
    checks = []
    tree = ast.parse(padded, page)
    for statement in tree.body:
        expected = arrows.pop(statement.end_lineno, None)
        if expected is not None and isinstance(statement, ast.Expr):
            value = eval(compile(ast.Expression(statement.value), page, "eval"), namespace)
            checks.append([statement.end_lineno, expected, repr(value)])
        else:
            if expected is not None:
                arrows[statement.end_lineno] = expected  # not an expression: reported below
            exec(compile(ast.Module([statement], type_ignores=[]), page, "exec"), namespace)
    if arrows:
        lines = ", ".join(str(line) for line in sorted(arrows))
        raise SyntaxError(f"{page}: a `# ->` comment must end a top-level expression statement (line {lines})")
    return checks


def _literal(node: ast.expr):
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ast.unparse(node)


def check_signature(source: str, namespace: dict) -> list[str]:
    """A block showing a call signature, `Name(a, b=1, *, c=None, **rest)`, against the callable
    of that name: the same parameters in the same order with the same defaults; every real
    parameter shown, unless the block ends with `**name` (the rest left out)."""
    call = ast.parse(source.strip(), mode="eval").body
    if not isinstance(call, ast.Call):
        return [f"a signature block is one call, `Name(arguments)`; got {ast.unparse(call)!r}"]
    target = eval(compile(ast.Expression(call.func), "<signature>", "eval"), namespace)
    name = ast.unparse(call.func)
    parameters = [p for p in inspect.signature(target).parameters.values() if p.name != "self"]
    var_keyword = any(p.kind is p.VAR_KEYWORD for p in parameters)
    named = [p for p in parameters if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    shown = [(arg.id if isinstance(arg, ast.Name) else ast.unparse(arg), inspect.Parameter.empty)
             for arg in call.args]
    shown += [(kw.arg, _literal(kw.value)) for kw in call.keywords if kw.arg is not None]
    partial = any(kw.arg is None for kw in call.keywords)
    problems = []
    real = {p.name: p for p in named}
    for shown_name, default in shown:
        parameter = real.get(shown_name)
        if parameter is None:
            if not var_keyword:
                problems.append(f"{name}() has no parameter {shown_name!r}")
            continue
        if default is not inspect.Parameter.empty and parameter.default != default:
            problems.append(f"{name}({shown_name}=...): the page says {default!r}, the default is "
                            f"{parameter.default!r}")
        if default is inspect.Parameter.empty and parameter.default is not inspect.Parameter.empty:
            problems.append(f"{name}(): {shown_name!r} is shown without its default {parameter.default!r}")
    order = [n for n, _ in shown if n in real]
    if order != [p.name for p in named if p.name in order]:
        problems.append(f"{name}(): the page shows {order}, the parameters' order is {[p.name for p in named]}")
    missing = [p.name for p in named if p.name not in dict(shown)]
    if missing and not partial:
        problems.append(f"{name}() also has {missing}: show them, or end the call with `**other_name`")
    return problems


def main(spec_path: str, result_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    page = spec["page"]
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    results = []
    for block in spec["blocks"]:
        entry = {"line": block["line"], "output": "", "error": None, "arrows": [], "signature": [], "seconds": None,
                 "cpu_seconds": None}
        results.append(entry)
        _write(result_path, results)
        sys.stdout.flush()
        sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        start = time.perf_counter()
        output_path = os.path.join(os.path.dirname(result_path), f"output-{block['line']}.txt")
        with open(output_path, "w+b") as captured:
            os.dup2(captured.fileno(), 1)  # Python's prints, C code and child processes alike
            os.dup2(captured.fileno(), 2)
            try:
                if block["kind"] == "signature":
                    entry["signature"] = check_signature(block["source"], namespace)
                else:
                    entry["arrows"] = run_block(block["source"], page, block["line"], namespace)
            except BaseException as error:  # noqa: BLE001 - SystemExit too: reported, and the page stops here
                entry["error"] = _traceback(error)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                for fd, copy in zip((1, 2), saved):
                    os.dup2(copy, fd)
                    os.close(copy)
                captured.seek(0)
                entry["output"] = captured.read().decode("utf-8", "replace")
                entry["seconds"] = round(time.perf_counter() - start, 2)
                entry["cpu_seconds"] = round(time.process_time(), 2)  # the process's, so far
        _write(result_path, results)
        if entry["error"]:
            break


def _traceback(error: BaseException) -> str:
    """The traceback from the page's own frames on (this runner's are left out)."""
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(error), error, tb))


def _write(path: str, results: list) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(results, f)
    os.replace(path + ".tmp", path)


PRELOAD = ("torch", "torch._dynamo", "fitkit", "torchmetrics", "sklearn.datasets", "rich")


def serve() -> None:
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # an optional package: the pages that need it import it (or fail) themselves
    importlib.import_module("fitkit").Model  # noqa: B018 - loads the facade (fitkit's names load on first use)
    _reply({"ready": True})
    stdin = sys.stdin.buffer
    while True:
        line = stdin.readline()
        if not line:
            return
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)  # exits
        _reply({"pid": pid})
        _, status = os.waitpid(pid, 0)
        _reply({"status": os.waitstatus_to_exitcode(status)})


def _child(request: dict) -> None:
    os.setsid()
    os.chdir(request["cwd"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    sys.stdin = open(os.devnull)  # noqa: SIM115 - the process's stdin from now on
    sys.argv = [__file__, request["spec"], request["result"]]
    main(request["spec"], request["result"])
    # as a script ends (atexit handlers, then the streams flushed), less the interpreter's
    # teardown of every module, which takes seconds in a process that imported torch
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _reply(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        serve()
    else:
        main(sys.argv[1], sys.argv[2])
