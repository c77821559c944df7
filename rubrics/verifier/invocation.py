"""Whether a tool call's code runs a given script, as opposed to merely naming it.

Mentioning a path is not running it: a plan written with a heredoc names
``pipeline/infer.py`` too, and so does the call that writes the pipeline. A call
*runs* a script ``dir/name.py`` when its code

* (bash) starts an interpreter on it (``python [options] dir/name.py ...``,
  ``python -m dir.name``), executes it directly (``./dir/name.py``), or hands python
  code that runs it to an interpreter (``python - <<EOF ... EOF``, ``python -c '...'``);
* (python) imports it as a module (``from dir import name``, ``import dir.name``, or
  ``import name`` with ``dir`` named in the code, as when it is put on ``sys.path``),
  starts it as a program (``subprocess.run(["python", "dir/name.py", ...])``,
  ``os.system("python dir/name.py")``), or runs its file as code (``runpy.run_path``,
  ``exec(open(...).read())``, ``importlib``).

Heredoc bodies that go to a file, and string literals that are only written out, do
not count. This is a reading of the code, not of what happened: the verifier pairs it
with the call's exit status and the files the call changed.
"""

from __future__ import annotations

import ast
import posixpath
import re
import shlex
from dataclasses import dataclass

from bat_gym.core.pyparse import parse

__all__ = ["Script", "runs_script"]


# Callables that start a program from a command line (matched by their last name):
# a list of words (``subprocess.run([...])``) or one shell string (``os.system``).
_PROCESS_RUNNERS = frozenset(
    {
        "run",
        "call",
        "check_call",
        "check_output",
        "Popen",
        "system",
        "popen",
        "getoutput",
        "getstatusoutput",
        "spawnl",
        "spawnlp",
        "spawnv",
        "spawnvp",
        "execl",
        "execlp",
        "execv",
        "execvp",
    }
)
# Callables that run python code from a file path or a module name.
_CODE_RUNNERS = frozenset(
    {
        "run_path",
        "run_module",
        "exec",
        "import_module",
        "spec_from_file_location",
        "SourceFileLoader",
        "load_source",
    }
)
_HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1")
_INTERPRETER = re.compile(r"python[0-9.]*")
_FEEDS_PYTHON = re.compile(r"(?:^|[\s;&|(])(?:\S*/)?python[0-9.]*(?:\s+-)?\s*$")
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
# Commands that run the command after them (with their options).
_WRAPPERS = frozenset({"env", "exec", "nice", "nohup", "time", "timeout", "command", "xvfb-run"})
_OPERATOR_CHARS = frozenset("();<>|&")
_REDIRECTS = frozenset({">", ">>", "<", "<<", "<<-", ">&", "&>", "<&", ">|"})


@dataclass(frozen=True)
class Script:
    """A workspace script, by its relative path (e.g. ``pipeline/infer.py``)."""

    path: str

    @property
    def directory(self) -> str:
        """The folder holding it (``pipeline``), or ``""`` at the workspace root."""
        return posixpath.dirname(self.path)

    @property
    def stem(self) -> str:
        """Its module name (``infer``)."""
        return posixpath.splitext(posixpath.basename(self.path))[0]

    @property
    def dotted(self) -> str:
        """Its dotted module path from the workspace root (``pipeline.infer``)."""
        return posixpath.splitext(self.path)[0].replace("/", ".")


def runs_script(code: str, language: str, script: str) -> bool:
    r"""Whether ``code`` (``python`` or ``bash``) runs the workspace script ``script``.

    >>> runs_script("python pipeline/infer.py out.csv", "bash", "pipeline/infer.py")
    True
    >>> runs_script("cat > plan.md <<'EOF'\nrun pipeline/infer.py\nEOF", "bash", "pipeline/infer.py")
    False
    >>> runs_script("import sys\nsys.path.insert(0, 'pipeline')\nimport infer", "python", "pipeline/infer.py")
    True
    """
    target = Script(posixpath.normpath(script))
    if language == "python":
        return _python_runs(code, target)
    return _bash_runs(code, target)


# -- bash -------------------------------------------------------------------------------


def _bash_runs(code: str, target: Script) -> bool:
    shell, fed = _split_heredocs(code)
    if any(_python_runs(body, target) for body in fed):
        return True
    return any(_command_runs(words, target) for words in _commands(shell))


def _commands(shell: str) -> list[list[str]]:
    """The simple commands of shell text, as words (quotes removed)."""
    commands: list[list[str]] = []
    for line in shell.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        try:
            tokens = list(lexer)
        except ValueError:  # unbalanced quotes: the shell would not run this line either
            continue
        words: list[str] = []
        for token in tokens:
            if token and set(token) <= _OPERATOR_CHARS:
                if token not in _REDIRECTS:
                    commands.append(words)
                    words = []
                continue
            words.append(token)
        commands.append(words)
    return [w for w in commands if w]


