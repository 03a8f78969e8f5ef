"""A Lark grammar without recursion (as custom tools' grammars usually are: Codex's apply_patch)
as one regular expression, so that a tool call's JSON can carry text in that grammar: llguidance
escapes a JSON string's pattern as it decodes it, and has no such escaping for a Lark grammar
inside a string."""

import json
import re

# The terminals of Lark's `common` library that llguidance knows, as regular expressions.
COMMON = {
    "LF": r"\n",
    "CR": r"\r",
    "NEWLINE": r"(?:\r?\n)+",
    "WS": r"[ \t\f\r\n]+",
    "WS_INLINE": r"[ \t]+",
    "DIGIT": "[0-9]",
    "HEXDIGIT": "[a-fA-F0-9]",
    "INT": "[0-9]+",
    "SIGNED_INT": r"[+-]?[0-9]+",
    "DECIMAL": r"(?:[0-9]+\.[0-9]*|\.[0-9]+)",
    "LCASE_LETTER": "[a-z]",
    "UCASE_LETTER": "[A-Z]",
    "LETTER": "[A-Za-z]",
    "WORD": "[A-Za-z]+",
    "CNAME": "[_A-Za-z][_A-Za-z0-9]*",
    "ESCAPED_STRING": r'"(?:[^"\\]|\\.)*"',
}
META = frozenset("\\.+*?()|[]{}^$#&-~")
TOKEN = re.compile(
    r"""(?P<str>"(?:[^"\\\n]|\\.)*"i?)|(?P<re>/(?:[^/\\\n]|\\.)+/[imsx]*)|(?P<dir>%[a-z]+)
    |(?P<name>[?!]?[A-Za-z_][A-Za-z0-9_-]*(?:\.[A-Za-z_][A-Za-z0-9_]*)?)|(?P<rep>\{[0-9]*(?:,[0-9]*)?\})
    |(?P<num>-?[0-9]+)|(?P<op>->|\.\.|[:|()\[\]?*+~.,])|(?P<nl>\n)|(?P<skip>[ \t\r]+|(?://|\#)[^\n]*)|(?P<bad>.)""",
    re.X,
)


def lark_to_regex(grammar: str) -> str:
    """The language of `grammar`'s `start` rule as one anchored regular expression (Rust regex
    syntax, as llguidance reads it); a ValueError naming what cannot be turned into one
    (recursion, %ignore, ...)."""
    rules = _rules(grammar)
    if "start" not in rules:
        raise ValueError("the grammar has no start rule")
    return f"^(?:{_Inline(rules).rule('start')})$"


def _rules(grammar: str) -> dict[str, list[tuple]]:
    """Rule name -> its tokens; imports of `common` become rules of their own."""
    tokens = [(m.lastgroup, m.group()) for m in TOKEN.finditer(grammar) if m.lastgroup != "skip"]
    bad = next((t for k, t in tokens if k == "bad"), None)
    if bad:
        raise ValueError(f"the grammar has {bad!r} where Lark's syntax expects none")
    statements, line = [], []
    for kind, text in tokens + [("nl", "\n")]:
        if kind != "nl":
            line.append((kind, text))
            continue
        starts = line and (
            line[0][0] == "dir"
            or (line[0][0] == "name" and len(line) > 1 and line[1][1] in (":", "."))
        )
        if starts or not statements:
            statements.append(line)
        else:  # an expansion continued on the next line
            statements[-1] += line
        line = []
    rules = {}
    for st in filter(None, statements):
        kind, text = st[0]
        if kind == "dir":
            if text == "%import" and len(st) >= 2 and st[1][1].startswith("common."):
                names = [st[1][1].removeprefix("common.")]
            elif text == "%import" and len(st) >= 3 and st[1][1] == "common":
                names = [t for k, t in st[2:] if k == "name"]
            else:
                raise ValueError(
                    f"{text} is not supported in a tool's grammar here (imports from common are)"
                )
            for name in names:
                if name not in COMMON:
                    raise ValueError(
                        (
                            f"common.{name} is not one of the common terminals known "
                            f"here: {', '.join(COMMON)}"
                        )
                    )
                rules[name] = [("re", f"/{COMMON[name]}/")]
            continue
        at = next((j for j, (_, t) in enumerate(st) if t == ":"), -1)
        if at < 0:
            raise ValueError(f"the grammar's line {' '.join(t for _, t in st)!r} is no rule")
        rules[text.lstrip("?!")] = st[at + 1 :]
    return rules


