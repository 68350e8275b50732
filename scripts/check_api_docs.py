#!/usr/bin/env python3
"""Fails naming each public name of the engine's API that docs/api.md does not mention.

The names come from the headers, read with simple rules (no compiler): comments and string literals
are blanked, each class or struct body is walked at its own brace depth, declarations in private
and protected sections are skipped, and so are constructors, destructors, deleted members, friends,
static_asserts and anything in a `detail` namespace. A public member counts as documented when it
appears as an identifier inside an inline code span (`like_this`, outside fenced blocks) in the
section of docs/api.md whose heading names its owner in backticks (the heading's section runs to
the next heading of the same or a higher level). A type needs such a heading; a free name (an alias,
a function, a constant) needs a code span anywhere on the page.

Usage: check_api_docs.py SOURCE_ROOT [--list]   (--list prints every name found, one a line)
       check_api_docs.py --self-test            (the parser against a header that exercises its rules)
"""
import pathlib
import re
import sys

DOC = "docs/api.md"

# Header -> the namespace-scope names it contributes (None: every one outside detail namespaces).
HEADERS = {
    "include/zero/engine/engine.hpp": ["engine"],
    "include/zero/engine/reports.hpp": None,
    "include/zero/engine/options.hpp": None,
    "include/zero/engine/zeropp.hpp": ["zeropp_options"],
    "include/zero/engine/init.hpp": None,
    "include/zero/engine/tensor_view.hpp": None,
    "include/zero/core/model_spec.hpp": None,
    "include/zero/comm/counted.hpp": ["comm_stats", "collective"],
    "include/zero/core/memory.hpp": ["memory_report", "mem_category"],
    "include/zero/core/half_types.hpp": ["bf16", "fp16", "to_float"],
    "include/zero/offload/options.hpp": None,
    "include/zero/offload/state_store.hpp": ["offload_report", "offload_traffic"],
    "include/zero/engine/plan.hpp": None,
    "include/zero/engine/activation_plan.hpp": None,
    "include/zero/engine/activation_store.hpp": None,
    "include/zero/engine/memory_check.hpp": ["model_state_plan"],
    "include/zero/partition/stages.hpp": None,
    "include/zero/checkpoint/save.hpp": None,
    "include/zero/checkpoint/save_async.hpp": None,
    "include/zero/checkpoint/peer_snapshot.hpp": None,
    "include/zero/engine/memory_release.hpp": None,
    "include/zero/checkpoint/load.hpp": None,
    "include/zero/core/reduce_op.hpp": ["reduce_op"],
    "include/zero/comm/backends/threads.hpp": None,
    "include/zero/comm/backends/mpi.hpp": ["mpi_mode", "mpi_options", "mpi", "mpi_abort"],
    "include/zero/comm/mpi_session.hpp": ["mpi_session"],
}

IDENT = re.compile(r"[A-Za-z_]\w*")
KEYWORDS = {
    "const", "constexpr", "consteval", "inline", "static", "virtual", "explicit", "noexcept", "override",
    "final", "typename", "template", "unsigned", "signed", "long", "short", "int", "char", "bool", "float",
    "double", "void", "auto", "mutable", "volatile", "ZERO_HD", "friend", "operator", "return", "default",
    "delete", "std", "struct", "class", "enum",
}


def blank_comments(text):
    """The text with comments and string/char literals replaced by spaces (newlines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (min(j, n) - i - 1) + (c if j < n else ""))
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def statements(body):
    """Splits a scope's text into top-level statements: (text with nested bodies elided, first body or None)."""
    out, cur, depth, first_body, start, i = [], [], 0, None, 0, 0
    while i < len(body):
        c = body[i]
        if c == "{":
            if depth == 0:
                start = i + 1
                cur.append("{}")
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                if first_body is None:
                    first_body = body[start:i]
                # A body followed by ';' (a class definition, an initializer), ',' or '{' (a
                # constructor's member initializers) goes on; any other (a function body, a
                # namespace) ends the statement.
                rest = body[i + 1:].lstrip()
                if not rest or rest[0] not in ";,{)":
                    out.append(("".join(cur).strip(), first_body))
                    cur, first_body = [], None
        elif depth == 0:
            if c == ";":
                out.append(("".join(cur).strip(), first_body))
                cur, first_body = [], None
            elif c == ":" and re.fullmatch(r"\s*(public|private|protected)\s*", "".join(cur)) and body[i + 1] != ":":
                out.append(("".join(cur).strip() + ":", None))
                cur = []
            else:
                cur.append(c)
        i += 1
    if "".join(cur).strip():
        out.append(("".join(cur).strip(), first_body))
    return out


