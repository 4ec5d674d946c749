"""gitleaks' own per-rule true- and false-positive examples, read from its rule sources (no Go needed).

gitleaks validates every rule of its default config against examples written in
``cmd/generate/config/rules/*.go``: ``tps`` (text the rule must report) and ``fps`` (text it must
not), many of them generated (``utils.GenerateSampleSecrets("asana", secrets.NewSecret(`[a-z0-9]{32}`))``
writes one secret in 25 syntaxes: INI, JSON, XML, YAML, Go, Java, PHP, Make, ...). This module
evaluates those Go expressions in Python: string literals, ``+``, ``[]string{...}``,
``map[string]string{...}``, ``append``, local variables, ``fmt.Sprintf`` with ``%s``, ``strings``
helpers, base64 and the regex-to-string generator (``secrets.NewSecret``, drawn with a seeded
``random.Random`` the way ``reggen`` draws: a class character uniformly, ``{m,n}`` uniformly, ``*`` /
``+`` / ``?`` at most once). A statement it cannot evaluate (a ``for`` loop building examples) is
skipped and counted, never guessed.

It reads the files from a gitleaks git directory at a pinned commit (``git show COMMIT:path``), so
nothing of gitleaks is copied into this repository. Used by ``benchmarks/tools/gitleaks_coverage.py``.
"""

from __future__ import annotations

import base64
import dataclasses
import random
import re
import subprocess
from typing import Any, Callable, Optional

try:  # Python 3.11+
    import re._parser as sre_parse  # type: ignore[import-not-found]
    from re import _constants as sre_constants  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - older Pythons
    import sre_constants  # type: ignore[no-redef]
    import sre_parse  # type: ignore[no-redef]

RULES_DIR = 'cmd/generate/config/rules'


class Unsupported(Exception):
    """A Go construct the evaluator does not handle (the statement is skipped and counted)."""


@dataclasses.dataclass
class Example:
    """One example of one rule: the text, whether the rule must report it, and how it was written."""

    rule: str
    text: str
    positive: bool
    syntax: str  # the GenerateSampleSecrets template ('ini - unquoted1', ...) or 'literal'
    secret: Optional[str]  # the secret given to GenerateSampleSecrets, when known


# --------------------------------------------------------------------------- GenerateSampleSecrets' templates
# Copied in meaning from cmd/generate/config/utils/generate.go (the templates a secret is written in).
SAMPLE_TEMPLATES = {
    'ini - quoted1': '{i}Token="{s}"',
    'ini - quoted2': '{i}Token = "{s}"',
    'ini - unquoted1': '{i}Token={s}',
    'ini - unquoted2': '{i}Token = {s}',
    'json - string': '{\n    "{i}_token": "{s}"\n}',
    'json - escaped newline in string': '{"config.ini": "{I}_TOKEN={s}\\nBACKUP_ENABLED=true"}',
    'xml - element multiline': '<{i}Token>\n    {s}\n</{i}Token>',
    'yaml - singleline - unquoted': '{i}_token: {s}',
    'yaml - singleline - single quote': "{i}_token: '{s}'",
    'yaml - singleline - double quote': '{i}_token: "{s}"',
    'C#': 'string {i}Token = "{s}";',
    'go - normal': 'var {i}Token string = "{s}"',
    'go - short': '{i}Token := "{s}"',
    'go - backticks': '{i}Token := `{s}`',
    'java': 'String {i}Token = "{s}";',
    'kotlin - notype': 'var {i}Token = "{s}"',
    'php - string concat': '${i}Token .= "{s}"',
    'python - single quote': "{i}Token = '{s}'",
    'python - double quote': '{i}Token = "{s}"',
    'misc - comma operator': 'System.setProperty("{I}_TOKEN", "{s}")',
    'logstash': '  "{i}Token" => "{s}"',
    'make - recursive assignment': '{i}_TOKEN = "{s}"',
    'make - simple assignment': '{i}_TOKEN := "{s}"',
    'make - shell assignment': '{i}_TOKEN ::= "{s}"',
    'make - evaluated shell assignment': '{i}_TOKEN :::= "{s}"',
    'make - conditional assignment': '{i}_TOKEN ?= "{s}"',
}


