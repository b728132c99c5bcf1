"""Masking secrets in text that leaves a handler: journal reasons, the record's error, logs.

An exception's message is arbitrary text. A driver echoes the URL it could not reach, password
included; an HTTP client the header it sent; a handler the payload field it could not parse.
DESIGN.md §4 keeps secrets and payloads out of the journal and the logs, so every error text on
its way there passes a redactor (``App(redact=...)``; the built-in one by default), which masks
what looks like a secret and leaves the rest as it was:

* the password of a URL: ``postgresql://app:***@db/jobs``;
* the value of a ``key=value``, ``key: value``, JSON or Python-dict pair whose key names a
  secret (password, passwd, pwd, token, secret, api_key, access_key, private_key, client_secret,
  authorization, cookie, session, credential, signature, but not the ``PUBLIC_KEYS``, such as
  libpq's ``target_session_attrs``; ``Redactor(secret_keys=...)`` adds more): ``token=***``,
  ``"api_key": "***"``. The value is masked whole whatever it is: a bytes literal
  (``b'***'``), a list, tuple or dict up to its matching bracket (``***``; to the end of the
  text when the bracket is never closed), a call (``SecretStr('…')``), and a
  pair of JSON inside a JSON string, whose quotes are escaped (``\\"api_key\\": \\"***\\"``);
* the same pairs written ``key => value`` (Perl, Ruby, PHP) or with the value on the next
  line (``password:`` then an indented line), and the content of an XML element whose tag
  names a secret (``<password>***</password>``, a CDATA section's too);
* after a secret key that starts its line (YAML, INI, a config dump), an unquoted value to
  the end of its line, spaces and all (``password: correct horse battery``, ``secret = two
  words``; ``key=value`` with no space is a word, as in a shell), and a YAML block scalar
  (``password: |`` or ``>``) with every line indented under its key;
* the rest of an ``Authorization:`` or ``Cookie:`` header line, and the credentials after
  ``Bearer`` / ``Basic``;
* long base64 and hex runs (keys, tokens, signatures: ``min_run_chars``, 32 by default); a
  base64 run counts when it mixes upper case, lower case and digits, so words, paths and
  dashed UUIDs stay readable. A 32-character hex id (an md5, ``uuid4().hex``) is masked too.

It is a heuristic on purpose: it cannot know every secret (a password with spaces in it,
unquoted in the middle of a line, loses only its first word), which is why it is pluggable,
and why payloads never reach an error text that leaseq writes itself.

In the logs, an error is shown by ``leaseq.job.safe_reason`` (its type and message on one line,
redacted), and never through ``exc_info`` or ``log.exception``: logging's formatter would print
the exception's message, unredacted, under the traceback. Where the traceback helps an operator
(an error nobody expected, so the frames say where to look), the line ends with
``traceback_text``: the same traceback, its frames as they were and each message redacted.
The app's redactor is used wherever the code has one (a worker, a scheduler, a queue's
consumer); code that serves no app (a store's own threads, the sweeper command) uses the
built-in one.
"""

from __future__ import annotations

import logging
import re
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit, urlunsplit

from leaseq.errors import InvalidInput, InvalidURL

log = logging.getLogger(__name__)

#: A redactor: text in, the same text with its secrets masked out.
Redact = Callable[[str], str]

#: Words that make a key name a secret, matched inside the key without regard to case
#: (``DB_PASSWORD``, ``x-api-key``, ``refresh_token``, ``sessionid``).
SECRET_WORDS = (
    "password", "passwd", "pwd", "passphrase", "token", "secret", "api_key", "apikey",
    "api-key", "access_key", "accesskey", "private_key", "privatekey", "client_secret",
    "authorization", "cookie", "session", "credential", "signature",
)  # fmt: skip

#: Names that hold a secret word and are no secret: libpq's choice of server by its state.
PUBLIC_KEYS = frozenset({"target_session_attrs"})

#: What an error about a URL that does not parse tells the user to check (a parser's own
#: message is never shown: it may quote a piece of the password).
ENCODE_HINT = ("check the host, the port and the query, and percent-encode any '/', '?', '#', "
               "'@' or ':' in the user name or password")

#: How much of a text's end is redacted when only its end is kept: well over what anything
#: keeps (2,000 characters), so a secret cut in two at the window's edge is cut away with it,
#: and a megabyte of exception text is not scanned for the few lines kept.
WINDOW_CHARS = 8_000