def strip_angles(s):
    """Removes template argument lists <...> (nested), so commas and names inside them vanish."""
    out, depth = [], 0
    for i, c in enumerate(s):
        if c == "<" and not s.startswith("<<", i) and not s.startswith("<<", i - 1):
            depth += 1
        elif c == ">" and depth > 0:
            depth -= 1
        elif depth == 0:
            out.append(c)
    return "".join(out)


def top_level_split(s, sep):
    parts, depth, cur = [], 0, []
    for c in s:
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        if c == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(c)
    parts.append("".join(cur))
    return parts


def declared_names(text, owner):
    """The names one statement declares: [] for ones that declare nothing public worth listing."""
    t = re.sub(r"\[\[[^\]]*\]\]", " ", text)
    t = re.sub(r"^\s*template\s*", "", t)
    if t.lstrip().startswith("<"):
        t = t[t.index("<"):]
        depth = 0
        for i, c in enumerate(t):
            depth += c == "<"
            depth -= c == ">"
            if depth == 0:
                t = t[i + 1:]
                break
    t = t.strip()
    if not t or re.match(r"(friend|static_assert|using\s+namespace)\b", t):
        return []
    m = re.match(r"using\s+(\w+)\s*=", t)
    if m:
        return [m.group(1)]
    if re.search(r"=\s*delete\s*$", t):
        return []
    m = re.search(r"\boperator\s*(\(\)|\[\]|==|!=|<=>|[-+*/<>=!&|^%~]+|[A-Za-z_][\w:]*)", t)
    if m and "(" in t:
        return ["operator" + ("" if m.group(1)[0] in "([=!<-+*/&|^%~>" else " ") + m.group(1)]
    t = re.sub(r"\bdecltype\s*\([^()]*\)", " auto ", t)
    # Template arguments go first: a std::function<void(int)> member has a parenthesis but is no function.
    head = strip_angles(top_level_split(t, "=")[0])
    if "(" in head:  # a function: the identifier before its parameter list
        before = head[:head.index("(")]
        name = re.findall(r"(~?\w+)\s*$", before)
        if not name or name[0].lstrip("~") == owner or re.search(r"::\s*~?\w+\s*$", before):
            return []  # constructor, destructor, a member defined outside its class
        return [name[0]]
    names = []
    for part in top_level_split(strip_angles(t), ","):
        decl = re.sub(r"\{\}", "", top_level_split(part, "=")[0]).strip()
        ids = [x for x in IDENT.findall(decl) if x not in KEYWORDS]
        if ids:
            names.append(ids[-1])
    return names


def walk(body, owner, public, found, path, prefix):
    """Adds (qualified owner, name, path) for each public declaration of a scope; recurses into types."""
    for text, inner in statements(body):
        if re.fullmatch(r"(public|private|protected):", text):
            public = text == "public:"
            continue
        if text.startswith("namespace"):
            if inner is not None and not re.match(r"namespace\s+(\w+::)*detail\b", text):
                walk(inner, owner, True, found, path, prefix)
            continue
        if not public:
            continue
        m = re.match(r"(?:template\s*<.*>\s*)?(class|struct|enum\s+class|enum)\s+(\w+)", text)
        if m and inner is not None:
            kind, name = m.groups()
            found.append((owner, name, path))
            if kind.startswith("enum"):
                for e in top_level_split(inner, ","):
                    ident = IDENT.match(e.strip())
                    if ident:
                        found.append((name, ident.group(0), path))
            else:
                walk(inner, name, kind == "struct", found, path, prefix)
            continue
        if m and inner is None:  # a forward declaration
            continue
        for name in declared_names(text, owner):
            found.append((owner, name, path))


def public_names(root):
    found = []
    for path, wanted in HEADERS.items():
        text = blank_comments((root / path).read_text())
        text = "\n".join(l for l in text.split("\n") if not l.lstrip().startswith("#"))
        names = []
        walk(text, None, True, names, path, "")
        # Keep the wanted namespace-scope names and every member of a kept type, at any depth.
        kept_types = set()
        for owner, name, p in names:
            if owner is None and (wanted is None or name in wanted) and (owner, name, p) not in found:
                found.append((owner, name, p))
                kept_types.add(name)
        changed = True
        while changed:
            changed = False
            for owner, name, p in names:
                if owner in kept_types and (owner, name, p) not in found:
                    found.append((owner, name, p))
                    if name not in kept_types and any(o == name for o, _, _ in names):
                        kept_types.add(name)
                        changed = True
    return found