def _check_templates(source: str) -> None:
    """Fail loudly when the checkout's templates differ from the ones above (a newer gitleaks)."""
    for name, template in SAMPLE_TEMPLATES.items():
        if f'"{name}"' not in source:
            raise ValueError(f'gitleaks template {name!r} is not in utils/generate.go: update SAMPLE_TEMPLATES')
    found = re.findall(r'^\t\t"([^"]+)":', source, re.M)
    missing = set(found) - set(SAMPLE_TEMPLATES)
    if missing:
        raise ValueError(f'utils/generate.go has templates this module lacks: {sorted(missing)}')


class _Tagged(str):
    """A generated example that remembers its template and secret."""

    syntax: str = 'literal'
    secret: Optional[str] = None


def sample_secrets(identifier: str, secret: str) -> list[str]:
    """``utils.GenerateSampleSecrets``: ``secret`` written in every template, named after ``identifier``."""
    out = []
    for name, template in SAMPLE_TEMPLATES.items():
        text = _Tagged(template.replace('{i}', identifier).replace('{I}', identifier.upper()).replace('{s}', secret))
        text.syntax, text.secret = name, secret
        out.append(text)
    return out


# --------------------------------------------------------------------------- regex -> a string (reggen)


class _Generator:
    """Draws a string matching a regex, as ``reggen.Generate(1)`` does (unbounded repeats at most once)."""

    _PRINTABLE = [chr(c) for c in range(32, 127)]

    def __init__(self, rng: random.Random):
        self.rng = rng

    def __call__(self, regex: str) -> str:
        regex = _go_to_python(regex)
        return self._emit(sre_parse.parse(regex), {})

    def _class(self, items: list) -> list[str]:
        chars: set[str] = set()
        negate = False
        for op, arg in items:
            if op is sre_constants.NEGATE:
                negate = True
            elif op is sre_constants.LITERAL:
                chars.add(chr(arg))
            elif op is sre_constants.RANGE:
                chars.update(chr(c) for c in range(arg[0], arg[1] + 1))
            elif op is sre_constants.CATEGORY:
                name = str(arg)
                if 'DIGIT' in name:
                    pool = '0123456789'
                elif 'WORD' in name:
                    pool = 'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_'
                elif 'SPACE' in name:
                    pool = ' '
                else:
                    raise Unsupported(f'category {name}')
                if 'NOT' in name:
                    chars.update(c for c in self._PRINTABLE if c not in pool)
                else:
                    chars.update(pool)
            else:
                raise Unsupported(f'class item {op}')
        if negate:
            return [c for c in self._PRINTABLE if c not in chars]
        return sorted(chars)

    def _emit(self, parsed, groups: dict) -> str:
        out = []
        for op, arg in parsed:
            if op is sre_constants.LITERAL:
                out.append(chr(arg))
            elif op is sre_constants.NOT_LITERAL:
                out.append(self.rng.choice([c for c in self._PRINTABLE if c != chr(arg)]))
            elif op is sre_constants.ANY:
                out.append(self.rng.choice(self._PRINTABLE))
            elif op is sre_constants.IN:
                out.append(self.rng.choice(self._class(arg)))
            elif op in (
                sre_constants.MAX_REPEAT,
                sre_constants.MIN_REPEAT,
                getattr(sre_constants, 'POSSESSIVE_REPEAT', None),
            ):
                low, high, body = arg
                high = low + 1 if high == sre_constants.MAXREPEAT else high
                out.extend(self._emit(body, groups) for _ in range(self.rng.randint(low, high)))
            elif op is sre_constants.SUBPATTERN:
                group, _, _, body = arg
                text = self._emit(body, groups)
                if group:
                    groups[group] = text
                out.append(text)
            elif op is sre_constants.BRANCH:
                out.append(self._emit(self.rng.choice(arg[1]), groups))
            elif op is sre_constants.GROUPREF:
                out.append(groups.get(arg, ''))
            elif op in (sre_constants.AT, sre_constants.ASSERT, sre_constants.ASSERT_NOT):
                continue  # anchors and look-arounds draw nothing
            else:
                raise Unsupported(f'regex op {op}')
        return ''.join(out)