# A URL up to its password: the password runs to the last "@" before a space
# (``_masked_url_passwords``), so one holding an unencoded "/", "?", "#" or "@" is masked whole;
# a path holding an "@" only costs some text masked too.
_URL_HEAD = re.compile(r"(?<![\w+.-])[a-z][a-z0-9+.-]*://[^\s/?#@:]*+:", re.IGNORECASE)
_SPACE = re.compile(r"\s")
# The end of a URL's authority, as a parser reads it.
_AUTHORITY_END = re.compile(r"[/?#]")
_HEADER = re.compile(
    r"(?<![\w-])(?P<head>(?:proxy-)?authorization|(?:set-)?cookie)(?P<sep>[ \t]*+:[ \t]*+)"
    r"(?![|>][1-9+-]{0,2}[ \t]*+(?:#|\r?\n|$))(?P<value>[^\r\n'\"]+)",  # not a YAML block
    re.IGNORECASE)
_AUTH_SCHEME = re.compile(
    r"\b(?P<head>bearer\s+)[A-Za-z0-9._~+/-]+=*|\b(?P<basic>basic\s+)[A-Za-z0-9+/]{6,}=*",
    re.IGNORECASE)
# A key, optionally quoted, and its separator. The value is read only after a secret key,
# so the scan goes on inside other values (``data="token=abc"`` finds the inner pair) and each
# character is looked at a bounded number of times. The lookbehinds make a key start where a
# word starts, and an escaped quote (``\"key\"``: JSON inside a JSON string) where its run of
# backslashes starts, so a long word or run is read once, not once per character.
_PAIR = re.compile(r"(?<![\w.-])(?!(?<=\\)\\)(?P<quote>\\*+[\"']|[\"']?)(?P<key>[\w.-]++)(?P=quote)"
                   r"[ \t]*+(?P<sep>=>|[:=])[ \t]*+(?:\r?\n[ \t]*+)?")
# An XML element's start tag, and whether its content opens with a CDATA section. Its
# content is read only after a tag that names a secret (``Redactor.elements``).
_START_TAG = re.compile(r"<(?P<tag>[A-Za-z_][\w.:-]*+)(?P<attrs>[^<>]*+)>"
                        r"(?P<cdata><!\[CDATA\[)?+")
# A quoted value's opening: a Python prefix (``b'…'``, ``u'…'``, ``rb'…'``), the backslashes
# escaping its quote (none, or one per level of JSON in a JSON string), its quote.
_OPENING = re.compile(r"(?P<head>(?:[bB][rR]?|[rR][bB]?|[uU])?(?P<esc>\\*+)(?P<q>[\"']))")
_UNQUOTED = re.compile(r"[\"']?[^\s,;&'\"{}\[\]()<>]++")
# What may come before a key that starts its line: its indentation, and a YAML list's dash.
_LINE_INDENT = re.compile(r"[ \t]*+(?:-[ \t]++)?")
# The next pair on a line of ``key=value`` pairs (logfmt): where a value with spaces ends.
_NEXT_ASSIGNMENT = re.compile(r"[ \t]++[\w.-]++=")
# A YAML block scalar's header (``|``, ``>-``, ``|2+``), and a comment after it.
_BLOCK_HEADER = re.compile(r"[|>](?:[1-9][+-]?|[+-][1-9]?)?(?:[ \t]++#.*+|[ \t]*+)")
# A quote and the backslashes before it, or a bracket: what a string or a bracket ends at.
_QUOTES = {q: re.compile(rf"(?<!\\)(?P<esc>\\*+){q}") for q in "\"'"}
_BRACKET_STEP = re.compile(r"(?<!\\)(?P<esc>\\*+)(?P<q>[\"'])|[\[\](){}]")
_CLOSING = {"[": "]", "(": ")", "{": "}"}
# Runs of at least {n} characters: hex between non-alphanumerics (so ``key_<hex>`` is found),
# then base64 / base64url with its padding.
_HEX_RUN = r"(?<![A-Za-z0-9])[0-9A-Fa-f]{{{n},}}+(?![A-Za-z0-9])"
_B64_RUN = r"(?<![A-Za-z0-9+/_-])[A-Za-z0-9+/_-]{{{n},}}+=*"


