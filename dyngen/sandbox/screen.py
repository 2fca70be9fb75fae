"""The fast first filter: a program that imports or names what a pure function never needs.

It reads the program's syntax tree only, so it is cheap and it is blind: a program can
reach a banned module through a value the tree does not show (an attribute named at run
time). It is never the wall; bubblewrap and rlimits are (see dyngen.sandbox).
"""

from __future__ import annotations

import ast

# Modules (the top-level package of `import a.b`) that reach the system: processes, files,
# the network, the interpreter's own machinery, native code, or threads.
BANNED_MODULES = frozenset({
    "os", "posix", "nt", "sys", "subprocess", "socket", "socketserver", "ssl", "select",
    "selectors", "signal", "resource", "ctypes", "cffi", "mmap", "fcntl", "termios", "tty",
    "pty", "pwd", "grp", "shutil", "pathlib", "tempfile", "glob", "fnmatch", "io", "fileinput",
    "multiprocessing", "threading", "_thread", "concurrent", "asyncio", "sched", "importlib",
    "pkgutil", "runpy", "zipimport", "builtins", "gc", "inspect", "code", "codeop", "pdb",
    "trace", "tracemalloc", "faulthandler", "atexit", "sysconfig", "platform", "site",
    "pickle", "marshal", "shelve", "dbm", "sqlite3", "http", "urllib", "ftplib", "smtplib",
    "poplib", "imaplib", "telnetlib", "xmlrpc", "webbrowser", "wsgiref", "email", "logging",
    "zipfile", "tarfile", "gzip", "bz2", "lzma", "linecache", "tokenize", "unittest",
    "doctest", "venv", "ensurepip",
})
# Built-in names that read files, evaluate text, or reach objects by a name built at run time
# (not harmless ones a program may well use as its own names, such as `input`).
BANNED_NAMES = frozenset({
    "__import__", "eval", "exec", "compile", "open", "breakpoint", "globals", "locals",
    "vars", "getattr", "setattr", "delattr", "__builtins__", "__loader__", "__spec__",
})
# Attributes that lead from any object to the interpreter's internals (classes, frames, code).
BANNED_ATTRIBUTES = frozenset({
    "__class__", "__bases__", "__base__", "__mro__", "__subclasses__", "__globals__",
    "__builtins__", "__code__", "__closure__", "__dict__", "__getattribute__", "__import__",
    "__loader__", "__spec__", "__self__", "__func__", "__traceback__", "__reduce__",
    "__reduce_ex__", "__subclasshook__", "__init_subclass__", "__set_name__", "__objclass__",
    "__defaults__", "__kwdefaults__", "f_globals", "f_locals", "f_builtins", "f_back",
    "f_code", "gi_frame", "gi_code", "cr_frame", "cr_code", "ag_frame", "ag_code",
    "tb_frame", "tb_next", "co_code",
    # string.Formatter().get_field("0.__class__", ...) reaches an attribute named in a string
    "get_field",
}) | BANNED_MODULES  # `random.os`-style reach through a module that imported one
# Modules a program may import although their name starts with an underscore.
ALLOWED_PRIVATE_MODULES = frozenset({"__future__"})


def _banned_module(name: str) -> bool:
    """Whether importing dotted `name` is refused: a banned package, or any private part
    (`_io`, `_posixsubprocess`, `json._x`) but __future__."""
    parts = name.split(".")
    return parts[0] in BANNED_MODULES or (
        name not in ALLOWED_PRIVATE_MODULES and any(p.startswith("_") for p in parts))


def _banned_attribute(name: str) -> bool:
    """Whether reading attribute `name` is refused: the interpreter's internals, or a module
    a library imported under a private name (`random._os`, `x._sys`)."""
    return name in BANNED_ATTRIBUTES or name.lstrip("_") in BANNED_MODULES


def screen(program: str) -> str | None:
    """Why `program` is forbidden (e.g. "imports os"), or None if the filter passes it.

    A program that does not parse passes: running it reports its SyntaxError. One nested
    too deeply for the parser (a parser bomb) is refused.
    """
    try:
        tree = ast.parse(program)
    except (SyntaxError, ValueError):
        return None
    except (RecursionError, MemoryError):
        return "is nested too deeply to read"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _banned_module(alias.name):
                    return f"imports {alias.name}"
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level or _banned_module(module):
                return f"imports from {'.' * node.level}{module}"
            for alias in node.names:  # `from posixpath import os`, `from random import _os`
                if _banned_attribute(alias.name) or alias.name in BANNED_NAMES:
                    return f"imports {alias.name} from {module}"
        elif isinstance(node, ast.Name) and node.id in BANNED_NAMES:
            return f"uses {node.id}"
        elif isinstance(node, ast.Attribute) and _banned_attribute(node.attr):
            return f"uses the attribute .{node.attr}"
        elif isinstance(node, ast.MatchClass):  # `case object(__class__=c)` reads attributes
            for name in node.kwd_attrs:
                if _banned_attribute(name):
                    return f"uses the attribute .{name}"
    return None