def _command_runs(words: list[str], target: Script) -> bool:
    """Whether one simple command runs the script (see the module docstring)."""
    while words and (_ASSIGNMENT.match(words[0]) or words[0] in _WRAPPERS):
        words = words[1:]
        while words and (words[0].startswith("-") or words[0].replace(".", "").isdigit()):
            words = words[1:]  # a wrapper's options and durations (timeout 60)
    if not words:
        return False
    program, args = words[0], words[1:]
    if _workspace_path(program) == target.path:
        return True  # ./pipeline/infer.py
    name = posixpath.basename(program)
    if name in ("bash", "sh") and len(args) >= 2 and args[0] == "-c":
        return _bash_runs(args[1], target)
    if not _INTERPRETER.fullmatch(name):
        return False
    k = 0
    while k < len(args) and args[k].startswith("-"):
        if args[k] == "-m" and k + 1 < len(args):
            return args[k + 1] == target.dotted
        if args[k] == "-c" and k + 1 < len(args):
            return _python_runs(args[k + 1], target)
        k += 2 if args[k] in ("-W", "-X") else 1  # options that take a value
    return k < len(args) and _workspace_path(args[k]) == target.path


def _workspace_path(word: str) -> str:
    return posixpath.normpath(word.removeprefix("/workspace/"))


def _split_heredocs(code: str) -> tuple[str, list[str]]:
    """The shell text without heredoc bodies, and the bodies fed to a python interpreter.

    A body redirected to a file (``cat > f <<EOF``) is data and is dropped.
    """
    shell: list[str] = []
    fed: list[str] = []
    lines = code.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        shell.append(line)
        i += 1
        for match in _HEREDOC.finditer(line):
            body: list[str] = []
            tabs = line[match.start() : match.start() + 3] == "<<-"  # <<- strips leading tabs
            while i < len(lines) and (lines[i].lstrip("\t") if tabs else lines[i]) != match[2]:
                body.append(lines[i])
                i += 1
            i += 1  # the delimiter line
            if _FEEDS_PYTHON.search(line[: match.start()].strip()):
                fed.append("\n".join(body))
    return "\n".join(shell), fed


# -- python -----------------------------------------------------------------------------


def _python_runs(code: str, target: Script) -> bool:
    try:
        tree = parse(code)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        # Code that does not parse ran nothing. The parser gives up on very deep nesting
        # (``-`` * 200,000 + ``1``) with MemoryError or RecursionError, as it would have
        # in the sandbox: one such call must not make the whole check raise.
        return False
    strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)]
    names_dir = bool(target.directory) and any(
        isinstance(s, str) and target.directory in _parts(s) for s in strings
    )
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(
            _is_module(a.name, target, names_dir) for a in node.names
        ):
            return True
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if _is_module(node.module, target, names_dir):
                return True
            if node.module == target.directory.replace("/", ".") and any(
                a.name == target.stem for a in node.names
            ):
                return True
        if isinstance(node, ast.Call) and _call_runs(node, target, names_dir):
            return True
    return False


def _parts(text: str) -> list[str]:
    return [p for p in re.split(r"[/\\\s'\"]+", text) if p]


def _is_module(name: str, target: Script, names_dir: bool) -> bool:
    """``name`` imports the script: its dotted path, or its bare name once its folder is named."""
    if name == target.dotted or name.startswith(target.dotted + "."):
        return True
    return name == target.stem and (names_dir or not target.directory)


def _callee(call: ast.Call) -> str:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def _call_runs(call: ast.Call, target: Script, names_dir: bool) -> bool:
    """A call that starts the script as a program, or runs it as python code."""
    callee = _callee(call)
    args = [*call.args, *(k.value for k in call.keywords)]
    if callee in _PROCESS_RUNNERS:
        for arg in args:
            if isinstance(arg, (ast.List, ast.Tuple)) and _command_runs(
                [_word(e) for e in arg.elts], target
            ):
                return True
            if (
                isinstance(arg, ast.Constant)
                and isinstance(arg.value, str)
                and _bash_runs(arg.value, target)
            ):
                return True
        return False
    if callee not in _CODE_RUNNERS:
        return False
    strings = [
        n.value
        for a in args
        for n in ast.walk(a)
        if isinstance(n, ast.Constant) and isinstance(n.value, str)
    ]
    if any(_workspace_path(s) == target.path or s.endswith("/" + target.path) for s in strings):
        return True  # run_path("pipeline/infer.py"), exec(open("pipeline/infer.py").read())
    if callee in ("import_module", "run_module"):
        return any(_is_module(s, target, names_dir) for s in strings)
    # spec_from_file_location("infer", os.path.join(ROOT, "pipeline", "infer.py"))
    filename = posixpath.basename(target.path)
    return filename in strings and (not target.directory or target.directory in strings)


def _word(node: ast.expr) -> str:
    """A command-line word written in python: a string, or ``sys.executable``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Attribute) and node.attr == "executable":
        return "python"
    return "\0"  # not known until run time
