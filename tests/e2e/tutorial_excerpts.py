#!/usr/bin/env python3
"""docs/tutorial.md quotes the example's code word for word: each block marked

    <!-- excerpt: examples/gpt.hpp units -->
    ```cpp
    ...
    ```

must equal the region of that file between the lines "// tutorial:begin units" and the next
"// tutorial:end" (dedented), every region of the example sources must be quoted, and no C++ block
may stand without a mark. The sources
are compiled and run by the train_gpt tests, so the tutorial's code compiles.

Usage: tutorial_excerpts.py SOURCE_ROOT            check (exit 1 naming each difference)
       tutorial_excerpts.py SOURCE_ROOT --update   rewrite the quoted blocks from the sources
       ... --doc DOC SOURCE...                     another page and its sources (docs/api.md quotes
                                                   examples/train_loop.cpp the same way)
"""
import difflib
import pathlib
import re
import sys
import textwrap

DOC = "docs/tutorial.md"
SOURCES = ["examples/gpt.hpp", "examples/train_gpt.cpp"]
MARK = re.compile(r"^<!-- excerpt: (\S+) (\S+) -->$")
BEGIN = re.compile(r"^\s*// tutorial:begin (\S+)\s*$")
END = re.compile(r"^\s*// tutorial:end\s*$")


def regions(root, path):
    out, name, lines = {}, None, []
    for n, line in enumerate((root / path).read_text().splitlines(), 1):
        if name is None:
            m = BEGIN.match(line)
            if m:
                name, lines = m.group(1), []
                if name in out:
                    sys.exit(f"{path}:{n}: region '{name}' is defined twice")
        elif END.match(line):
            out[name] = textwrap.dedent("\n".join(lines))
            name = None
        elif BEGIN.match(line):
            sys.exit(f"{path}:{n}: region '{name}' is not closed before the next one begins")
        else:
            lines.append(line)
    if name is not None:
        sys.exit(f"{path}: region '{name}' has no '// tutorial:end'")
    return out


def main():
    global DOC, SOURCES
    root = pathlib.Path(sys.argv[1])
    args = sys.argv[2:]
    update = "--update" in args
    args = [a for a in args if a != "--update"]
    if args[:1] == ["--doc"]:
        if len(args) < 3:
            sys.exit("usage: tutorial_excerpts.py SOURCE_ROOT [--update] [--doc DOC SOURCE...]")
        DOC, SOURCES = args[1], args[2:]
    code = {p: regions(root, p) for p in SOURCES}
    doc = (root / DOC).read_text().split("\n")
    problems, used, out, i = [], set(), [], 0
    while i < len(doc):
        out.append(doc[i])
        m = MARK.match(doc[i])
        i += 1
        if not m:
            # C++ that is not an excerpt would be code nobody compiles.
            if doc[i - 1].startswith("```c"):
                problems.append(f"{DOC}:{i}: a C++ block without an excerpt mark (its code would not be compiled)")
            continue
        path, name = m.groups()
        if path not in code or name not in code[path]:
            problems.append(f"{DOC}:{i}: no region '{name}' in {path}")
            continue
        used.add((path, name))
        if i >= len(doc) or doc[i] != "```cpp":
            problems.append(f"{DOC}:{i + 1}: the excerpt of {path} {name} must be a ```cpp block right after its mark")
            continue
        end = doc.index("```", i + 1)
        quoted = "\n".join(doc[i + 1:end])
        if quoted != code[path][name]:
            diff = "\n".join(difflib.unified_diff(quoted.split("\n"), code[path][name].split("\n"),
                                                  f"{DOC} ({name})", f"{path} ({name})", lineterm=""))
            problems.append(f"{DOC}:{i + 1}: the excerpt differs from {path} region '{name}':\n{diff}")
        out += ["```cpp"] + code[path][name].split("\n") + ["```"]
        i = end + 1
    for path, names in code.items():
        for name in names:
            if (path, name) not in used:
                problems.append(f"{path}: region '{name}' is quoted nowhere in {DOC}")
    if update:
        (root / DOC).write_text("\n".join(out))
        print(f"{DOC}: {len(used)} excerpts written")
        return 0
    for p in problems:
        print("FAIL:", p)
    if not problems:
        print(f"{DOC}: {len(used)} excerpts equal their sources")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