def _go_to_python(regex: str) -> str:
    """The few Go RE2 spellings Python's parser reads differently (enough to draw from, not to match)."""
    regex = regex.replace('\\z', '\\Z').replace('[[:alnum:]]', '[A-Za-z0-9]').replace('[:alnum:]', 'A-Za-z0-9')
    return regex.replace('(?i)', '').replace('(?-i:', '(?:').replace('(?i:', '(?:').replace('(?s:', '(?:')


def plausible_secret(draw: Callable[[str], str], regex: str) -> str:
    """``newPlausibleSecret`` (generic.go): a draw with a digit 1-9 (gitleaks also retries on stop words)."""
    for _ in range(1000):
        secret = draw(regex)
        if re.search('[1-9]', secret):
            return secret
    raise Unsupported(f'no plausible secret for {regex}')


# --------------------------------------------------------------------------- a Go expression subset

_TOKEN = re.compile(
    r'''
    (?P<space>[ \t\r]+|//[^\n]*|/\*.*?\*/)
  | (?P<newline>\n)
  | (?P<raw>`[^`]*`)
  | (?P<string>"(?:[^"\\\n]|\\.)*")
  | (?P<char>'(?:[^'\\\n]|\\.)+')
  | (?P<number>\d+(?:\.\d+)?)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>\.\.\.|:=|\+=|==|!=|<=|>=|&&|\|\||[-+*/%(){}\[\],.:;=<>!&|^])
''',
    re.S | re.X,
)


def _go_string(literal: str) -> str:
    if literal[0] == '`':
        return literal[1:-1].replace('\r', '')
    body = literal[1:-1]
    return re.sub(r'\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|[0-7]{3}|.)', _unescape, body)


def _unescape(match: re.Match) -> str:
    code = match.group(1)
    simple = {
        'n': '\n',
        't': '\t',
        'r': '\r',
        '\\': '\\',
        '"': '"',
        "'": "'",
        'a': '\a',
        'b': '\b',
        'f': '\f',
        'v': '\v',
    }
    if code in simple:
        return simple[code]
    if code[0] in 'xu':
        return chr(int(code[1:], 16))
    if code[0].isdigit():
        return chr(int(code, 8))
    raise Unsupported(f'escape \\{code}')


def tokenize(source: str) -> list[tuple[str, str]]:
    """Go source as (kind, text) tokens; comments and blanks dropped, newlines kept."""
    tokens = []
    for match in _TOKEN.finditer(source):
        kind = match.lastgroup
        if kind != 'space':
            tokens.append((kind, match.group()))
    return tokens