class _Inline:
    """Rules inlined into their users, recursion refused."""

    def __init__(self, rules: dict[str, list[tuple]]):
        self.rules, self.done, self.open = rules, {}, []

    def rule(self, name: str) -> str:
        if name in self.open:
            raise ValueError(
                f"the rule {name} refers to itself (through {' -> '.join(self.open + [name])}): a "
                "recursive grammar cannot be enforced inside a tool call's JSON here"
            )
        if name not in self.done:
            if name not in self.rules:
                raise ValueError(f"the grammar uses {name}, which it does not define")
            self.open.append(name)
            tokens = self.rules[name]
            rx, at = self.alternatives(tokens, 0)
            if at != len(tokens):
                raise ValueError(f"the rule {name} has {tokens[at][1]!r} where an expansion ends")
            self.open.pop()
            self.done[name] = rx
        return self.done[name]

    def alternatives(self, toks: list[tuple], i: int) -> tuple[str, int]:
        options = []
        while True:
            seq = []
            while i < len(toks) and toks[i][1] not in ("|", ")", "]", "->"):
                atom, i = self.item(toks, i)
                seq.append(atom)
            if i < len(toks) and toks[i][1] == "->":  # an alias names a tree node: nothing to match
                i += 2
            options.append("".join(seq))
            if i < len(toks) and toks[i][1] == "|":
                i += 1
                continue
            return (options[0] if len(options) == 1 else "(?:" + "|".join(options) + ")"), i

    def item(self, toks: list[tuple], i: int) -> tuple[str, int]:
        atom, i = self.atom(toks, i)
        if i < len(toks) and toks[i][0] == "rep":
            return f"(?:{atom}){toks[i][1]}", i + 1
        if i < len(toks) and toks[i][1] in ("?", "*", "+"):
            return f"(?:{atom}){toks[i][1]}", i + 1
        if i + 1 < len(toks) and toks[i][1] == "~" and toks[i + 1][0] == "num":
            low = high = toks[i + 1][1]
            i += 2
            if i + 1 < len(toks) and toks[i][1] == "..":
                high, i = toks[i + 1][1], i + 2
            return f"(?:{atom}){{{low},{high}}}", i
        return atom, i

    def atom(self, toks: list[tuple], i: int) -> tuple[str, int]:
        kind, text = toks[i]
        if text in ("(", "["):
            inner, j = self.alternatives(toks, i + 1)
            close = ")" if text == "(" else "]"
            if j >= len(toks) or toks[j][1] != close:
                raise ValueError(f"the grammar opens {text!r} and does not close it")
            return f"(?:{inner})" + ("?" if text == "[" else ""), j + 1
        if kind == "str":
            value = _literal(text)
            if i + 2 < len(toks) and toks[i + 1][1] == ".." and toks[i + 2][0] == "str":  # "a".."z"
                return f"[{_escape(value)}-{_escape(_literal(toks[i + 2][1]))}]", i + 3
            return (f"(?i:{_escape(value)})" if text.endswith("i") else _escape(value)), i + 1
        if kind == "re":
            body, flags = text[1:].rsplit("/", 1)
            return (f"(?{flags}:{body})" if flags else f"(?:{body})"), i + 1
        if kind == "name":
            return f"(?:{self.rule(text)})", i + 1
        raise ValueError(
            f"the grammar has {text!r} where a string, a regular expression or a rule goes"
        )


def _escape(text: str) -> str:
    """`text` matched literally: Rust's regex syntax refuses escapes of characters that
    are not its own."""
    return "".join("\\" + c if c in META else c for c in text)


def _literal(text: str) -> str:
    """A Lark string literal's text (its escapes are JSON's, but for a lone backslash)."""
    body = text.removesuffix("i")
    try:
        return json.loads(body)
    except ValueError:
        raise ValueError(f"the grammar's string {body} cannot be read") from None