@dataclass(frozen=True)
class Redactor:
    """The built-in redactor, configured. ``Redactor()(text)`` is ``redact(text)``."""

    secret_keys: tuple[str, ...] = ()
    """More words that mark a key as naming a secret, matched like ``SECRET_WORDS`` (inside
    the key, any case), e.g. ``("iban", "ssn")``. Defaults to none."""
    min_run_chars: int = 32
    """Base64 and hex runs at least this long are masked; 0 turns that rule off.
    Defaults to 32."""
    mask: str = "***"
    """What a secret is replaced with. Defaults to ``***``."""
    _secret_key: re.Pattern[str] = field(init=False, repr=False, compare=False)
    _runs: tuple[re.Pattern[str], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        keys = self.secret_keys
        if isinstance(keys, str) or not all(isinstance(k, str) and k for k in keys):
            raise InvalidInput("secret_keys must be a tuple of non-empty words")
        runs = self.min_run_chars
        if isinstance(runs, bool) or not isinstance(runs, int) or not (runs == 0 or runs >= 8):
            raise InvalidInput(f"min_run_chars must be 0 (off) or at least 8, got {runs!r}")
        if not isinstance(self.mask, str):
            raise InvalidInput("mask must be a string")
        object.__setattr__(self, "secret_keys", tuple(keys))
        words = "|".join(re.escape(w) for w in (*SECRET_WORDS, *keys))
        object.__setattr__(self, "_secret_key", re.compile(words, re.IGNORECASE))
        patterns = () if runs == 0 else tuple(re.compile(p.format(n=runs))
                                              for p in (_HEX_RUN, _B64_RUN))
        object.__setattr__(self, "_runs", patterns)

    def __call__(self, text: str) -> str:
        # Each rule masks values and never a key or a scheme a later rule looks for: pairs
        # run before Bearer, whose token could be the key of a pair (``Bearer token=…``).
        text = _masked_url_passwords(text, self.mask)
        text = _HEADER.sub(lambda m: f"{m['head']}{m['sep']}{self.mask}", text)
        text = self.elements(text)
        text = self.pairs(text)
        text = _AUTH_SCHEME.sub(lambda m: f"{m['head'] or m['basic']}{self.mask}", text)
        for pattern in self._runs:
            text = pattern.sub(self._run, text)
        return text

    def pairs(self, text: str) -> str:
        """``text`` with the value of every pair whose key names a secret masked."""
        out: list[str] = []
        done = 0  # text before this index is copied or masked already
        m = _PAIR.search(text)
        while m is not None:
            value = self._pair_value(text, m) if self.names_secret(m["key"]) else None
            if value is None:  # not a secret: look for pairs inside its value too
                m = _PAIR.search(text, m.end())
                continue
            out += [text[done:m.end()], value[0]]
            done = value[1]
            m = _PAIR.search(text, done)
        return "".join(out) + text[done:]

    def elements(self, text: str) -> str:
        """``text`` with the content of every XML element whose tag names a secret masked
        (``<password>***</password>``): up to the next tag, or past a CDATA section to its
        end; an element never closed, to the end of the text."""
        out: list[str] = []
        done = 0
        for m in _START_TAG.finditer(text):
            if m.start() < done or m["attrs"].endswith("/") or not self.names_secret(m["tag"]):
                continue
            end = text.find("]]>" if m["cdata"] else "<", m.end())
            end = len(text) if end < 0 else end
            if end > m.end():
                out += [text[done:m.end()], self.mask]
                done = end
        return "".join(out) + text[done:]

    def _pair_value(self, text: str, pair: re.Match[str]) -> tuple[str, int] | None:
        """What the value of the secret ``pair`` is shown as, and where the text resumes."""
        start = pair.end()
        column = _key_column(text, pair.start())
        if column is None or text[start:start + 1] in _CLOSING or _OPENING.match(text, start) \
                or (pair["sep"] == "=" and not text[start - 1].isspace()):  # key=word
            return self._value(text, start)
        return self._line_value(text, pair, column)

    def _line_value(self, text: str, pair: re.Match[str],
                    key_column: int) -> tuple[str, int] | None:
        """The unquoted value of ``pair``, whose key starts its line at ``key_column``: the
        rest of its line (after ``key =``, up to the line's next ``key=``), or a YAML block
        scalar's lines indented under the key. None when it has none: the line is empty, or
        the value's line is not indented under the key (it is the mapping's next key)."""
        start = pair.end()
        value_line = text.rfind("\n", pair.start(), start) + 1
        if value_line and start - value_line <= key_column:
            return None
        end = _line_end(text, start)
        if pair["sep"] == "=" and (assignment := _NEXT_ASSIGNMENT.search(text, start, end)):
            end = assignment.start()
        if end == start:
            return None
        if _BLOCK_HEADER.fullmatch(text, start, end):
            end = _block_end(text, end, key_column)
        return self.mask, end

    def _value(self, text: str, start: int) -> tuple[str, int] | None:
        """What the value at ``start`` is shown as, and where the text after it resumes; None
        when no value starts there."""
        if text[start:start + 1] in _CLOSING:
            return self.mask, _bracket_end(text, start)
        opening = _OPENING.match(text, start)
        if opening is None:
            return self._word(text, start, "")
        level = len(opening["esc"])
        end = _string_end(text, opening.end(), level, opening["q"])
        # The closing quote is left to be read again: in text whose quotes do not pair up
        # (a message cut short) it may open the next key, ``"x "api_key": "…"``.
        if end is not None:
            return opening["head"] + self.mask, end - level - 1
        if level:  # escaped JSON cut short: what follows may all be the secret
            return opening["head"] + self.mask, len(text)
        # A plain quote never closed: its first word, as if unquoted
        return self._word(text, opening.start("q"), text[start:opening.start("q")])

    def _word(self, text: str, start: int, prefix: str) -> tuple[str, int] | None:
        """An unquoted value (with what a call it opens holds): shown as ``prefix`` and the
        mask."""
        word = _UNQUOTED.match(text, start)
        if word is None:
            return None
        if text[word.end():word.end() + 1] in _CLOSING:  # a call: ``SecretStr('…')``
            return prefix + self._masked(word[0]), _bracket_end(text, word.end())
        return prefix + self._masked(word[0]), word.end()

    def names_secret(self, key: str) -> bool:
        """Whether ``key`` (a field, header or parameter name) names a secret."""
        return self._secret_key.search(key) is not None and key.lower() not in PUBLIC_KEYS

    def masked_fields(self, value: object) -> object:
        """A copy of ``value`` (JSON: dicts, lists, scalars) whose every key that names a
        secret, at any depth, has its whole value masked, whatever its type: the text rules
        cannot see a list or an object as a secret's value once it is dumped."""
        if isinstance(value, dict):
            return {key: self.mask if self.names_secret(str(key)) else self.masked_fields(item)
                    for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [self.masked_fields(item) for item in value]
        return value

    def _masked(self, value: str) -> str:
        quote = value[0] if value[0] in "'\"" else ""
        return f"{quote}{self.mask}"

    def _run(self, m: re.Match[str]) -> str:
        return self.mask if _looks_random(m[0]) else m[0]


def _masked_url_passwords(text: str, mask: str) -> str:
    """``text`` with each URL's password, up to the last "@" before a space, masked. A URL
    head with no "@" after it skips the rest of its word: a later head there has none either,
    which keeps the scan linear."""
    out: list[str] = []
    done = scan = 0  # text before done is copied or masked; heads are looked for from scan
    while (head := _URL_HEAD.search(text, scan)) is not None:
        space = _SPACE.search(text, head.end())
        word_end = space.start() if space else len(text)
        at = text.rfind("@", head.end(), word_end)
        if at < 0:
            scan = word_end
            continue
        out += [text[done:head.end()], mask]
        done = scan = at
    return "".join(out) + text[done:]


def _key_column(text: str, key_start: int) -> int | None:
    """The column of a key that starts its line (after its indentation, or a YAML list's
    dash); None for a key in the middle of a line."""
    at = key_start
    while at > 0 and text[at - 1] in " \t-":
        at -= 1
    if (at > 0 and text[at - 1] != "\n") or not _LINE_INDENT.fullmatch(text, at, key_start):
        return None
    return key_start - at


def _line_end(text: str, start: int) -> int:
    """Where the line holding ``start`` ends: at its line break (a CR LF's CR too)."""
    end = text.find("\n", start)
    end = len(text) if end < 0 else end
    return end - 1 if end > start and text[end - 1] == "\r" else end


def _block_end(text: str, end: int, key_column: int) -> int:
    """Where a YAML block scalar whose header line ends at ``end`` ends: after the last of the
    lines that follow it indented deeper than its key (blank lines within it included)."""
    block_end = end
    while end < len(text):
        line = end + 1 if text[end] == "\n" else end + 2  # past "\n" or "\r\n"
        line_end = _line_end(text, line)
        content = text[line:line_end]
        if content.strip():
            if len(content) - len(content.lstrip(" \t")) <= key_column:
                break
            block_end = line_end
        end = line_end
    return block_end


def _string_end(text: str, start: int, level: int, quote: str) -> int | None:
    """The index after the quote that closes the string whose text starts at ``start``, None
    when none does. ``level`` is how many backslashes escape its opening quote. Each level of
    JSON in a JSON string doubles the backslashes before a quote and adds one, so the closing
    quotes of a level-``k`` string have ``k`` of them modulo ``2k + 2``, and no quote of the
    text inside it has (a plain string: an even number)."""
    period = 2 * level + 2
    pattern = _QUOTES[quote]
    while (found := pattern.search(text, start)) is not None:
        if len(found["esc"]) % period == level:
            return found.end()
        start = found.end()
    return None


def _bracket_end(text: str, start: int) -> int:
    """The index after the bracket that closes the one at ``start``, strings inside read as
    strings. When it is never closed (a message cut short, a stray apostrophe, brackets that
    do not match), the end of the text: the value may run to any point after its opening, over
    lines when it is pretty-printed, and only the end of the text is sure to be past it."""
    expected = [_CLOSING[text[start]]]
    at = start + 1
    while expected:
        found = _BRACKET_STEP.search(text, at)
        if found is None:
            return len(text)
        if found["q"]:
            end = _string_end(text, found.end(), len(found["esc"]), found["q"])
            if end is None:
                return len(text)
            at = end
            continue
        at = found.end()
        if found[0] in _CLOSING:
            expected.append(_CLOSING[found[0]])
        elif found[0] != expected.pop():
            return len(text)
    return at


def _looks_random(run: str) -> bool:
    """A hex run with digits and letters, or a base64 run mixing upper, lower and digits."""
    has_digit = any(c.isdigit() for c in run)
    if all(c in "0123456789abcdefABCDEF" for c in run):
        return has_digit and not run.isdigit()
    return has_digit and any(c.isupper() for c in run) and any(c.islower() for c in run)


_BUILT_IN = Redactor()


def redact(text: str) -> str:
    """``text`` with URL passwords, secret-named pairs, auth headers and long random runs
    masked (see the module's doc)."""
    return _BUILT_IN(text)


def redacted_strings(value: object, redact: Redact) -> object:
    """A copy of ``value`` (JSON) whose every string, at any depth, passed ``redact`` on its
    own: in a dump of the whole a string's line breaks are ``\\n``, and the rules that read
    lines (a value on the line after its key, a YAML block) would never see them."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {key: redacted_strings(item, redact) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [redacted_strings(item, redact) for item in value]
    return value


def fields_masker(redact: Redact) -> Callable[[object], object]:
    """What masks the secret-named fields of a structure for ``redact``: its own
    ``Redactor.masked_fields`` when it is one (its extra ``secret_keys`` count), else the
    built-in one's."""
    return (redact if isinstance(redact, Redactor) else _BUILT_IN).masked_fields


def guarded(custom: Redact) -> Redact:
    """``custom``, falling back to the built-in redactor for a text it fails on (raises, or
    returns no string): it runs on the way to every failure write, where an error of its own
    would lose the job's outcome."""
    if custom is redact or isinstance(custom, Redactor):
        return custom

    def run(text: str) -> str:
        shown: object
        try:
            shown = custom(text)
        except Exception as exc:
            shown = exc
        if isinstance(shown, str):
            return shown
        log.warning("the app's redactor failed (%s); the built-in one was used",
                    type(shown).__name__)
        return redact(text)

    return run


def combined(redactors: Iterable[Redact]) -> Redact:
    """One redactor that applies each distinct one of ``redactors`` in turn (the built-in one
    when there is none): for a text about several queues, whose apps may mask different
    secrets."""
    distinct = list({id(r): r for r in redactors}.values())
    if len(distinct) <= 1:
        return distinct[0] if distinct else redact

    def run(text: str) -> str:
        for each in distinct:
            text = each(text)
        return text

    return run


def redact_tail(text: str, keep: int, redact: Redact = redact) -> str:
    """The last ``keep`` characters of ``text``, redacted (only its last ``WINDOW_CHARS``
    characters are looked at)."""
    return redact(text[-WINDOW_CHARS:])[-keep:]


def traceback_text(error: BaseException, redact: Redact = redact) -> str:
    """The traceback of ``error`` (its cause and context too) as logging would print it, each
    message redacted; the frames (file, line, source) are code and are kept as they are."""
    chunks = traceback.TracebackException.from_exception(error).format()
    return "".join(c if c.startswith("  File ") else redact(c) for c in chunks).rstrip("\n")


def redact_url(url: str) -> str:
    """The URL with its password and any secret-named query value (``password=``,
    ``token=``, …) masked; the rest as it was, for an error message to say which URL.

    A user name or password holding an unencoded ``/``, ``?``, ``#`` or ``@`` moves the
    authority's end for a URL parser, which then sees the password's first part as a port and
    the rest as the path. So when an ``@`` follows the first ``/``, ``?`` or ``#`` of the
    authority, everything up to the last ``@`` counts as userinfo and is masked whole."""
    last_at = _ambiguous_userinfo_end(url)
    if last_at is not None:
        return _masked_up_to(url, last_at)
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostinfo = netloc.rpartition("@")
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:***@{hostinfo}" if ":" in userinfo else f"{user}@{hostinfo}"
    query = _masked_query(parts.query)
    if netloc == parts.netloc and query == parts.query:
        return url  # nothing secret; urlunsplit would also drop an empty host ("sqlite:///")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _ambiguous_userinfo_end(url: str) -> int | None:
    """The index of the URL's last ``@`` when the userinfo holds an unencoded ``/``, ``?`` or
    ``#``: the authority a parser sees then ends before that ``@``, holds none itself, and has
    a ``:`` followed by no port (the password's first part). None when the URL reads one way:
    an ``@`` after a plain ``host[:port]`` is its path's or its query's own."""
    start, end = _authority_span(url)
    if start is None:
        return None
    authority = url[start:end]
    last_at = url.rfind("@", end)
    if "@" in authority or last_at < 0 or authority.endswith("]") or ":" not in authority:
        return None
    return None if authority.rpartition(":")[2].isdigit() else last_at


def _authority_span(url: str) -> tuple[int | None, int]:
    """Where the authority starts and ends as a parser reads it (up to the first ``/``,
    ``?`` or ``#``); ``(None, 0)`` for a URL without ``://``."""
    start = url.find("://") + 3
    if start < 3:
        return None, 0
    found = _AUTHORITY_END.search(url, start)
    return start, found.start() if found else len(url)


def has_ambiguous_userinfo(url: str) -> bool:
    """Whether parsers may read the URL's user name and password differently: its userinfo
    holds an unencoded ``/``, ``?`` or ``#`` (``_ambiguous_userinfo_end``), or its authority
    two ``@`` (libpq stops at the first, Python's parser at the last). A driver given such a
    URL may name a piece of the password as the host or port in its errors."""
    if _ambiguous_userinfo_end(url) is not None:
        return True
    start, end = _authority_span(url)
    return start is not None and url.count("@", start, end) > 1


def refuse_ambiguous_userinfo(url: str, what: str) -> None:
    """Raise ``InvalidURL`` (the URL masked) when ``has_ambiguous_userinfo(url)``."""
    if has_ambiguous_userinfo(url):
        raise InvalidURL(f"cannot read the user name and password of {what} URL "
                         f"{redact_url(url)}; {ENCODE_HINT}")


def _masked_up_to(url: str, last_at: int) -> str:
    """``scheme://***@`` and the rest of the URL after ``last_at``, its query masked."""
    head = url[:url.find("://") + 3]
    rest, sep, query = url[last_at + 1:].partition("?")
    return f"{head}***@{rest}{sep}{_masked_query(query)}"


def _masked_query(query: str) -> str:
    return "&".join(_masked_parameter(p) for p in query.split("&"))


#: URL query parameters whose value holds credentials under names of their own: MongoDB's
#: ``authMechanismProperties=AWS_SESSION_TOKEN:…``.
SECRET_PARAMETERS = frozenset({"authmechanismproperties"})


def _masked_parameter(parameter: str) -> str:
    """A query parameter, its value masked when its name names a secret, or is one of
    ``SECRET_PARAMETERS`` (the value runs to the next ``&``, whatever it holds)."""
    name, sep, _ = parameter.partition("=")
    secret = _BUILT_IN.names_secret(name) or unquote(name).lower() in SECRET_PARAMETERS
    return f"{name}=***" if sep and secret else parameter