class _Parser:
    """Evaluates Go expressions over ``tokens[pos:]`` with the variables in ``env``."""

    def __init__(self, tokens: list[tuple[str, str]], env: dict[str, Any], draw: Callable[[str], str]):
        self.tokens, self.pos, self.env, self.draw = tokens, 0, env, draw

    def peek(self, skip_newlines: bool = True) -> tuple[str, str]:
        pos = self.pos
        while skip_newlines and pos < len(self.tokens) and self.tokens[pos][0] == 'newline':
            pos += 1
        return self.tokens[pos] if pos < len(self.tokens) else ('eof', '')

    def take(self, text: Optional[str] = None) -> tuple[str, str]:
        while self.pos < len(self.tokens) and self.tokens[self.pos][0] == 'newline':
            self.pos += 1
        token = self.tokens[self.pos] if self.pos < len(self.tokens) else ('eof', '')
        if text is not None and token[1] != text:
            raise Unsupported(f'expected {text!r}, got {token[1]!r}')
        self.pos += 1
        return token

    def expression(self) -> Any:
        value = self.primary()
        while self.peek(skip_newlines=False)[1] == '+':
            self.take('+')
            right = self.primary()
            if not (isinstance(value, str) and isinstance(right, str)):
                raise Unsupported('+ of non-strings')
            value = _concat(value, right)
        return value

    def arguments(self) -> list[Any]:
        self.take('(')
        args: list[Any] = []
        while self.peek()[1] != ')':
            value = self.expression()
            if self.peek()[1] == '...':
                self.take('...')
                args.extend(value)
            else:
                args.append(value)
            if self.peek()[1] == ',':
                self.take(',')
        self.take(')')
        return args

    def composite(self) -> Any:
        """``[]string{...}``, ``[]byte(x)``, ``map[string]string{...}`` (the values)."""
        kind, text = self.take()
        if text == '[':
            self.take(']')
            element = self.take()[1]
            if element == 'byte':
                return self.arguments()[0]
            if element != 'string':
                raise Unsupported(f'[]{element}')
            is_map = False
        else:  # map
            self.take('[')
            self.take('string')
            self.take(']')
            element = self.take()[1]
            if element == '[':  # map[string][]string{"k": {"a", "b"}, ...}: a dict of lists
                self.take(']')
                self.take('string')
                return self.map_of_lists()
            if element != 'string':
                raise Unsupported('map of non-strings')
            is_map = True
        self.take('{')
        items: list[str] = []
        while self.peek()[1] != '}':
            value = self.expression()
            if is_map:
                self.take(':')
                value = self.expression()
            items.append(value)
            if self.peek()[1] == ',':
                self.take(',')
        self.take('}')
        return items

    def map_of_lists(self) -> dict[str, list[str]]:
        self.take('{')
        out: dict[str, list[str]] = {}
        while self.peek()[1] != '}':
            key = self.expression()
            self.take(':')
            self.take('{')
            values = []
            while self.peek()[1] != '}':
                values.append(self.expression())
                if self.peek()[1] == ',':
                    self.take(',')
            self.take('}')
            out[key] = values
            if self.peek()[1] == ',':
                self.take(',')
        self.take('}')
        return out

    def primary(self) -> Any:
        kind, text = self.peek()
        if kind in ('string', 'raw'):
            self.take()
            return _go_string(text)
        if kind == 'number':
            self.take()
            return text
        if text == '[' or text == 'map':
            return self.composite()
        if text == '(':
            self.take('(')
            value = self.expression()
            self.take(')')
            return value
        if kind != 'name':
            raise Unsupported(f'token {text!r}')
        self.take()
        name = text
        while self.peek(skip_newlines=False)[1] == '.':
            self.take('.')
            name += '.' + self.take()[1]
        if self.peek(skip_newlines=False)[1] == '(':
            return self.call(name, self.arguments())
        if name in self.env:
            return self.env[name]
        raise Unsupported(f'name {name}')

    def call(self, name: str, args: list[Any]) -> Any:
        short = name.rsplit('.', 1)[-1]
        sizes = {
            'Numeric': '[0-9]{%s}',
            'Hex': '[a-f0-9]{%s}',
            'AlphaNumeric': '[a-z0-9]{%s}',
            'AlphaNumericExtendedShort': '[a-z0-9_-]{%s}',
            'AlphaNumericExtended': '[a-z0-9=_\\-]{%s}',
            'AlphaNumericExtendedLong': '[a-z0-9\\/=_\\+\\-]{%s}',
        }
        if name.startswith('utils.') and short in sizes:
            return sizes[short] % args[0]
        if name == 'utils.Hex8_4_4_4_12':
            return '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}'
        if name == 'secrets.NewSecret':
            return self.draw(args[0])
        if name == 'newPlausibleSecret':
            return plausible_secret(self.draw, args[0])
        if name == 'utils.GenerateSampleSecrets':
            return sample_secrets(args[0], args[1])
        if name == 'utils.GenerateSampleSecret':
            return f'{args[0]}_api_token = "{args[1]}"'
        if name == 'fmt.Sprintf':
            if re.search(r'%[^s%]', args[0]):
                raise Unsupported('Sprintf verb other than %s')
            values = iter(args[1:])
            return _concat('', re.sub('%s|%%', lambda m: next(values) if m.group() == '%s' else '%', args[0]))
        if name == 'generateTestValues':
            return self.env['generateTestValues']
        if name == 'append':
            return list(args[0]) + list(args[1:])
        if name == 'strings.ToUpper':
            return args[0].upper()
        if name == 'strings.ToLower':
            return args[0].lower()
        if name == 'strings.Repeat':
            return args[0] * int(args[1])
        if name == 'string':
            return args[0]
        encoders = {'StdEncoding': base64.b64encode, 'URLEncoding': base64.urlsafe_b64encode}
        for prefix, raw in (('', False), ('Raw', True)):
            for enc_name, enc in encoders.items():
                if name.endswith('.' + prefix + enc_name + '.EncodeToString'):
                    out = enc(args[0].encode('latin-1')).decode()
                    return out.rstrip('=') if raw else out
        raise Unsupported(f'call {name}')