def doc_sections(doc):
    """[(heading level, the heading's code spans, the code spans of its own lines)], and every span.

    Code spans are `...` outside fenced blocks; a section's own lines run to the next heading."""
    sections, spans, fenced = [(0, [], [])], [], False
    for line in doc.split("\n"):
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        here = re.findall(r"`([^`]+)`", line)
        spans += here
        h = re.match(r"(#+)\s", line)
        if h:
            sections.append((len(h.group(1)), here, []))
        else:
            sections[-1][2].extend(here)
    return sections, spans


def mentions(spans, name):
    pat = re.compile(r"(?<![\w])" + re.escape(name) + (r"(?![\w])" if name[-1].isalnum() or name[-1] == "_" else ""))
    return any(pat.search(s) for s in spans)


def owner_spans(sections, owner):
    """The spans of each section whose heading names `owner`, with its sub-sections; None: no such heading."""
    out, found, level = [], False, None
    for lvl, heading, spans in sections:
        if level is not None and lvl <= level:
            level = None
        if level is None and mentions(heading, owner):
            level, found = lvl, True
        if level is not None:
            out.extend(spans)
    return out if found else None


# The parser's own check (--self-test): each rule above against a header that exercises it.
SELF_TEST_HEADER = r"""
#pragma once
#include <array>
namespace zero {
namespace detail { inline int hidden_helper() { return 1; } }
class fwd;  // a forward declaration { not a body
// struct commented_out { int nope; };
/* class also_commented { public: int nope2; }; */
enum class colour : int { red, green = 2 };
template <class T>
class widget {
  int private_by_default = 0;
 public:
  using value_type = T;
  widget(int a) : a_{a}, b_(a) {}
  widget(const widget&) = delete;
  ~widget() { const char* s = "} // {"; (void)s; }
  template <class F>
  void visit(F&& f) const { if (a_) { f(); } }
  T& operator[](std::size_t i) { return data_[i]; }
  explicit operator bool() const { return a_ != 0; }
  friend bool operator==(const widget&, const widget&) = default;
  static_assert(sizeof(T) > 0);
  [[nodiscard]] std::array<int, 3> corners() const;
  std::array<std::size_t, 4> current{}, peak{};
  int x = 1 << 3, y{2};
  class handle {
   public:
    int get() const { return 0; }
   private:
    int secret() const { return 1; }
  };
 protected:
  int guarded();
 private:
  int a_, b_;
  T data_[4];
};
struct plain { double v = f(1, 2); bool on = false; std::function<void(int, bool)> on_event; };
template <class T>
inline std::array<int, 3> widget<T>::corners() const { return {}; }
using alias = widget<int>;
}  // namespace zero
"""
SELF_TEST_WANT = [
    (None, "colour"), ("colour", "red"), ("colour", "green"), (None, "widget"), ("widget", "value_type"),
    ("widget", "visit"), ("widget", "operator[]"), ("widget", "operator bool"), ("widget", "corners"),
    ("widget", "current"), ("widget", "peak"), ("widget", "x"), ("widget", "y"), ("widget", "handle"),
    ("handle", "get"), (None, "plain"), ("plain", "v"), ("plain", "on"), ("plain", "on_event"), (None, "alias"),
]


def self_test():
    names = []
    walk(blank_comments("\n".join(l for l in SELF_TEST_HEADER.split("\n") if not l.startswith("#"))), None,
         True, names, "self-test", "")
    got = [(o, n) for o, n, _ in names]
    if got != SELF_TEST_WANT:
        print("FAIL: the header parser found", got, "expected", SELF_TEST_WANT, sep="\n  ")
        return 1
    print(f"self-test: the parser finds the {len(got)} public names of its test header, and nothing else")
    return 0


def main():
    if "--self-test" in sys.argv[1:]:
        return self_test()
    root = pathlib.Path(sys.argv[1])
    if self_test():  # a parser that misreads its own test header would vouch for nothing
        return 1
    names = public_names(root)
    if "--list" in sys.argv[2:]:
        for owner, name, path in names:
            print(f"{path}: {owner + '::' if owner else ''}{name}")
        return 0
    sections, all_spans = doc_sections((root / DOC).read_text())
    problems = []
    for owner, name, path in names:
        where = f"{path}: {owner + '::' if owner else ''}{name}"
        if owner is None:
            if not mentions(all_spans, name):
                problems.append(f"{where} is not mentioned in {DOC} (as `{name}` in backticks)")
            continue
        spans = owner_spans(sections, owner)
        if spans is None:
            problems.append(f"{where}: {DOC} has no heading naming `{owner}`")
        elif not mentions(spans, name):
            problems.append(f"{where} is not mentioned in {DOC} (as `{name}` in the section headed `{owner}`)")
    for p in problems:
        print("FAIL:", p)
    if not problems:
        print(f"{DOC}: all {len(names)} public names of {len(HEADERS)} headers are documented")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