def _concat(left: str, right: str) -> str:
    out = _Tagged(left + right)
    for part in (left, right):
        if isinstance(part, _Tagged) and part.secret is not None:
            out.syntax, out.secret = part.syntax, part.secret
    return out


def _functions(tokens: list[tuple[str, str]]) -> list[tuple[str, list[tuple[str, str]]]]:
    """(name, body tokens) of every top-level ``func``."""
    out = []
    i = 0
    while i < len(tokens):
        if tokens[i] == ('name', 'func') and i + 1 < len(tokens) and tokens[i + 1][0] == 'name':
            name = tokens[i + 1][1]
            j = i + 2
            while tokens[j][1] != '{':
                j += 1
            depth, k = 0, j
            while True:
                if tokens[k][1] == '{':
                    depth += 1
                elif tokens[k][1] == '}':
                    depth -= 1
                    if depth == 0:
                        break
                k += 1
            out.append((name, tokens[j + 1 : k]))
            i = k + 1
        else:
            i += 1
    return out


def _outside_functions(tokens: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The tokens of a file that are not inside a ``func`` (its signature and body)."""
    out, i = [], 0
    while i < len(tokens):
        if tokens[i] == ('name', 'func'):
            while tokens[i][1] != '{':
                i += 1
            depth = 0
            while True:
                depth += tokens[i][1] == '{'
                depth -= tokens[i][1] == '}'
                i += 1
                if depth == 0:
                    break
            continue
        out.append(tokens[i])
        i += 1
    return out


def _statements(body: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    """The body's statements at depth 0 (split on newlines and ``;`` outside brackets)."""
    out, current, depth = [], [], 0
    for token in body:
        if token[1] in '([{' and token[0] == 'op':
            depth += 1
        elif token[1] in ')]}' and token[0] == 'op':
            depth -= 1
        if depth == 0 and (token[0] == 'newline' or token[1] == ';'):
            if current:
                out.append(current)
            current = []
            continue
        current.append(token)
    if current:
        out.append(current)
    return out


@dataclasses.dataclass
class RuleExamples:
    """A rule's examples and what could not be evaluated."""

    rule: str
    function: str
    examples: list[Example]
    skipped: list[str]


def _assignments(statements: list[list[tuple[str, str]]]) -> list[tuple[str, list[tuple[str, str]]]]:
    """``(target, expression tokens)`` of ``x := e``, ``x = e``, ``var x = e``, ``var x T = e`` and
    ``var ( x = e ... )``; other statements as ``('', tokens)``."""
    out = []
    for statement in statements:
        if statement[0] == ('name', 'var'):
            if statement[1][1] == '(':
                inner = [t for t in statement[2:-1]]
                out += _assignments(_statements(inner))
                continue
            equals = next((i for i, t in enumerate(statement) if t[1] == '='), None)
            if equals is not None:
                out.append((statement[1][1], statement[equals + 1 :]))
                continue
        if len(statement) >= 3 and statement[0][0] == 'name' and statement[1][1] in (':=', '='):
            out.append((statement[0][1], statement[2:]))
        else:
            out.append(('', statement))
    return out


def _evaluate(
    statements: list[list[tuple[str, str]]], env: dict[str, Any], draw: Callable[[str], str], skipped: list[str]
) -> None:
    """Run the assignments of ``statements`` into ``env``; what cannot be evaluated goes to ``skipped``."""
    for target, expression in _assignments(statements):
        if not target:
            if expression[0][1] in ('for', 'if') and any(t[1] in ('tps', 'fps') for t in expression):
                skipped.append(f'{expression[0][1]} statement building examples')
            continue
        parser = _Parser(expression, env, draw)
        try:
            value = parser.expression()
            if parser.peek()[0] != 'eof':
                raise Unsupported(f'trailing {parser.peek()[1]!r}')
        except (Unsupported, IndexError, KeyError, TypeError, ValueError) as exc:
            if target in ('tps', 'fps'):
                skipped.append(f'{target}: {exc}')
            env.pop(target, None)
            continue
        env[target] = value


def _jwt_base64_examples(body: list[tuple[str, str]], draw: Callable[[str], str]) -> list[str]:
    """jwt.go's ``generateTestValues``: its header map evaluated, then its two loops as written there
    (each ``{"<key>":<value>}`` header, base64url without padding, plus the RFC 7519 sample's payload
    and signature, then the whole JWT in the four base64 encodings)."""
    env: dict[str, Any] = {}
    _evaluate(_statements(body), env, draw, [])
    jwt_suffix, headers = env['jwtSuffix'], env['headers']
    examples = []
    for key, values in headers.items():
        for value in values:
            header = '{"%s":%s}' % (key, value)
            jwt = (base64.urlsafe_b64encode(header.encode()).decode().rstrip('=') + jwt_suffix).encode()
            examples += [
                base64.b64encode(jwt).decode(),
                base64.b64encode(jwt).decode().rstrip('='),
                base64.urlsafe_b64encode(jwt).decode(),
                base64.urlsafe_b64encode(jwt).decode().rstrip('='),
            ]
    return examples


def rule_examples(source: str, draw: Callable[[str], str]) -> list[RuleExamples]:
    """The tps/fps of every rule function in one rule file."""
    tokens = tokenize(source)
    out = []
    functions = _functions(tokens)
    # Package-level ``var x = ...`` declarations (cloudflare.go's example lists): the statements outside functions.
    top: dict[str, Any] = {}
    _evaluate(
        [statement for statement in _statements(_outside_functions(tokens)) if statement[0] == ('name', 'var')],
        top,
        draw,
        [],
    )
    for function, body in functions:
        if function == 'generateTestValues':
            top['generateTestValues'] = _jwt_base64_examples(body, draw)
    for function, body in functions:
        rule_ids = [
            _go_string(body[i + 2][1])
            for i in range(len(body) - 2)
            if body[i][1] == 'RuleID' and body[i + 1][1] == ':' and body[i + 2][0] in ('string', 'raw')
        ]
        if not rule_ids:
            continue
        env: dict[str, Any] = dict(top)
        skipped: list[str] = []
        _evaluate(_statements(body), env, draw, skipped)
        examples = []
        for name, positive in (('tps', True), ('fps', False)):
            for text in env.get(name) or []:
                if not isinstance(text, str):
                    continue
                examples.append(
                    Example(
                        rule_ids[0],
                        str(text),
                        positive,
                        getattr(text, 'syntax', 'literal'),
                        getattr(text, 'secret', None),
                    )
                )
        out.append(RuleExamples(rule_ids[0], function, examples, skipped))
    return out


def git_show(git_dir: str, commit: str, path: str) -> str:
    """A file of the gitleaks git directory at ``commit``."""
    return subprocess.run(
        ['git', '--git-dir', git_dir, 'show', f'{commit}:{path}'], check=True, capture_output=True, text=True
    ).stdout


def load(git_dir: str, commit: str, seed: int = 35) -> list[RuleExamples]:
    """Every rule's examples at ``commit`` of a gitleaks git directory (secrets drawn with ``seed``)."""
    _check_templates(git_show(git_dir, commit, 'cmd/generate/config/utils/generate.go'))
    listing = subprocess.run(
        ['git', '--git-dir', git_dir, 'ls-tree', '--name-only', f'{commit}:{RULES_DIR}'],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    draw = _Generator(random.Random(seed))
    out = []
    for name in sorted(listing):
        if name.endswith('.go') and not name.endswith('_test.go'):
            out += rule_examples(git_show(git_dir, commit, f'{RULES_DIR}/{name}'), draw)
    return out
